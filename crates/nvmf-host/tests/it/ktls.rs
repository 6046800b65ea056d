//! kTLS choice on the host and the target (`--ktls auto|on|off`), on whatever kernel runs the
//! test. With kTLS (a `tls` module) every pairing of kernel and userspace records moves data both
//! ways, which needs the record sequence numbers right on both sides; without it `auto` falls back
//! to userspace records and `on` fails with a clear error. The build machine has no `tls` module;
//! the trixie guest (tests/tls/guest-tls.sh) runs the kTLS side for real.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use nvmf_host::{ConnectOptions, Controller, Error, IoQueue, TlsOptions};
use nvmf_tls::{ConfiguredPsk, KtlsMode, PskTransform};

const NQN: &str = "nqn.2024-01.io.nvmflab:ktls";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:7c1e2f00-0000-4000-8000-00000000b001";
const T: Duration = Duration::from_secs(5);

fn key(t: PskTransform) -> ConfiguredPsk {
    let len = if t == PskTransform::Sha384 { 48 } else { 32 };
    ConfiguredPsk::new(t, &vec![0x33; len]).unwrap()
}

fn start_target(ktls: &str, key: &ConfiguredPsk) -> nvmf_target::RunningTarget {
    let cfg = format!(
        "[target]\nstats = \"0\"\nktls = \"{ktls}\"\n[[port]]\naddr = \"127.0.0.1:0\"\ntls = \"required\"\n\
         [[host]]\nnqn = \"{HOST}\"\ntls_key = \"{k}\"\n[[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
         [[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\nsize = \"4MiB\"\n",
        k = key.to_interchange()
    );
    let config = nvmf_target::config::toml::parse(&cfg, Path::new("ktls.toml")).expect("config");
    nvmf_target::start(config).expect("target starts")
}

fn options(target: &nvmf_target::RunningTarget, key: &ConfiguredPsk, ktls: KtlsMode) -> ConnectOptions {
    let mut o = ConnectOptions::new(target.listen_addrs()[0].to_string(), HOST);
    let mut t = TlsOptions::new(key.clone());
    t.ktls = ktls;
    o.tls = Some(t);
    o.kato_ms = 0;
    o.timeout = T;
    o
}

/// Writes and reads back 3 × `len` bytes on one I/O queue (several records each way).
fn io(opts: &ConnectOptions, len: usize) -> Result<(), Error> {
    let ctrl = Controller::connect(opts, NQN)?;
    ctrl.set_number_of_queues(1)?;
    let mut q = IoQueue::connect(&ctrl.io_queue_params(), 1, 4, len)?;
    q.set_namespace(1, 512);
    for round in 0..3u8 {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 512) as u8 ^ round).collect();
        q.write(8, &data, T)?;
        let mut back = vec![0u8; len];
        q.read(8, &mut back, T)?;
        assert!(back == data, "data read back, round {round}");
    }
    drop(q);
    ctrl.shutdown()
}

#[test]
fn every_pairing_of_kernel_and_userspace_records_moves_data() {
    let have = nvmf_tls::ktls::probe().is_ok();
    for t in [PskTransform::Sha256, PskTransform::Sha384] {
        let key = key(t);
        for target_mode in ["auto", "off"] {
            let target = start_target(target_mode, &key);
            let kernel_target = have && target_mode == "auto";
            let records = if kernel_target { "ktls" } else { "userspace" };
            assert!(target.ready_line().ends_with(&format!("tls=required:{records}")), "{}", target.ready_line());
            for host_mode in [KtlsMode::Auto, KtlsMode::Off] {
                let before = nvmf_host::tls::record_layers_used();
                io(&options(&target, &key, host_mode), 128 << 10).unwrap_or_else(|e| panic!("{t:?} target {target_mode} host {host_mode}: {e}"));
                let after = nvmf_host::tls::record_layers_used();
                // Admin and I/O queue: two links, each counted once (other tests may add theirs).
                let kernel_host = have && host_mode == KtlsMode::Auto;
                let grew = if kernel_host { after.0 - before.0 } else { after.1 - before.1 };
                assert!(grew >= 2, "{t:?} host {host_mode}: {before:?} -> {after:?}");
            }
            let s = &target.stats_json()["ports"][0];
            assert_eq!(s["tls_records"], records, "{s}");
            let kernel_conns = s["ktls_connections"].as_u64().unwrap();
            assert_eq!(kernel_conns, if kernel_target { 4 } else { 0 }, "{s}");
            assert_eq!(s["tls_connections"], 4, "{s}");
        }
    }
}

#[test]
fn host_ktls_on_fails_clearly_without_the_kernel_module() {
    let key = key(PskTransform::Sha256);
    let target = start_target("off", &key);
    match (nvmf_tls::ktls::probe(), io(&options(&target, &key, KtlsMode::On), 4096)) {
        (Ok(()), r) => r.expect("kTLS on where the kernel has it"),
        (Err(_), Ok(())) => panic!("--ktls on worked without kTLS"),
        (Err(_), Err(e)) => {
            let msg = e.to_string();
            assert!(matches!(e, Error::Unsupported(_)) && msg.contains("--ktls on") && msg.contains("modprobe tls"), "{msg}");
        }
    }
}

fn perf(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nvmf-perf")).args(args).output().expect("run nvmf-perf");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn nvmf_perf_says_which_records_it_used_and_refuses_bad_ktls_options() {
    let key = key(PskTransform::Sha256);
    let target = start_target("auto", &key);
    let addr = target.listen_addrs()[0];
    let (a, port) = (addr.ip().to_string(), addr.port().to_string());
    let k = key.to_interchange();
    let base = ["identify", "-t", "tcp", "-a", &a, "-s", &port, "-n", NQN, "-q", HOST, "--tls-key", &k];
    let have = nvmf_tls::ktls::probe().is_ok();
    let (rc, err) = perf(&[&base[..], &["--ktls", "auto"]].concat());
    assert_eq!(rc, 0, "{err}");
    let expect = if have { "TLS records: ktls on 1 connection(s), userspace on 0" } else { "TLS records: ktls on 0 connection(s), userspace on 1" };
    assert!(err.contains(expect), "{err}");
    let (rc, err) = perf(&[&base[..], &["--ktls", "on"]].concat());
    if have {
        assert_eq!(rc, 0, "{err}");
    } else {
        assert_eq!(rc, 1, "{err}");
        assert!(err.contains("--ktls on") && err.contains("modprobe tls") && !err.contains("panicked"), "{err}");
    }
    let (rc, err) = perf(&[&base[..], &["--ktls", "maybe"]].concat());
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("--ktls \"maybe\": expected auto, on or off"), "{err}");
    let (rc, err) = perf(&["identify", "-t", "tcp", "-a", &a, "-s", &port, "-n", NQN, "--ktls", "on"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("--ktls needs --tls-key"), "{err}");
}
