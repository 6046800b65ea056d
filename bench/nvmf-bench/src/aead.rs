//! The AES-GCM rate of our own record layer (issue 40 item 1): records of `--bytes` plaintext
//! sealed (or opened) by `nvmf_tls::record::Sealer` / `Opener`, the code the TLS rows run, counted
//! in bytes per second of this thread's CPU time (as `openssl speed` counts), so that the bench's
//! cipher bound can take the faster of this and OpenSSL's EVP.
//!
//! Opening needs records sealed in sequence, and opening in place consumes them: records are
//! pre-sealed in batches of [`BATCH`] by a Sealer matched to the Opener, and only the opening of
//! each batch is timed (the sealing between batches is not counted).

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use clap::Args as ClapArgs;
use nvmf_tls::ktls::TrafficKeys;
use nvmf_tls::record::{Opener, Sealer, APPLICATION_DATA, MAX_PLAINTEXT};
use nvmf_tls::TlsHash;
use serde::Serialize;

/// Records sealed ahead of one timed opening pass, and sealed between two clock reads.
const BATCH: usize = 64;
/// A fixed traffic secret: the rate does not depend on the key.
const SECRET: [u8; 32] = [0x5a; 32];
/// Longest run asked of one call: the bench measures a fraction of a second per size.
const MAX_SECONDS: f64 = 60.0;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Plaintext bytes per record (1..=16384)
    #[arg(long)]
    pub bytes: usize,
    /// Seconds to run (wall clock)
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Open records instead of sealing them
    #[arg(long)]
    pub decrypt: bool,
}

#[derive(Debug, Serialize)]
pub struct Report {
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    pub bytes: usize,
    pub op: &'static str,
    pub rate_bps: f64,
    pub records: u64,
    pub cpu_s: f64,
}

pub fn run(a: &Args) -> Result<Report> {
    if !(1..=MAX_PLAINTEXT).contains(&a.bytes) {
        bail!("--bytes {} is outside 1..={MAX_PLAINTEXT} (one TLS record's plaintext)", a.bytes);
    }
    if !(a.seconds > 0.0 && a.seconds <= MAX_SECONDS) {
        bail!("--seconds {} is outside (0, {MAX_SECONDS}]", a.seconds);
    }
    let keys = TrafficKeys::from_secret(TlsHash::Sha256, &SECRET);
    let mut sealer = Sealer::new(&keys).map_err(|e| anyhow!("making a sealer: {e:?}"))?;
    let plaintext = vec![0xa5u8; a.bytes];
    let deadline = Duration::from_secs_f64(a.seconds);
    let start = Instant::now();
    let (mut records, mut cpu) = (0u64, 0.0f64);
    if a.decrypt {
        let mut opener = Opener::new(&keys).map_err(|e| anyhow!("making an opener: {e:?}"))?;
        let mut batch: Vec<Vec<u8>> = (0..BATCH).map(|_| Vec::with_capacity(a.bytes + 64)).collect();
        while start.elapsed() < deadline {
            for out in batch.iter_mut() {
                out.clear();
                sealer.seal_record(APPLICATION_DATA, &[&plaintext], out).map_err(|e| anyhow!("sealing: {e:?}"))?;
            }
            let t0 = thread_cpu_s();
            for record in batch.iter_mut() {
                let (kind, len) = opener.open_in_place(record).map_err(|e| anyhow!("opening: {e}"))?;
                if kind != APPLICATION_DATA || len != a.bytes {
                    bail!("opened a record of type {kind} and {len} bytes, sealed {APPLICATION_DATA} and {}", a.bytes);
                }
            }
            cpu += thread_cpu_s() - t0;
            records += BATCH as u64;
        }
    } else {
        let mut out = Vec::with_capacity(a.bytes + 64);
        let t0 = thread_cpu_s();
        while start.elapsed() < deadline {
            for _ in 0..BATCH {
                out.clear();
                sealer.seal_record(APPLICATION_DATA, &[&plaintext], &mut out).map_err(|e| anyhow!("sealing: {e:?}"))?;
            }
            records += BATCH as u64;
        }
        cpu = thread_cpu_s() - t0;
    }
    if cpu.is_nan() || cpu <= 0.0 {
        bail!("no CPU time counted for {records} records (the thread clock did not move)");
    }
    Ok(Report {
        implementation: "nvmf-tls",
        bytes: a.bytes,
        op: if a.decrypt { "decrypt" } else { "encrypt" },
        rate_bps: (records * a.bytes as u64) as f64 / cpu,
        records,
        cpu_s: cpu,
    })
}

/// This thread's CPU time in seconds: what the cipher used, not what other work on the core took.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID is always there on Linux");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_record_opens_to_its_plaintext() {
        let keys = TrafficKeys::from_secret(TlsHash::Sha256, &SECRET);
        let (mut sealer, mut opener) = (Sealer::new(&keys).unwrap(), Opener::new(&keys).unwrap());
        let plaintext: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let mut record = Vec::new();
        sealer.seal_record(APPLICATION_DATA, &[&plaintext], &mut record).unwrap();
        assert_ne!(&record[5..5 + plaintext.len()], &plaintext[..], "the body is ciphertext");
        let (kind, len) = opener.open_in_place(&mut record).unwrap();
        assert_eq!((kind, len), (APPLICATION_DATA, plaintext.len()));
        assert_eq!(&record[5..5 + len], &plaintext[..]);
    }

    #[test]
    fn both_directions_report_a_rate_and_bad_sizes_are_refused() {
        for decrypt in [false, true] {
            let r = run(&Args { bytes: 4096, seconds: 0.02, decrypt }).unwrap();
            assert!(r.rate_bps > 0.0 && r.records >= BATCH as u64, "{r:?}");
        }
        for bytes in [0, MAX_PLAINTEXT + 1] {
            let err = run(&Args { bytes, seconds: 0.02, decrypt: false }).unwrap_err();
            assert!(err.to_string().contains("outside 1..=16384"), "{err}");
        }
    }
}
