//! `nvmf-perf run --output` is checked before the run, so an unwritable path never costs a run.

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn an_unwritable_output_is_refused_before_connecting() {
    // A listener that never answers: a run that tried to connect would wait, then fail with a
    // connection error instead of naming --output.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_nvmf-perf"))
        .args(["run", "-a", &addr.ip().to_string(), "-s", &addr.port().to_string(), "-n", "nqn.2024-01.io.nvmflab:x"])
        .args(["--iodepth", "1", "--runtime", "1", "--output-format", "json", "--output", "/nonexistent/dir/out.json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--output /nonexistent/dir/out.json"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "refused before the run: {:?}", started.elapsed());
}

/// Issue 41: a read run on a freshly truncated file reported 1.12 M IOPS at 0.5 µs (reads of
/// holes touch no device) and said nothing. It warns; a filled file gets no warning.
#[test]
fn a_local_read_run_on_a_sparse_file_warns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse.img");
    std::fs::File::create(&path).unwrap().set_len(1 << 20).unwrap();
    let run = |path: &std::path::Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_nvmf-perf"))
            .args(["run", "--local", path.to_str().unwrap(), "--rw", "read", "--bs", "4k", "--size", "64k"])
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (rc, err) = run(&path);
    assert_eq!(rc, Some(0), "{err}");
    assert!(err.contains("sparse.img is sparse") && err.contains("touch no device"), "{err}");
    let full = dir.path().join("full.img");
    // Random contents: a compressing file system would allocate less for a repeated byte.
    let mut rng = fastrand::Rng::with_seed(41);
    std::fs::write(&full, (0..1 << 20).map(|_| rng.u8(..)).collect::<Vec<u8>>()).unwrap();
    std::fs::File::open(&full).unwrap().sync_all().unwrap();
    let (rc, err) = run(&full);
    assert_eq!(rc, Some(0), "{err}");
    assert!(!err.contains("sparse"), "{err}");
}

/// Reads the target has served so far (every queue of every reactor).
fn reads_served(t: &nvmf_target::RunningTarget) -> u64 {
    let stats = t.stats_json();
    let reactors = stats["reactors"].as_array().cloned().unwrap_or_default();
    reactors.iter().flat_map(|r| r["queues"].as_array().cloned().unwrap_or_default()).map(|q| q["by_opcode"]["read"].as_u64().unwrap_or(0)).sum()
}

/// Issue 41: a JSON run whose namespace was removed midway printed nothing but the error. It
/// writes what was measured with the error, and still exits 1.
#[test]
fn a_json_run_that_fails_midway_writes_what_it_measured_with_the_error() {
    const SUB: &str = "nqn.2024-01.io.nvmflab:midway";
    let cfg = format!("[[port]]\naddr = \"127.0.0.1:0\"\n[[subsystem]]\nnqn = \"{SUB}\"\n  [[subsystem.namespace]]\n  nsid = 1\n  backend = \"ram\"\n  size = \"4MiB\"\n");
    let config = nvmf_target::config::toml::parse(&cfg, std::path::Path::new("midway.toml")).expect("config");
    let t = nvmf_target::start(config).expect("target starts");
    let addr = t.listen_addrs()[0];
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("run.json");
    let child = Command::new(env!("CARGO_BIN_EXE_nvmf-perf"))
        .args(["run", "-a", &addr.ip().to_string(), "-s", &addr.port().to_string(), "-n", SUB])
        .args(["--rw", "randread", "--bs", "4k", "--iodepth", "4", "--runtime", "60", "--ctrl-loss-tmo", "0"])
        .args(["--output-format", "json", "--output", out_path.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Remove the namespace once the run has measured some reads (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(30);
    while reads_served(&t) < 200 {
        assert!(Instant::now() < deadline, "the run never read");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = t.control().handle_json(&format!(r#"{{"op":"remove_namespace","subsystem":"{SUB}","nsid":1}}"#));
    assert_eq!(r["ok"], true, "{r}");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).expect("JSON written");
    let error = json["error"].as_str().expect("an error field");
    assert!(err.contains(error), "the same error on stderr: {err}");
    assert!(json["jobs"][0]["read"]["total_ios"].as_u64().unwrap() > 0, "what was measured: {json}");
    assert_eq!(json["jobs"][0]["error"], 5, "EIO, as fio");
    assert!(json["nvmflab"]["jobs"][0]["error"].as_str().unwrap().contains("job0"), "{json}");
    t.shutdown();
}
