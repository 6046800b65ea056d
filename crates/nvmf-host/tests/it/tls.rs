//! NVMe/TCP over TLS 1.3 end to end: our host against our target over loopback. Right keys
//! (SHA-256 and SHA-384, identity versions 0 and 1), digests over TLS, a wrong key (the host
//! reports an authentication failure, the target logs the host and keeps other connections),
//! a plain connect to a port that requires TLS, a port that allows both, discovery's TREQ/TSAS,
//! and nvmf-perf's --tls flags (run --verify at 4k and 128k, discover, identify, a wrong key).

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use nvmf_host::{discover, ConnectOptions, Controller, Error, IoQueue, TlsOptions};
use nvmf_tls::{ConfiguredPsk, IdentityVersion, PskTransform};

const NQN: &str = "nqn.2024-01.io.nvmflab:tls";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:7c1e2f00-0000-4000-8000-00000000a001";
const HOST384: &str = "nqn.2014-08.org.nvmexpress:uuid:7c1e2f00-0000-4000-8000-00000000a384";
const T: Duration = Duration::from_secs(5);

fn key256() -> ConfiguredPsk {
    ConfiguredPsk::new(PskTransform::Sha256, &[0x11; 32]).unwrap()
}

fn key384() -> ConfiguredPsk {
    ConfiguredPsk::new(PskTransform::Sha384, &[0x22; 48]).unwrap()
}

/// Everything the target logs, from every test in this process (searched for one host's lines).
fn log() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || LogWriter(sink.clone()))
            .try_init();
        buf
    })
    .clone()
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn start_target(tls: &str) -> nvmf_target::RunningTarget {
    let _ = log();
    let cfg = format!(
        r#"
[target]
stats = "0"
# Userspace records on every kernel (tests/it/ktls.rs covers the kernel's).
ktls = "off"

[[port]]
addr = "127.0.0.1:0"
tls = "{tls}"

[[host]]
nqn = "{HOST}"
tls_key = "{k256}"

[[host]]
nqn = "{HOST384}"
tls_key = "{k384}"

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true
  [[subsystem.namespace]]
  nsid = 1
  backend = "ram"
  size = "4MiB"
"#,
        k256 = key256().to_interchange(),
        k384 = key384().to_interchange(),
    );
    let config = nvmf_target::config::toml::parse(&cfg, Path::new("tls.toml")).expect("config");
    nvmf_target::start(config).expect("target starts")
}

fn options(target: &nvmf_target::RunningTarget, hostnqn: &str, tls: Option<TlsOptions>) -> ConnectOptions {
    let mut o = ConnectOptions::new(target.listen_addrs()[0].to_string(), hostnqn);
    o.tls = tls;
    o.kato_ms = 0;
    o.timeout = T;
    o
}

fn tls(key: ConfiguredPsk, version: IdentityVersion) -> Option<TlsOptions> {
    let mut t = TlsOptions::new(key);
    t.version = version;
    Some(t)
}

/// Connects (admin and one I/O queue), writes and reads back `len` bytes at LBA 8.
fn connect_and_io(opts: &ConnectOptions, len: usize) -> Result<(), Error> {
    let ctrl = Controller::connect(opts, NQN)?;
    ctrl.set_number_of_queues(1)?;
    let mut q = IoQueue::connect(&ctrl.io_queue_params(), 1, 4, len.max(4096))?;
    q.set_namespace(1, 512);
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 512) as u8).collect();
    q.write(8, &data, T)?;
    let mut back = vec![0u8; len];
    q.read(8, &mut back, T)?;
    assert!(back == data, "data read back over TLS");
    drop(q);
    ctrl.shutdown()
}

fn port_stats(target: &nvmf_target::RunningTarget) -> serde_json::Value {
    target.stats_json()["ports"][0].clone()
}

#[test]
fn right_keys_for_both_suites_and_both_identity_versions() {
    let target = start_target("required");
    assert!(target.ready_line().ends_with("tls=required:userspace"), "{}", target.ready_line());
    for version in [IdentityVersion::V1, IdentityVersion::V0] {
        connect_and_io(&options(&target, HOST, tls(key256(), version)), 4096).expect("SHA-256 key");
        connect_and_io(&options(&target, HOST384, tls(key384(), version)), 128 << 10).expect("SHA-384 key");
    }
    let s = port_stats(&target);
    assert_eq!(s["tls"], "required");
    assert_eq!(s["tls_records"], "userspace");
    assert_eq!(s["tls_connections"], 8, "{s}");
    assert_eq!(s["tls_handshake_failures"], 0, "{s}");
}

/// Runs `submit` for tags 0..depth at once and waits for all of them to succeed.
fn all_at_once(q: &mut IoQueue, depth: u16, mut submit: impl FnMut(&mut IoQueue, u16) -> Result<(), Error>) {
    for tag in 0..depth {
        submit(q, tag).expect("submit");
    }
    q.commit().expect("commit");
    let (mut done, mut got) = (Vec::new(), 0);
    let deadline = std::time::Instant::now() + T;
    while got < depth as usize {
        assert!(std::time::Instant::now() < deadline, "{got} of {depth} completed in time");
        q.poll(Duration::from_millis(100), &mut done).expect("poll");
        for c in &done {
            c.result.as_ref().expect("command succeeds");
        }
        got += done.len();
    }
}

/// 128 KiB payloads over userspace TLS land record by record in their buffers, on the target
/// (writes) and in the host (reads; `nvmf_tls::landing`): eight of each in flight at once, with
/// data digests, read back intact, and the target says write data landed.
#[test]
fn large_payloads_land_in_their_buffers_over_tls() {
    const LEN: usize = 128 << 10;
    const DEPTH: u16 = 8;
    let target = start_target("required");
    let mut o = options(&target, HOST, tls(key256(), IdentityVersion::V1));
    o.data_digest = true;
    let ctrl = Controller::connect(&o, NQN).expect("connect");
    ctrl.set_number_of_queues(1).unwrap();
    let mut q = IoQueue::connect(&ctrl.io_queue_params(), 1, DEPTH as usize, LEN).expect("I/O queue");
    q.set_namespace(1, 512);
    let data = |tag: u16| -> Vec<u8> { (0..LEN).map(|i| (i as u32).wrapping_mul(2654435761).wrapping_add(tag as u32 * 77).to_le_bytes()[2]).collect() };
    let lba = |tag: u16| tag as u64 * (LEN / 512) as u64;
    let nlb = (LEN / 512) as u32;
    all_at_once(&mut q, DEPTH, |q, tag| {
        q.buffer(tag)[..LEN].copy_from_slice(&data(tag));
        q.submit_write(tag, lba(tag), nlb)
    });
    all_at_once(&mut q, DEPTH, |q, tag| {
        q.buffer(tag)[..LEN].fill(0);
        q.submit_read(tag, lba(tag), nlb)
    });
    for tag in 0..DEPTH {
        assert!(q.buffer(tag)[..LEN] == data(tag)[..], "tag {tag}: data read back over TLS");
    }
    let landed = port_stats(&target)["tls_landed_bytes"].as_u64().unwrap();
    // The first reads of a burst take records in bulk, and a write's first and last records
    // hold other PDUs' bytes too; at least a payload's worth lands (47 % of all of it here).
    assert!(landed >= LEN as u64, "{landed} bytes landed");
    drop(q);
    ctrl.shutdown().unwrap();
}

#[test]
fn digests_work_over_tls() {
    let target = start_target("required");
    let mut o = options(&target, HOST, tls(key256(), IdentityVersion::V1));
    o.hdr_digest = true;
    o.data_digest = true;
    connect_and_io(&o, 64 << 10).expect("header and data digests over TLS");
}

#[test]
fn a_wrong_key_is_an_authentication_failure_and_other_connections_live_on() {
    let target = start_target("required");
    let good = Controller::connect(&options(&target, HOST384, tls(key384(), IdentityVersion::V1)), NQN).expect("good host");
    good.set_number_of_queues(1).unwrap();
    let mut q = IoQueue::connect(&good.io_queue_params(), 1, 4, 4096).expect("good I/O queue");
    q.set_namespace(1, 512);

    let wrong = ConfiguredPsk::new(PskTransform::Sha256, &[0x99; 32]).unwrap();
    for version in [IdentityVersion::V1, IdentityVersion::V0] {
        let e = Controller::connect(&options(&target, HOST, tls(wrong.clone(), version)), NQN).err().expect("wrong key refused");
        assert!(matches!(e, Error::Auth(_)), "{version:?}: {e}");
        assert!(!e.is_connection_loss(), "not retried as a lost connection: {e}");
        assert!(e.to_string().contains("wrong key") || e.to_string().contains("refused"), "{e}");
    }
    // The target names the host in its log.
    let logged = String::from_utf8_lossy(&log().lock().unwrap()).to_string();
    assert!(logged.lines().any(|l| l.contains("TLS handshake failed") && l.contains(HOST)), "{logged}");
    assert_eq!(port_stats(&target)["tls_handshake_failures"], 2);

    // The good host's queues still work.
    let data = vec![0x5a; 512];
    q.write(1, &data, T).expect("write after the refusals");
    let mut back = vec![0; 512];
    q.read(1, &mut back, T).unwrap();
    assert_eq!(back, data);
    drop(q);
    good.shutdown().unwrap();
}

#[test]
fn a_host_without_a_key_and_another_hosts_identity_are_refused() {
    let target = start_target("required");
    // A key the target holds for no host: unknown identity.
    let stranger = "nqn.2014-08.org.nvmexpress:uuid:7c1e2f00-0000-4000-8000-0000000000ff";
    let e = Controller::connect(&options(&target, stranger, tls(key256(), IdentityVersion::V1)), NQN).err().unwrap();
    assert!(matches!(e, Error::Auth(_)), "{e}");
}

#[test]
fn a_plain_connect_to_a_required_port_is_refused() {
    let target = start_target("required");
    let e = Controller::connect(&options(&target, HOST, None), NQN).err().expect("plain refused");
    assert!(matches!(e, Error::Io(_)), "still a connection loss: {e}");
    // Issue 41: "Connection reset by peer (os error 104)" alone did not say why.
    assert!(e.to_string().contains("the port may require TLS (--tls)"), "{e}");
    assert_eq!(port_stats(&target)["plain_refused"], 1);
    let logged = String::from_utf8_lossy(&log().lock().unwrap()).to_string();
    assert!(logged.contains("port that requires TLS"), "{logged}");
}

#[test]
fn an_allowed_port_takes_tls_and_plain() {
    let target = start_target("allowed");
    connect_and_io(&options(&target, HOST, tls(key256(), IdentityVersion::V1)), 8192).expect("TLS");
    connect_and_io(&options(&target, HOST, None), 8192).expect("plain");
    let s = port_stats(&target);
    assert_eq!(s["tls_connections"], 2, "{s}");
    assert_eq!(s["plain_connections"], 2, "{s}");
}

#[test]
fn a_plain_port_refuses_a_client_hello() {
    let target = start_target("none");
    assert!(target.ready_line().ends_with("tls=none"), "{}", target.ready_line());
    let e = Controller::connect(&options(&target, HOST, tls(key256(), IdentityVersion::V1)), NQN).err().expect("no TLS here");
    assert!(!matches!(e, Error::Auth(_)), "{e}");
}

#[test]
fn discovery_over_tls_reports_treq_and_tsas() {
    for (mode, treq) in [("required", 1u8), ("allowed", 2)] {
        let target = start_target(mode);
        let page = discover(&options(&target, HOST, tls(key256(), IdentityVersion::V1))).expect("discover over TLS");
        let e = &page.entries[0];
        assert_eq!(e.treq & 3, treq, "{mode}");
        assert_eq!(e.sectype, nvmf_proto::discovery::SECTYPE_TLS13, "{mode}");
    }
    let target = start_target("none");
    let page = discover(&options(&target, HOST, None)).unwrap();
    assert_eq!((page.entries[0].treq & 3, page.entries[0].sectype), (0, 0));
}

fn perf(target: &nvmf_target::RunningTarget, key: &str, args: &[&str]) -> std::process::Output {
    let addr = target.listen_addrs()[0];
    let (sub, rest) = args.split_first().unwrap();
    Command::new(env!("CARGO_BIN_EXE_nvmf-perf"))
        .arg(sub)
        .args(["-a", &addr.ip().to_string(), "-s", &addr.port().to_string(), "-q", HOST, "--tls", "--tls-key", key])
        .args(rest)
        .output()
        .unwrap()
}

#[test]
fn nvmf_perf_over_tls() {
    let target = start_target("required");
    let key = key256().to_interchange();
    for bs in ["4k", "128k"] {
        let out = perf(
            &target,
            &key,
            &["run", "-n", NQN, "--rw", "randwrite", "--verify", "--bs", bs, "--iodepth", "4", "--size", "1m", "--runtime", "1"],
        );
        assert!(out.status.success(), "run --verify --bs {bs}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = perf(&target, &key, &["discover"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("sectype: tls13") && text.contains("required"), "{text}");
    let out = perf(&target, &key, &["identify", "-n", NQN]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // No --tls-key-identity or --tls-compat: the keyring order is tried and the one found named
    // (our target takes the first).
    assert!(err.contains("TLS PSK: identity version 1, the specification's derivation") && err.contains("after 0 refused"), "{err}");
    let out = perf(&target, &key, &["identify", "-n", NQN, "--tls-key-identity", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("TLS PSK:"), "chosen: no fallback to report: {err}");

    let wrong = ConfiguredPsk::new(PskTransform::Sha256, &[0x77; 32]).unwrap().to_interchange();
    let out = perf(&target, &wrong, &["identify", "-n", NQN]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("authentication failed"), "{err}");
}

#[test]
fn dh_hmac_chap_works_over_tls() {
    let _ = log();
    let secret = nvmf_proto::auth::Secret { key: (0..32).map(|i| i as u8 * 3).collect(), transform: None };
    let cfg = format!(
        "[[port]]\naddr = \"127.0.0.1:0\"\ntls = \"required\"\n[[host]]\nnqn = \"{HOST}\"\ntls_key = \"{}\"\ndhchap_key = \"{}\"\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n  [[subsystem.namespace]]\n  nsid = 1\n  backend = \"ram\"\n  size = \"1MiB\"\n",
        key256().to_interchange(),
        secret.encode()
    );
    let target = nvmf_target::start(nvmf_target::config::toml::parse(&cfg, Path::new("t.toml")).unwrap()).unwrap();
    let mut o = options(&target, HOST, tls(key256(), IdentityVersion::V1));
    o.dhchap_secret = Some(secret);
    connect_and_io(&o, 4096).expect("DH-HMAC-CHAP inside TLS");
    o.dhchap_secret = None;
    let e = Controller::connect(&o, NQN).err().expect("the host must still authenticate");
    assert!(matches!(e, Error::Auth(_) | Error::Status { .. }), "{e}");
}

/// A blocking-free TCP link for driving the TLS link by hand.
struct Tcp(std::net::TcpStream);

impl nvmf_host::Link for Tcp {
    fn recv(&mut self, buf: &mut [u8]) -> nvmf_host::Result<usize> {
        use std::io::Read;
        match self.0.read(buf) {
            Ok(0) => Err(Error::Closed),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e.into()),
        }
    }
    fn send(&mut self, buf: &[u8]) -> nvmf_host::Result<usize> {
        match self.0.write(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e.into()),
        }
    }
    fn wait(&self, timeout: Duration, _writing: bool) -> nvmf_host::Result<()> {
        std::thread::sleep(timeout.min(Duration::from_millis(1)));
        Ok(())
    }
}

#[test]
fn a_connect_as_another_host_than_the_tls_identity_is_closed() {
    let target = start_target("required");
    // TLS as HOST384 (its right key), then Connect naming HOST.
    let s = std::net::TcpStream::connect(target.listen_addrs()[0]).unwrap();
    s.set_nonblocking(true).unwrap();
    let psk = TlsOptions::new(key384()).psk(HOST384, NQN).unwrap();
    let link = nvmf_host::TlsLink::handshake(Box::new(Tcp(s)), psk, std::time::Instant::now() + T).expect("handshake");
    let e = Controller::connect_over(Box::new(link), &options(&target, HOST, None), NQN).err().expect("refused");
    assert!(e.is_connection_loss(), "closed unanswered: {e}");
    assert_eq!(port_stats(&target)["tls_identity_mismatches"], 1);
    let logged = String::from_utf8_lossy(&log().lock().unwrap()).to_string();
    assert!(logged.contains("another host or subsystem than the TLS PSK identity"), "{logged}");
}
