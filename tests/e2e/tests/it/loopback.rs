//! The stack end to end over loopback: the real `nvmf-target` and `nvmf-perf` binaries.

use std::time::Duration;

use nvmf_e2e::{args, perf, perf_json, RawHost, Target};
use nvmf_proto::pdu::fes;
use nvmf_proto::{PduHeader, Status};

const NQN: &str = "nqn.2024-01.io.nvmflab:e2e";

fn run_args(t: &Target, extra: &[&str]) -> Vec<String> {
    let mut a = vec!["run".to_string()];
    a.extend(t.perf_addr());
    a.extend(args(&["-n", NQN]));
    a.extend(args(extra));
    a
}

fn total_ios(doc: &serde_json::Value, dir: &str) -> u64 {
    doc["jobs"].as_array().unwrap().iter().map(|j| j[dir]["total_ios"].as_u64().unwrap_or(0)).sum()
}

#[test]
fn write_then_verify_every_size_with_and_without_digests() {
    // 8 KiB in-capsule: 512 B..8 KiB travel in the capsule, larger writes use R2T/H2CData in
    // 32 KiB chunks, so 1 MiB takes 32 H2CData PDUs.
    let t = Target::start(&["--nqn", NQN, "--ns", "ram:64MiB", "--in-capsule-data-size", "8192", "--maxh2cdata", "32768"]);
    for digests in [&[][..], &["--hdr_digest", "--data_digest"][..]] {
        for bs in ["512", "4k", "8k", "16k", "128k", "1m"] {
            let mut extra = vec!["--rw", "write", "--bs", bs, "--size", "4MiB", "--iodepth", "4", "--verify", "--runtime", "10"];
            extra.extend_from_slice(digests);
            let doc = perf_json(&run_args(&t, &extra));
            assert!(total_ios(&doc, "write") > 0, "bs {bs} {digests:?}: nothing written");
        }
    }
    assert!(!t.log().contains("ERROR"), "target logged an error:\n{}", t.log());
}

#[test]
fn large_in_capsule_and_h2c_writes_verify_with_and_without_digests() {
    // 128 KiB in-capsule: 16 and 128 KiB writes travel in the capsule, 1 MiB in 128 KiB H2CData
    // PDUs. Payloads of 128 KiB are received straight into the command buffer once their header
    // is in, smaller ones copied; both must deliver every byte, digests checked over the
    // destination.
    let t = Target::start(&["--nqn", NQN, "--ns", "ram:64MiB", "--in-capsule-data-size", "131072"]);
    for digests in [&[][..], &["--hdr_digest", "--data_digest"][..]] {
        for bs in ["16k", "128k", "1m"] {
            let mut extra = vec!["--rw", "randwrite", "--bs", bs, "--size", "8MiB", "--iodepth", "16", "--verify", "--runtime", "2"];
            extra.extend_from_slice(digests);
            let doc = perf_json(&run_args(&t, &extra));
            assert!(total_ios(&doc, "write") > 0, "bs {bs} {digests:?}: nothing written");
        }
    }
    assert!(!t.log().contains("ERROR"), "target logged an error:\n{}", t.log());
}

#[test]
fn bursts_of_write_data_larger_than_the_receive_buffer_are_taken_whole() {
    // Default MAXH2CDATA lets 8 queued 1 MiB writes put megabytes of H2CData on the socket at
    // once: more than the target's receive buffer, which must not end the connection.
    let t = Target::start(&["--nqn", NQN, "--ns", "ram:64MiB"]);
    for bs in ["128k", "1m"] {
        let extra = ["--rw", "write", "--bs", bs, "--iodepth", "8", "--size", "32MiB", "--verify", "--runtime", "5"];
        let doc = perf_json(&run_args(&t, &extra));
        assert!(total_ios(&doc, "write") > 0, "bs {bs}: nothing written");
    }
}

#[test]
fn verify_catches_blocks_that_were_never_written() {
    // A null namespace reads back zeroes: a read workload with --verify must fail and name the LBA.
    let t = Target::start(&["--nqn", NQN, "--ns", "null:16MiB"]);
    let out = perf(&run_args(&t, &["--rw", "randread", "--bs", "4k", "--verify", "--runtime", "1"]));
    assert_eq!(out.status.code(), Some(1), "verify should fail on unwritten blocks");
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(err.contains("lba"), "mismatch message should name the LBA: {err}");

    // A null namespace also discards writes, so a write workload's read-back phase must fail too.
    let out = perf(&run_args(&t, &["--rw", "write", "--bs", "4k", "--size", "1MiB", "--verify", "--runtime", "5"]));
    assert_eq!(out.status.code(), Some(1), "write --verify must read back and notice the lost data");
}

#[test]
fn discovery_lists_every_subsystem_and_namespaces_are_separate() {
    let dir = tempdir();
    let cfg = dir.join("target.toml");
    std::fs::write(
        &cfg,
        r#"
[target]
cores = [0]

[[port]]
addr = "127.0.0.1:0"

[[subsystem]]
nqn = "nqn.2024-01.io.nvmflab:one"
allow_any_host = true
  [[subsystem.namespace]]
  nsid = 1
  backend = "ram"
  size = "8MiB"
  [[subsystem.namespace]]
  nsid = 2
  backend = "ram"
  size = "16MiB"

[[subsystem]]
nqn = "nqn.2024-01.io.nvmflab:two"
allow_any_host = true
  [[subsystem.namespace]]
  nsid = 1
  backend = "null"
  size = "32MiB"
"#,
    )
    .unwrap();
    let t = Target::spawn(&["--config", cfg.to_str().unwrap()]);
    let mut a = vec!["discover".to_string()];
    a.extend(t.perf_addr());
    let out = perf(&a);
    assert!(out.status.success(), "discover failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    for nqn in ["nqn.2024-01.io.nvmflab:one", "nqn.2024-01.io.nvmflab:two"] {
        assert!(text.contains(nqn), "discovery output lacks {nqn}:\n{text}");
    }
    assert!(text.contains(&t.port()), "discovery output lacks the port:\n{text}");

    for (nsid, bytes) in [("1", 8u64 << 20), ("2", 16u64 << 20)] {
        let mut a = vec!["identify".to_string()];
        a.extend(t.perf_addr());
        a.extend(args(&["-n", "nqn.2024-01.io.nvmflab:one", "--nsid", nsid, "--output-format", "json"]));
        let out = perf(&a);
        assert!(out.status.success(), "identify nsid {nsid}: {}", String::from_utf8_lossy(&out.stderr));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("identify JSON");
        let text = doc.to_string();
        let blocks_512 = (bytes / 512).to_string();
        assert!(
            text.contains(&bytes.to_string()) || text.contains(&blocks_512),
            "identify of nsid {nsid} should report {bytes} bytes: {text}"
        );
    }
}

#[test]
fn host_not_on_the_allow_list_is_refused() {
    let allowed = "nqn.2014-08.org.nvmexpress:uuid:11111111-1111-4111-8111-111111111111";
    let t = Target::start(&["--nqn", NQN, "--ns", "ram:8MiB", "--allow-host", allowed]);
    let mut a = vec!["identify".to_string()];
    a.extend(t.perf_addr());
    a.extend(args(&["-n", NQN, "--hostnqn", "nqn.2014-08.org.nvmexpress:uuid:22222222-2222-4222-8222-222222222222"]));
    let out = perf(&a);
    assert!(!out.status.success(), "a host not on the allow list must be refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Connect Invalid Host"), "error should say why: {err}");

    let mut ok = vec!["identify".to_string()];
    ok.extend(t.perf_addr());
    ok.extend(args(&["-n", NQN, "--hostnqn", allowed]));
    let out = perf(&ok);
    assert!(out.status.success(), "the allowed host must connect: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn connect_to_an_unknown_subsystem_fails_with_invalid_parameters() {
    let t = Target::start(&["--nqn", NQN, "--ns", "ram:8MiB"]);
    let mut raw = RawHost::connect(t.addr);
    raw.icreq();
    let cqe = raw.connect_admin("nqn.2024-01.io.nvmflab:nope", 0);
    assert_eq!((cqe.status.sct, cqe.status.sc), (Status::CONNECT_INVALID_PARAM.sct, Status::CONNECT_INVALID_PARAM.sc));
}

#[test]
fn malformed_pdus_get_a_termreq_and_other_connections_keep_working() {
    let t = Target::start(&["--nqn", NQN, "--ns", "ram:8MiB"]);
    // A second, healthy connection set up before the bad ones.
    let mut healthy = RawHost::connect(t.addr);
    healthy.icreq();
    assert!(healthy.connect_admin(NQN, 0).status.is_success());

    let cases: [(&str, Vec<u8>, u16, u32); 3] = [
        // CapsuleCmd with HLEN 70 instead of 72.
        ("bad hlen", vec![0x04, 0, 70, 0, 72, 0, 0, 0], fes::INVALID_PDU_HDR, 2),
        // Type 0x08 is not defined.
        ("unknown type", vec![0x08, 0, 24, 0, 24, 0, 0, 0], fes::INVALID_PDU_HDR, 0),
        // PLEN 16 smaller than HLEN 72.
        ("plen < hlen", vec![0x04, 0, 72, 0, 16, 0, 0, 0], fes::INVALID_PDU_HDR, 4),
    ];
    for (what, header, want_fes, want_fei) in cases {
        let mut raw = RawHost::connect(t.addr);
        raw.icreq();
        let mut pdu = header.clone();
        pdu.resize(72, 0);
        raw.send(&pdu);
        let (frame, _) = raw.recv().unwrap_or_else(|| panic!("{what}: connection closed without a TermReq"));
        match frame.header {
            PduHeader::C2HTermReq(t) => {
                assert_eq!((t.fes, t.fei), (want_fes, want_fei), "{what}");
                assert_eq!(&t.header[..8], &header[..8], "{what}: TermReq echoes the offending header");
            }
            other => panic!("{what}: expected C2HTermReq, got {other:?}"),
        }
        assert!(raw.closed_within(Duration::from_secs(5)), "{what}: connection must be closed after the TermReq");
    }

    // Garbage before the ICReq as well.
    let mut raw = RawHost::connect(t.addr);
    raw.send(&[0xFF; 200]);
    assert!(raw.closed_within(Duration::from_secs(5)));

    // The healthy connection and new hosts still get served.
    let doc = perf_json(&run_args(&t, &["--rw", "randread", "--bs", "4k", "--runtime", "1"]));
    assert!(total_ios(&doc, "read") > 0);
    drop(healthy);
}

#[test]
fn keep_alive_timeout_ends_a_silent_hosts_controller() {
    let t = Target::start(&["--nqn", NQN, "--ns", "ram:8MiB"]);
    let mut raw = RawHost::connect(t.addr);
    raw.icreq();
    let cqe = raw.connect_admin(NQN, 1000);
    assert!(cqe.status.is_success(), "connect: {}", cqe.status);
    // The host says nothing more: the controller must go within KATO (1 s) plus slack for a
    // loaded machine (10x).
    assert!(raw.closed_within(Duration::from_secs(10)), "target kept a silent host's controller past KATO");

    // A host that keeps talking (nvmf-perf sends Keep Alive) survives longer than KATO.
    let doc = perf_json(&run_args(&t, &["--rw", "randread", "--bs", "4k", "--runtime", "3"]));
    assert!(total_ios(&doc, "read") > 0);
}

#[test]
fn poll_and_event_modes_both_complete_io() {
    for mode in ["event", "poll"] {
        let t = Target::start(&["--nqn", NQN, "--ns", "ram:8MiB", "--mode", mode, "--idle-poll-us", "20"]);
        for completion in ["event", "poll"] {
            let doc = perf_json(&run_args(&t, &["--rw", "randrw", "--bs", "4k", "--iodepth", "8", "--runtime", "1", "--completion", completion]));
            assert!(total_ios(&doc, "read") > 0 && total_ios(&doc, "write") > 0, "target {mode}, host {completion}");
        }
    }
}

#[test]
fn both_sides_verify_under_the_congestion_control_they_are_given() {
    // reno is built into every kernel and always allowed; the options echo names it.
    let t = Target::start(&["--nqn", NQN, "--ns", "ram:16MiB", "--tcp-congestion", "reno"]);
    let extra = ["--rw", "randrw", "--bs", "128k", "--iodepth", "8", "--size", "8MiB", "--verify", "--runtime", "1", "--tcp_congestion", "reno"];
    let doc = perf_json(&run_args(&t, &extra));
    assert!(total_ios(&doc, "read") > 0 && total_ios(&doc, "write") > 0, "{doc}");
    assert_eq!(doc["nvmflab"]["knobs"]["tcp_congestion"], "reno", "{doc}");
    assert!(!t.log().contains("WARN"), "target warned:\n{}", t.log());
}

#[test]
fn a_polling_target_verifies_with_few_and_many_connections() {
    // A polling reactor reads up to 4 connections directly every turn and asks epoll beyond
    // that: both ways must deliver every byte, R2T writes and 1 MiB reads included.
    let t = Target::start(&["--nqn", NQN, "--ns", "ram:64MiB", "--mode", "poll"]);
    for jobs in ["1", "6"] {
        for bs in ["4k", "1m"] {
            let extra = ["--rw", "write", "--bs", bs, "--size", "24MiB", "--iodepth", "8", "--numjobs", jobs, "--verify", "--runtime", "10"];
            let doc = perf_json(&run_args(&t, &extra));
            assert!(total_ios(&doc, "write") > 0, "{jobs} jobs, bs {bs}: nothing written");
        }
    }
    assert!(!t.log().contains("ERROR"), "target logged an error:\n{}", t.log());
}

#[test]
fn rate_limited_run_stays_within_five_percent() {
    let t = Target::start(&["--nqn", NQN, "--ns", "ram:8MiB"]);
    let doc = perf_json(&run_args(&t, &["--rw", "randread", "--bs", "4k", "--rate_iops", "2000", "--runtime", "3", "--ramp_time", "0.5"]));
    let iops = doc["jobs"][0]["read"]["iops"].as_f64().unwrap();
    // The limiter must never let more through than asked (5 % for the window's edges). Reaching the
    // rate depends on how busy the machine is (a loaded CI machine gave 1246), so below it the test
    // only checks that the limiter did not throttle far under it: 2000 IOPS at QD1 on loopback is a
    // small fraction of what even a loaded machine reaches.
    assert!(iops <= 2100.0, "asked for 2000 IOPS, got {iops:.0}: the limit was exceeded");
    assert!(iops >= 500.0, "asked for 2000 IOPS, got {iops:.0}: throttled far below the rate");
}

#[test]
fn stats_count_the_commands_and_sigterm_exits_cleanly() {
    let t = Target::start(&["--nqn", NQN, "--ns", "ram:8MiB"]);
    let doc = perf_json(&run_args(&t, &["--rw", "randwrite", "--bs", "4k", "--runtime", "1"]));
    let written = total_ios(&doc, "write");
    let stats = t.stats_json();
    let counted: u64 = stats["reactors"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["namespaces"].as_array().unwrap().iter())
        .filter(|n| n["subnqn"] == NQN && n["nsid"] == 1)
        .map(|n| n["writes"].as_u64().unwrap())
        .sum();
    // Ramp-time I/O is done but not reported by the generator, so the target counts at least as many.
    assert!(counted >= written && written > 0, "target counted {counted} writes, perf reported {written}");
    assert!(t.metrics().contains("nvmf_target_"), "Prometheus text lacks nvmf_target_ metrics");
    assert!(t.terminate().success(), "SIGTERM should end the target with status 0");
}

#[test]
fn bad_configuration_is_a_clear_error() {
    let dir = tempdir();
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, "[target]\ncores = [0]\nmode = \"sometimes\"\n").unwrap();
    let out = std::process::Command::new(nvmf_e2e::bin("nvmf-target")).args(["--config", cfg.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml") && err.contains("mode") && err.contains('3'), "should name file, field and line: {err}");
    assert!(!err.contains("panicked"), "{err}");

    // The port is already taken by a first target.
    let first = Target::start(&["--nqn", NQN, "--ns", "ram:1MiB"]);
    let taken = first.addr.to_string();
    let out = std::process::Command::new(nvmf_e2e::bin("nvmf-target"))
        .args(["--listen", &taken, "--nqn", NQN, "--ns", "ram:1MiB"])
        .output()
        .unwrap();
    // Exit 1: the environment refused (exit 2 is reserved for a bad configuration).
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&taken), "should name the address in use");
}

/// Removed when the test ends, passing or not.
fn tempdir() -> nvmf_e2e::TempDir {
    nvmf_e2e::TempDir::new()
}
