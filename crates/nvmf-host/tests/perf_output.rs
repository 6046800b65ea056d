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
