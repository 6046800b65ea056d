//! The TCP ping-pong floor: a client thread sends a small request (the 72 bytes of a CapsuleCmd
//! by default), a server thread answers with a reply the size of a 4 KiB read on the wire
//! (C2HData header + 4096 data + CapsuleResp), one at a time. Busy mode spins on non-blocking
//! sockets (as a polling reactor and a polling host do); blocking mode sleeps in recv (as the
//! event-mode reactor and host do, paying one wake-up per message).

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args as ClapArgs, ValueEnum};
use hdrhistogram::Histogram;
use serde::Serialize;

/// Limit on one blocking read or write: a lost peer must not hang the bench.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest message either side may be asked to send.
const MAX_MESSAGE: usize = 16 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Non-blocking sockets, both threads spin
    Busy,
    /// Blocking sockets, both threads sleep in recv
    Blocking,
}

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[arg(long, value_enum, default_value = "busy")]
    pub mode: Mode,
    /// Measured seconds
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Unmeasured warm-up seconds before
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Request bytes (72 = an NVMe/TCP CapsuleCmd without data)
    #[arg(long, default_value_t = 72)]
    pub request: usize,
    /// Reply bytes (4144 = C2HData header 24 + 4096 data + CapsuleResp 24)
    #[arg(long, default_value_t = 4144)]
    pub reply: usize,
    /// CPU of the answering thread (the target's core)
    #[arg(long, default_value_t = 0)]
    pub server_cpu: usize,
    /// CPU of the asking thread (the host's core)
    #[arg(long, default_value_t = 1)]
    pub client_cpu: usize,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub mode: Mode,
    pub request_bytes: usize,
    pub reply_bytes: usize,
    pub round_trips: u64,
    pub seconds: f64,
    pub mean_ns: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p99_99_ns: u64,
    pub max_ns: u64,
}

pub fn run(a: &Args) -> Result<Report> {
    if !(a.seconds > 0.0 && a.seconds <= 3600.0 && (0.0..=600.0).contains(&a.warmup)) {
        bail!("--seconds must be in (0, 3600] and --warmup in [0, 600]");
    }
    if a.request == 0 || a.reply == 0 || a.request > MAX_MESSAGE || a.reply > MAX_MESSAGE {
        bail!("--request and --reply must be 1..={MAX_MESSAGE} bytes");
    }
    let listener = TcpListener::bind("127.0.0.1:0").context("bind a loopback port")?;
    let addr = listener.local_addr()?;
    let (busy, request, reply, server_cpu) =
        (a.mode == Mode::Busy, a.request, a.reply, a.server_cpu);
    let server = std::thread::Builder::new()
        .name("pingpong-server".into())
        .spawn(move || -> Result<()> {
            pin(server_cpu)?;
            let (stream, _) = listener.accept().context("accept")?;
            serve(stream, busy, request, reply)
        })?;

    let client = (|| -> Result<Report> {
        pin(a.client_cpu)?;
        let mut stream = TcpStream::connect(addr).context("connect")?;
        configure(&stream, busy)?;
        let (req, mut buf) = (vec![0x5Au8; a.request], vec![0u8; a.reply]);
        let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
        let warm_end = Instant::now() + Duration::from_secs_f64(a.warmup);
        while Instant::now() < warm_end {
            round_trip(&mut stream, &req, &mut buf, busy)?;
        }
        let start = Instant::now();
        let end = start + Duration::from_secs_f64(a.seconds);
        let mut now = start;
        while now < end {
            round_trip(&mut stream, &req, &mut buf, busy)?;
            let after = Instant::now();
            hist.saturating_record((after - now).as_nanos() as u64);
            now = after;
        }
        Ok(Report {
            mode: a.mode,
            request_bytes: a.request,
            reply_bytes: a.reply,
            round_trips: hist.len(),
            seconds: (now - start).as_secs_f64(),
            mean_ns: hist.mean(),
            p50_ns: hist.value_at_quantile(0.5),
            p99_ns: hist.value_at_quantile(0.99),
            p99_99_ns: hist.value_at_quantile(0.9999),
            max_ns: hist.max(),
        })
    })();
    // The client's socket is closed by now (or was never made): the server sees EOF and returns.
    let served = server
        .join()
        .map_err(|_| anyhow::anyhow!("server thread panicked"))?;
    let report = client?;
    served?;
    Ok(report)
}

fn serve(mut stream: TcpStream, busy: bool, request: usize, reply: usize) -> Result<()> {
    configure(&stream, busy)?;
    let (mut req, rep) = (vec![0u8; request], vec![0xA5u8; reply]);
    loop {
        if !read_full(&mut stream, &mut req, busy)? {
            return Ok(()); // the client is done
        }
        write_full(&mut stream, &rep, busy)?;
    }
}

fn configure(stream: &TcpStream, busy: bool) -> Result<()> {
    stream.set_nodelay(true)?;
    stream.set_nonblocking(busy)?;
    if !busy {
        stream.set_read_timeout(Some(IO_TIMEOUT))?;
        stream.set_write_timeout(Some(IO_TIMEOUT))?;
    }
    Ok(())
}

fn round_trip(stream: &mut TcpStream, req: &[u8], reply: &mut [u8], busy: bool) -> Result<()> {
    write_full(stream, req, busy)?;
    if !read_full(stream, reply, busy)? {
        bail!("the server closed the connection");
    }
    Ok(())
}

/// Fills `buf`; false on a clean EOF before the first byte. Busy mode spins on WouldBlock up to
/// IO_TIMEOUT, blocking mode relies on the socket's read timeout.
fn read_full(stream: &mut TcpStream, buf: &mut [u8], busy: bool) -> Result<bool> {
    let mut off = 0;
    let mut spin_since: Option<Instant> = None;
    while off < buf.len() {
        match stream.read(&mut buf[off..]) {
            Ok(0) if off == 0 => return Ok(false),
            Ok(0) => bail!("peer closed mid-message ({off} of {} bytes)", buf.len()),
            Ok(n) => {
                off += n;
                spin_since = None;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock && busy => spin(&mut spin_since, "read")?,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("read"),
        }
    }
    Ok(true)
}

fn write_full(stream: &mut TcpStream, buf: &[u8], busy: bool) -> Result<()> {
    let mut off = 0;
    let mut spin_since: Option<Instant> = None;
    while off < buf.len() {
        match stream.write(&buf[off..]) {
            Ok(0) => bail!("peer closed while sending"),
            Ok(n) => {
                off += n;
                spin_since = None;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock && busy => spin(&mut spin_since, "write")?,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("write"),
        }
    }
    Ok(())
}

fn spin(since: &mut Option<Instant>, what: &str) -> Result<()> {
    let start = *since.get_or_insert_with(Instant::now);
    if start.elapsed() > IO_TIMEOUT {
        bail!("{what}: no progress in {IO_TIMEOUT:?}");
    }
    std::hint::spin_loop();
    Ok(())
}

fn pin(cpu: usize) -> Result<()> {
    nvmf_host::perf::cpu::pin_current_thread(cpu).with_context(|| format!("pin to CPU {cpu}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(mode: Mode) -> Args {
        // Two cores where there are two: both spinning on one core would take turns by ticks.
        let second = usize::from(std::thread::available_parallelism().map_or(1, |n| n.get()) > 1);
        Args {
            mode,
            seconds: 0.3,
            warmup: 0.05,
            request: 72,
            reply: 4144,
            server_cpu: 0,
            client_cpu: second,
        }
    }

    #[test]
    fn both_modes_measure_round_trips_with_ordered_percentiles() {
        for mode in [Mode::Busy, Mode::Blocking] {
            let r = run(&args(mode)).unwrap();
            assert!(
                r.round_trips > 5,
                "{mode:?}: only {} round trips",
                r.round_trips
            );
            assert!(
                r.mean_ns > 0.0
                    && r.p50_ns <= r.p99_ns
                    && r.p99_ns <= r.p99_99_ns
                    && r.p99_99_ns <= r.max_ns
            );
            assert_eq!(r.reply_bytes, 4144);
        }
    }

    #[test]
    fn refuses_nonsense_sizes_and_durations() {
        let mut a = args(Mode::Blocking);
        a.reply = 0;
        assert!(run(&a).is_err());
        let mut a = args(Mode::Blocking);
        a.seconds = -1.0;
        assert!(run(&a).is_err());
    }
}
