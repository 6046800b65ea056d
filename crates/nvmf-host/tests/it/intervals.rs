//! `nvmf-perf run --log_avg_msec` end to end: the real target in process, reached through a
//! loopback proxy that the test slows down in the middle of the run. The intervals must show
//! the change (latency up, IOPS down) and still add up to the totals.

use crate::common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use nvmf_host::perf::args::{Cli, Command};

const NQN: &str = "nqn.2024-01.io.nvmflab:intervals";

fn start_target() -> nvmf_target::RunningTarget {
    common::start_target(NQN, "null", "64MiB")
}

/// Forwards every connection to `to`; bytes from the target wait `delay_us` before they go on,
/// and are counted in `forwarded`.
fn delaying_proxy(to: std::net::SocketAddr, delay_us: Arc<AtomicU64>, forwarded: Arc<AtomicU64>) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for host in l.incoming() {
            let Ok(host) = host else { return };
            let Ok(target) = TcpStream::connect(to) else { return };
            host.set_nodelay(true).unwrap();
            target.set_nodelay(true).unwrap();
            let (mut h_in, mut t_out) = (host.try_clone().unwrap(), target.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(n @ 1..) = h_in.read(&mut buf) {
                    if t_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = t_out.shutdown(Shutdown::Both);
            });
            let (mut t_in, mut h_out, delay, counted) = (target, host, delay_us.clone(), forwarded.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                while let Ok(n @ 1..) = t_in.read(&mut buf) {
                    let d = delay.load(Relaxed);
                    if d > 0 {
                        std::thread::sleep(Duration::from_micros(d));
                    }
                    if h_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    counted.fetch_add(n as u64, Relaxed);
                }
                let _ = h_out.shutdown(Shutdown::Both);
            });
        }
    });
    addr
}

#[test]
fn intervals_show_the_target_slowing_down_mid_run() {
    let target = start_target();
    let delay = Arc::new(AtomicU64::new(0));
    let forwarded = Arc::new(AtomicU64::new(0));
    let proxy = delaying_proxy(target.listen_addrs()[0], delay.clone(), forwarded.clone());
    let port = proxy.port().to_string();
    let argv = [
        "nvmf-perf", "run", "-t", "tcp", "-a", "127.0.0.1", "-s", &port, "-n", NQN, "--rw", "randread", "--bs", "4k",
        "--iodepth", "1", "--runtime", "3", "--log_avg_msec", "250", "--kato", "0",
    ];
    let Command::Run(args) = Cli::try_parse_from(argv).unwrap().command else { unreachable!() };
    let slow = std::thread::spawn({
        let delay = delay.clone();
        move || {
            // The slowdown starts 1.5 s into the measured 3 s: counted from the first reads' data
            // (64 KiB: Connect and Identify move less), however long connecting took on a busy
            // machine. Bounded: a run that never reads fails below.
            let deadline = Instant::now() + Duration::from_secs(30);
            while forwarded.load(Relaxed) < 64 << 10 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(1500));
            delay.store(5000, Relaxed);
        }
    });
    let report = nvmf_host::perf::run(&args).expect("run");
    slow.join().unwrap();
    let v = report.to_json();
    let iv = v["nvmflab"]["intervals"].as_array().unwrap();
    assert_eq!(iv.len(), 12, "3 s in 250 ms intervals: {iv:#?}");
    let f = |i: &serde_json::Value, k: &str| i[k].as_f64().unwrap();
    let early = &iv[..4];
    let late = &iv[8..];
    for i in late {
        assert!(f(i, "lat_p50_ns") >= 5_000_000.0, "every I/O waits 5 ms after it: {i}");
        assert!(f(i, "iops") <= 200.0, "iodepth 1 at >= 5 ms: {i}");
    }
    // Before the slowdown an I/O waits for no sleep: whatever the machine's load, at most half
    // of what every later one waits.
    let fastest_late = late.iter().map(|i| f(i, "lat_p50_ns")).fold(f64::MAX, f64::min);
    for i in early {
        assert!(f(i, "lat_p50_ns") < fastest_late / 2.0, "fast before the slowdown: {i}");
    }
    let early_iops = early.iter().map(|i| f(i, "iops")).sum::<f64>() / 4.0;
    let late_iops = late.iter().map(|i| f(i, "iops")).sum::<f64>() / 4.0;
    assert!(early_iops > 1.5 * late_iops, "IOPS fall: {early_iops} -> {late_iops}");
    for i in iv {
        assert!(f(i, "lat_p50_ns") <= f(i, "lat_p99_ns") && f(i, "lat_p99_ns") <= f(i, "lat_p99_9_ns"), "{i}");
        assert_eq!(f(i, "write_iops"), 0.0);
    }
    let total = v["jobs"][0]["read"]["total_ios"].as_u64().unwrap() as f64;
    let sum: f64 = iv.iter().map(|i| f(i, "iops") * 0.25).sum();
    assert!((sum - total).abs() <= 0.01 * total + 2.0, "intervals add up to {sum}, total {total}");
    target.shutdown();
}
