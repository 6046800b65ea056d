//! `nvmf-perf run` reports every I/O command it sent: the measured ones (`read`/`write`
//! `total_ios`), those submitted during the ramp (`nvmflab.jobs[i].ramp_ios`) and the verify
//! read-back (`verified_ios`). Their sum must equal, exactly, the commands the real target (in
//! process) counted for the namespace: the equation the interference study's invariant checks.

use crate::common;


use clap::Parser;
use nvmf_host::perf::args::{Cli, Command};
use serde_json::Value;

const NQN: &str = "nqn.2024-01.io.nvmflab:ramp-counts";

fn start_target() -> nvmf_target::RunningTarget {
    common::start_target(NQN, "ram", "16MiB")
}

/// I/O commands the target served for NQN's namespaces, over every reactor.
fn served(stats: &Value) -> u64 {
    stats["reactors"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["namespaces"].as_array().unwrap().iter())
        .filter(|n| n["subnqn"] == NQN)
        .map(|n| n["commands"].as_u64().unwrap())
        .sum()
}

fn run(port: &str, extra: &[&str]) -> Value {
    let argv = ["nvmf-perf", "run", "-t", "tcp", "-a", "127.0.0.1", "-s", port, "-n", NQN, "--bs", "4k", "--kato", "0"]
        .into_iter()
        .chain(extra.iter().copied());
    let Command::Run(args) = Cli::try_parse_from(argv).unwrap().command else { unreachable!() };
    nvmf_host::perf::run(&args).expect("run").to_json()
}

/// (measured, ramp, ramp completed after its end, verify) summed over the jobs.
fn counts(v: &Value) -> (u64, u64, u64, u64) {
    let u = |x: &Value| x.as_u64().unwrap_or_else(|| panic!("not a count: {x} in {v}"));
    let measured = v["jobs"].as_array().unwrap().iter().map(|j| u(&j["read"]["total_ios"]) + u(&j["write"]["total_ios"])).sum();
    let per_job = v["nvmflab"]["jobs"].as_array().unwrap();
    let sum = |k: &str| per_job.iter().map(|j| u(&j[k])).sum::<u64>();
    (measured, sum("ramp_ios"), sum("ramp_late_ios"), sum("verified_ios"))
}

#[test]
fn measured_plus_ramp_plus_verify_equals_what_the_target_served() {
    let target = start_target();
    let port = target.listen_addrs()[0].port().to_string();
    let cases: [&[&str]; 4] = [
        // a deep queue: I/Os in flight when the ramp ends complete after it (ramp_late_ios)
        &["--rw", "randread", "--iodepth", "16", "--numjobs", "2", "--ramp_time", "300ms", "--runtime", "1"],
        // rate capped, as the interference background
        &["--rw", "randread", "--iodepth", "8", "--rate_iops", "2000", "--ramp_time", "250ms", "--runtime", "0.5"],
        // event and poll completion count the same way
        &["--rw", "randread", "--iodepth", "1", "--completion", "poll", "--ramp_time", "200ms", "--runtime", "0.5"],
        // writes read back by --verify: the read-back is counted too
        &["--rw", "randrw", "--iodepth", "4", "--verify", "--size", "8MiB", "--ramp_time", "10ms", "--runtime", "0.5"],
    ];
    for extra in cases {
        let before = served(&target.stats_json());
        let v = run(&port, extra);
        // The host saw every command's completion before it shut the controller down, so the
        // target's counters are final now.
        let after = served(&target.stats_json());
        let (measured, ramp, late, verified) = counts(&v);
        assert!(measured > 0, "{extra:?}: measured nothing");
        assert!(ramp > 0, "{extra:?}: every ramp completes I/O: {v}");
        assert!(late <= ramp, "{extra:?}: late {late} > ramp {ramp}");
        if extra.contains(&"16") {
            // 16 I/Os are in flight whenever the ramp ends: they complete after it and count in
            // ramp_ios, not in total_ios; counting only the ramp's completions would miss them.
            assert!(late > 0, "{extra:?}: nothing was in flight at the ramp's end: {v}");
        }
        if extra.contains(&"--verify") {
            assert!(verified > 0, "{extra:?}: verify read nothing back");
        }
        assert_eq!(
            after - before,
            measured + ramp + verified,
            "{extra:?}: served = measured {measured} + ramp {ramp} + verify {verified}"
        );
    }
    // Without a ramp there is nothing to report but zero.
    let v = run(&port, &["--rw", "randread", "--iodepth", "4", "--runtime", "0.3"]);
    let (measured, ramp, late, _) = counts(&v);
    assert!(measured > 0);
    assert_eq!((ramp, late), (0, 0));
    target.shutdown();
}
