//! Which I/O comes next: direction and offset for fio's `rw` modes over a job's region.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RwMode {
    Read,
    Write,
    RandRead,
    RandWrite,
    /// Sequential mixed reads and writes (fio `rw`/`readwrite`).
    ReadWrite,
    RandRw,
}

impl RwMode {
    pub fn is_random(self) -> bool {
        matches!(self, RwMode::RandRead | RwMode::RandWrite | RwMode::RandRw)
    }

    pub fn does_reads(self) -> bool {
        !matches!(self, RwMode::Write | RwMode::RandWrite)
    }

    pub fn does_writes(self) -> bool {
        !matches!(self, RwMode::Read | RwMode::RandRead)
    }

    pub fn name(self) -> &'static str {
        match self {
            RwMode::Read => "read",
            RwMode::Write => "write",
            RwMode::RandRead => "randread",
            RwMode::RandWrite => "randwrite",
            RwMode::ReadWrite => "rw",
            RwMode::RandRw => "randrw",
        }
    }
}

impl FromStr for RwMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "read" => RwMode::Read,
            "write" => RwMode::Write,
            "randread" => RwMode::RandRead,
            "randwrite" => RwMode::RandWrite,
            "rw" | "readwrite" => RwMode::ReadWrite,
            "randrw" => RwMode::RandRw,
            _ => {
                return Err(format!(
                    "unknown rw {s:?}: expected read, write, randread, randwrite, rw or randrw"
                ))
            }
        })
    }
}

impl fmt::Display for RwMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One I/O to issue: direction and byte offset (aligned to `bs`, inside the region).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoSpec {
    pub is_read: bool,
    pub offset: u64,
}

/// Generates I/Os over `[start, start + len)` in units of `bs`.
#[derive(Debug, Clone)]
pub struct Workload {
    mode: RwMode,
    rwmixread: u8,
    bs: u64,
    start: u64,
    units: u64,
    next_unit: u64,
    rng: fastrand::Rng,
}

impl Workload {
    /// `len` is rounded down to a multiple of `bs`; the caller checked that it holds at least one.
    pub fn new(mode: RwMode, rwmixread: u8, bs: u64, start: u64, len: u64, seed: u64) -> Self {
        Workload {
            mode,
            rwmixread: rwmixread.min(100),
            bs,
            start,
            units: (len / bs).max(1),
            next_unit: 0,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// How many `bs` units the region holds: one pass over it is this many I/Os.
    pub fn units(&self) -> u64 {
        self.units
    }

    pub fn next_io(&mut self) -> IoSpec {
        let is_read = match self.mode {
            RwMode::Read | RwMode::RandRead => true,
            RwMode::Write | RwMode::RandWrite => false,
            RwMode::ReadWrite | RwMode::RandRw => self.rng.u8(0..100) < self.rwmixread,
        };
        let unit = if self.mode.is_random() {
            self.rng.u64(0..self.units)
        } else {
            let u = self.next_unit;
            // Sequential workloads wrap to the start of the region, like fio's time_based runs.
            self.next_unit = if u + 1 >= self.units { 0 } else { u + 1 };
            u
        };
        IoSpec { is_read, offset: self.start + unit * self.bs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rw_names_parse_and_unknown_is_an_error() {
        for m in ["read", "write", "randread", "randwrite", "rw", "randrw"] {
            assert_eq!(m.parse::<RwMode>().unwrap().name(), m);
        }
        let e = "randomread".parse::<RwMode>().unwrap_err();
        assert!(e.contains("unknown rw"), "{e}");
    }

    #[test]
    fn random_offsets_are_aligned_and_inside_the_region() {
        let mut w = Workload::new(RwMode::RandRead, 100, 4096, 1 << 20, 64 * 4096 + 100, 1);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let io = w.next_io();
            assert!(io.is_read);
            assert_eq!(io.offset % 4096, 0);
            assert!(io.offset >= 1 << 20 && io.offset + 4096 <= (1 << 20) + 64 * 4096);
            seen.insert(io.offset);
        }
        assert_eq!(seen.len(), 64, "every unit is reachable");
    }

    #[test]
    fn sequential_walks_then_wraps() {
        let mut w = Workload::new(RwMode::Write, 0, 512, 0, 3 * 512, 1);
        let offs: Vec<u64> = (0..7).map(|_| w.next_io().offset).collect();
        assert_eq!(offs, [0, 512, 1024, 0, 512, 1024, 0]);
        assert!(!w.clone().next_io().is_read);
    }

    #[test]
    fn rwmixread_sets_the_read_share() {
        let mut w = Workload::new(RwMode::RandRw, 70, 4096, 0, 1 << 30, 42);
        let reads = (0..100_000).filter(|_| w.next_io().is_read).count();
        assert!((68_000..72_000).contains(&reads), "{reads}");
        let mut all_reads = Workload::new(RwMode::ReadWrite, 100, 4096, 0, 1 << 20, 1);
        assert!((0..100).all(|_| all_reads.next_io().is_read));
    }
}
