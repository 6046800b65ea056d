//! Helpers for end-to-end tests: start the real `nvmf-target` binary, run `nvmf-perf`, read the
//! stats endpoint, and speak raw NVMe/TCP where a test must misbehave on purpose.
//!
//! Binaries come from `NVMFLAB_BIN_DIR` or the workspace's `target/<profile>/`, which
//! `cargo test --workspace` fills because it builds every package's binaries.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nvmf_proto::fabrics::{ConnectCmd, ConnectData, CNTLID_DYNAMIC};
use nvmf_proto::nvme::SglDescriptor;
use nvmf_proto::pdu::{encode_pdu, CapsuleCmd, IcReq};
use nvmf_proto::{Frame, Framer, PduHeader, Role};

pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000e2e0";

pub fn bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("NVMFLAB_BIN_DIR").map(PathBuf::from).unwrap_or_else(|| {
        let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target").join(profile)
    });
    let path = dir.join(name);
    assert!(path.exists(), "{} not found: build first (cargo build --workspace --bins)", path.display());
    path
}

/// A fresh directory under the system temp dir, removed with its contents when dropped, also when
/// the test panics (drop runs while unwinding), so no `nvmf-e2e-*` folder outlives its test.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("nvmf-e2e-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path); // a leftover of an earlier process with the same pid
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Default for TempDir {
    fn default() -> Self {
        Self::new()
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `nvmf-target`, killed when dropped.
pub struct Target {
    child: Child,
    pub addr: SocketAddr,
    pub stats: Option<SocketAddr>,
    stderr: mpsc::Receiver<String>,
}

impl Target {
    /// Starts the target with `args` plus a loopback listener and stats endpoint on free ports.
    pub fn start(args: &[&str]) -> Target {
        let mut all = vec!["--listen", "127.0.0.1:0", "--stats", "127.0.0.1:0"];
        all.extend_from_slice(args);
        Self::spawn(&all)
    }

    /// Starts the target with exactly `args`.
    pub fn spawn(args: &[&str]) -> Target {
        let mut child = Command::new(bin("nvmf-target"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nvmf-target");
        let stderr = forward_lines(child.stderr.take().expect("stderr"));
        let stdout = forward_lines(child.stdout.take().expect("stdout"));
        let line = match stdout.recv_timeout(Duration::from_secs(10)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let log: Vec<String> = stderr.try_iter().collect();
                panic!("nvmf-target {args:?} printed no ready line; stderr:\n{}", log.join("\n"));
            }
        };
        let (addr, stats) = parse_ready(&line);
        Target { child, addr, stats, stderr }
    }

    /// The target's process ID (to stop or kill it from a test).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn port(&self) -> String {
        self.addr.port().to_string()
    }

    /// `-t tcp -a ADDR -s PORT` for nvmf-perf.
    pub fn perf_addr(&self) -> Vec<String> {
        vec!["-t".into(), "tcp".into(), "-a".into(), self.addr.ip().to_string(), "-s".into(), self.port()]
    }

    pub fn stats_json(&self) -> serde_json::Value {
        let addr = self.stats.expect("target started without --stats");
        serde_json::from_str(&http_get(addr, "/stats")).expect("stats JSON")
    }

    pub fn metrics(&self) -> String {
        http_get(self.stats.expect("target started without --stats"), "/metrics")
    }

    /// Everything the target logged on stderr so far.
    pub fn log(&self) -> String {
        self.stderr.try_iter().collect::<Vec<_>>().join("\n")
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        unsafe_kill(self.child.id(), 15);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "target did not exit within 10 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unsafe_kill(pid: u32, sig: i32) {
    let status = Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status().expect("kill");
    assert!(status.success());
}

fn forward_lines<R: Read + Send + 'static>(r: R) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Parses `ready listen=ADDR[,ADDR...] stats=ADDR|none`.
fn parse_ready(line: &str) -> (SocketAddr, Option<SocketAddr>) {
    assert!(line.starts_with("ready "), "unexpected first line from nvmf-target: {line:?}");
    let field = |key: &str| {
        line.split_whitespace().find_map(|w| w.strip_prefix(key)).unwrap_or_else(|| panic!("no {key} in {line:?}"))
    };
    let addr = field("listen=").split(',').next().unwrap().parse().expect("listen address");
    let stats = match field("stats=") {
        "none" => None,
        s => Some(s.parse().expect("stats address")),
    };
    (addr, stats)
}

pub fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect stats");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read stats");
    let (head, rest) = body.split_once("\r\n\r\n").expect("HTTP response");
    assert!(head.starts_with("HTTP/1.") && head.contains(" 200"), "stats {path}: {head}");
    rest.to_string()
}

/// Runs `nvmf-perf` with `args` and returns its output (60 s limit).
pub fn perf(args: &[String]) -> Output {
    let mut child = Command::new(bin("nvmf-perf"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn nvmf-perf");
    // Drain both pipes while it runs: a JSON report with the full histogram is larger than a
    // pipe buffer, and a child blocked on a full pipe would never exit.
    let stdout = drain(child.stdout.take().expect("stdout"));
    let stderr = drain(child.stderr.take().expect("stderr"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("nvmf-perf {args:?} ran past 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output { status, stdout: stdout.join().expect("stdout reader"), stderr: stderr.join().expect("stderr reader") }
}

fn drain<R: Read + Send + 'static>(mut r: R) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = r.read_to_end(&mut all);
        all
    })
}

/// Runs `nvmf-perf` expecting success and returns its JSON document.
pub fn perf_json(args: &[String]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["--output-format".to_string(), "json".to_string()]);
    let out = perf(&all);
    assert!(
        out.status.success(),
        "nvmf-perf {all:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("nvmf-perf printed invalid JSON ({e}):\n{}", String::from_utf8_lossy(&out.stdout))
    })
}

pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// A raw NVMe/TCP host connection for tests that must send what no real host would.
pub struct RawHost {
    pub stream: TcpStream,
    buf: Vec<u8>,
    framer: Framer,
}

impl RawHost {
    pub fn connect(addr: SocketAddr) -> RawHost {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect target");
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        RawHost { stream, buf: Vec::new(), framer: Framer::new(Role::Host, 1 << 20) }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    pub fn send_pdu(&mut self, hdr: &PduHeader, data: &[u8]) {
        let mut out = Vec::new();
        encode_pdu(&mut out, hdr, data, self.framer.digests);
        self.send(&out);
    }

    /// ICReq with no digests; returns after the ICResp.
    pub fn icreq(&mut self) {
        self.send_pdu(&PduHeader::IcReq(IcReq { pfv: 0, hpda: 0, hdgst: false, ddgst: false, maxr2t: 0 }), &[]);
        let frame = self.recv().expect("ICResp");
        assert!(matches!(frame.0.header, PduHeader::IcResp(_)), "expected ICResp, got {:?}", frame.0.header);
    }

    /// Fabrics Connect on the admin queue with in-capsule Connect data.
    pub fn connect_admin(&mut self, subnqn: &str, kato_ms: u32) -> nvmf_proto::Cqe {
        let mut sqe = ConnectCmd { recfmt: 0, qid: 0, sqsize: 31, cattr: 0, kato: kato_ms }.to_sqe(1);
        sqe.set_sgl(SglDescriptor::in_capsule(0, 1024));
        let data = ConnectData { hostid: [7; 16], cntlid: CNTLID_DYNAMIC, subnqn: subnqn.into(), hostnqn: HOSTNQN.into() };
        self.send_pdu(&PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &data.encode());
        match self.recv().expect("Connect response").0.header {
            PduHeader::CapsuleResp(r) => r.cqe,
            other => panic!("expected CapsuleResp, got {other:?}"),
        }
    }

    /// The next PDU and its data, or None when the target closed the connection.
    pub fn recv(&mut self) -> Option<(Frame, Vec<u8>)> {
        loop {
            match self.framer.next(&self.buf) {
                Ok(Some(frame)) => {
                    let data = self.buf[frame.data.clone()].to_vec();
                    self.buf.drain(..frame.len);
                    return Some((frame, data));
                }
                Ok(None) => {}
                Err(e) => panic!("target sent an invalid PDU: {e}"),
            }
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("reading from target: {e}"),
            }
        }
    }

    /// True when the target closes the connection within `limit` (anything received first is
    /// discarded).
    pub fn closed_within(&mut self, limit: Duration) -> bool {
        self.stream.set_read_timeout(Some(limit)).unwrap();
        let start = Instant::now();
        let mut chunk = [0u8; 4096];
        while start.elapsed() < limit {
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
        false
    }
}
