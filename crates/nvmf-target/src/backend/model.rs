//! Model backend: RAM that answers like a device. Data is kept in a [`RamStore`]; each command's
//! completion is held back until a simple device model says it is done:
//!
//! - `parallelism` media units each serve one command at a time for `latency` (a flash die, a
//!   channel): a command waits for the first free unit;
//! - then its data crosses one shared link of `bandwidth` bytes per second (the device's PCIe or
//!   controller limit), one transfer after another.
//!
//! So a lone command takes `latency + len / bandwidth`, IOPS saturate at `parallelism / latency`
//! for small commands, and bandwidth at `bandwidth` for large ones, which is what makes a device's
//! queue-depth and block-size curves bend where RAM's do not. It does not model garbage
//! collection, write caches, read/write asymmetry or a device's internal queueing policy.
//!
//! Flush and Deallocate complete at once (no medium to reach). Times are CLOCK_MONOTONIC
//! nanoseconds, the clock io_uring's absolute timeouts use.

use super::{IoOp, IoRequest, RamStore};
use std::sync::Mutex;

/// The model's parameters, as `--ns model:SIZE,lat=80us,par=32,bw=3GiB` and TOML's
/// `model = "lat=80us,par=32,bw=3GiB"` write them (bw per second; no bw: no link limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelParams {
    pub latency_ns: u64,
    pub parallelism: u32,
    pub bandwidth: Option<u64>,
}

impl Default for ModelParams {
    /// Roughly a datacenter NVMe SSD: 80 us reads, 32 dies busy at once, 3 GiB/s.
    fn default() -> Self {
        ModelParams { latency_ns: 80_000, parallelism: 32, bandwidth: Some(3 << 30) }
    }
}

impl ModelParams {
    /// Parses `key=value` pairs separated by commas over the defaults; the error names the pair.
    pub fn parse(text: &str) -> Result<ModelParams, String> {
        let mut p = ModelParams::default();
        for pair in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = pair.split_once('=').ok_or_else(|| format!("{pair:?}: expected key=value"))?;
            match key.trim() {
                "lat" | "latency" => {
                    p.latency_ns = parse_duration_ns(value)
                        .filter(|ns| *ns <= 1_000_000_000)
                        .ok_or_else(|| format!("{pair:?}: latency must be e.g. 80us, 1ms, 500ns (at most 1s)"))?
                }
                "par" | "parallelism" => {
                    p.parallelism = value
                        .trim()
                        .parse()
                        .ok()
                        .filter(|n| (1..=4096).contains(n))
                        .ok_or_else(|| format!("{pair:?}: parallelism must be 1..=4096"))?
                }
                "bw" | "bandwidth" => {
                    p.bandwidth = match value.trim() {
                        "none" | "0" => None,
                        v => Some(
                            crate::units::parse_size(v)
                                .filter(|b| *b >= 1 << 20)
                                .ok_or_else(|| format!("{pair:?}: bandwidth per second must be e.g. 3GiB, 500MiB (at least 1MiB) or none"))?,
                        ),
                    }
                }
                other => return Err(format!("{other:?}: unknown model parameter (lat, par, bw)")),
            }
        }
        Ok(p)
    }
}

fn parse_duration_ns(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let scale = match unit {
        "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(scale)
}

pub struct ModelStore {
    store: RamStore,
    params: ModelParams,
    state: Mutex<ModelState>,
}

struct ModelState {
    /// When each media unit becomes free.
    units: Vec<u64>,
    /// When the shared link becomes free.
    link_free: u64,
}

impl ModelStore {
    pub fn new(size: u64, params: ModelParams) -> ModelStore {
        let units = vec![0; params.parallelism.max(1) as usize];
        ModelStore { store: RamStore::new(size), params, state: Mutex::new(ModelState { units, link_free: 0 }) }
    }

    pub fn size(&self) -> u64 {
        self.store.size()
    }

    pub fn params(&self) -> &ModelParams {
        &self.params
    }

    /// Moves the data at once and returns when the model completes the command (CLOCK_MONOTONIC ns).
    pub(super) fn execute(&self, req: &IoRequest, now_ns: u64) -> (Result<(), i32>, u64) {
        let result = self.store.execute(req);
        if result.is_err() || matches!(req.op, IoOp::Flush | IoOp::Deallocate) {
            return (result, now_ns);
        }
        // Write Zeroes moves no data over the link.
        let bytes = if req.op == IoOp::WriteZeroes { 0 } else { req.len };
        (result, self.schedule(now_ns, bytes))
    }

    /// Books a unit and the link for a command of `bytes` arriving at `now_ns`; its completion time.
    fn schedule(&self, now_ns: u64, bytes: u64) -> u64 {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (unit, free_at) = s.units.iter().copied().enumerate().min_by_key(|&(_, t)| t).expect("units");
        let media_done = now_ns.max(free_at) + self.params.latency_ns;
        s.units[unit] = media_done;
        let transfer_ns = match self.params.bandwidth {
            Some(bw) if bw > 0 => (bytes as u128 * 1_000_000_000 / bw as u128) as u64,
            _ => 0,
        };
        let done = media_done.max(s.link_free) + transfer_ns;
        s.link_free = done;
        done
    }
}

/// CLOCK_MONOTONIC now, in nanoseconds.
pub(super) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(latency_us: u64, parallelism: u32, bandwidth: Option<u64>) -> ModelStore {
        ModelStore::new(1 << 20, ModelParams { latency_ns: latency_us * 1000, parallelism, bandwidth })
    }

    #[test]
    fn a_lone_command_takes_latency_plus_transfer() {
        let m = model(80, 4, Some(1 << 30)); // 1 GiB/s: 4 KiB cross in 3814 ns
        assert_eq!(m.schedule(1_000_000, 4096), 1_000_000 + 80_000 + 3814);
    }

    #[test]
    fn commands_beyond_parallelism_wait_for_a_unit() {
        let m = model(100, 2, None);
        let done: Vec<u64> = (0..5).map(|_| m.schedule(0, 4096)).collect();
        assert_eq!(done, vec![100_000, 100_000, 200_000, 200_000, 300_000]);
    }

    #[test]
    fn large_commands_are_bounded_by_the_link() {
        // 8 units of 10 us and a 1 GB/s link: 128 KiB commands leave one per 131 us, so the media's
        // parallelism no longer matters.
        let m = model(10, 8, Some(1_000_000_000));
        let done: Vec<u64> = (0..4).map(|_| m.schedule(0, 128 << 10)).collect();
        let gaps: Vec<u64> = done.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(gaps, vec![131_072; 3]);
        assert_eq!(done[0], 10_000 + 131_072);
    }

    #[test]
    fn idle_time_is_not_banked() {
        let m = model(50, 1, None);
        assert_eq!(m.schedule(0, 512), 50_000);
        // Arriving long after the unit freed: served at once, not early.
        assert_eq!(m.schedule(1_000_000, 512), 1_050_000);
    }

    #[test]
    fn params_parse_over_defaults_and_name_bad_pairs() {
        let p = ModelParams::parse("lat=100us, par=8").unwrap();
        assert_eq!(p, ModelParams { latency_ns: 100_000, parallelism: 8, bandwidth: ModelParams::default().bandwidth });
        assert_eq!(ModelParams::parse("bw=none").unwrap().bandwidth, None);
        assert_eq!(ModelParams::parse("bw=500MiB").unwrap().bandwidth, Some(500 << 20));
        for (bad, names) in [("lat=5", "lat=5"), ("par=0", "par=0"), ("bw=1k", "bw=1k"), ("speed=3", "speed"), ("lat", "lat"), ("lat=2s", "lat=2s")] {
            let e = ModelParams::parse(bad).unwrap_err();
            assert!(e.contains(names), "{bad}: {e}");
        }
    }

    #[test]
    fn flush_is_immediate_and_data_is_stored() {
        let m = model(1000, 1, None);
        let mut buf = vec![7u8; 4096];
        let w = IoRequest { op: IoOp::Write, offset: 4096, len: 4096, buf: buf.as_mut_ptr(), tag: 1 };
        assert_eq!(m.execute(&w, 5).0, Ok(()));
        let f = IoRequest { op: IoOp::Flush, offset: 0, len: 0, buf: std::ptr::null_mut(), tag: 2 };
        assert_eq!(m.execute(&f, 5), (Ok(()), 5));
        let mut back = vec![0u8; 4096];
        let r = IoRequest { op: IoOp::Read, offset: 4096, len: 4096, buf: back.as_mut_ptr(), tag: 3 };
        let (res, _) = m.execute(&r, 5);
        assert_eq!(res, Ok(()));
        assert_eq!(back, buf);
    }
}
