//! How many commands the host keeps outstanding on a queue, for sizing the groups of
//! CapsuleResps ([`super::data_path::Wire::responses`]).
//!
//! The target cannot see the host's queue depth: a null or fast namespace answers each command
//! within the turn that read it. But SPDK's host (a free list of requests) and nvmf-perf reuse
//! freed command identifiers first, so the distinct CIDs used over a tick are their depth.
//! Linux's host does not: its CID's low 12 bits are a blk-mq tag, and the sbitmap that hands
//! tags out moves its per-CPU hint past each tag it gives, so the tags drift over the whole
//! queue (SQSIZE, 128 by default). Captured in the guest (Linux 6.12, fio 4k randread QD32 and
//! QD128 at the emulated host's 1-2 K IOPS, bench/kernel_wire.py): 20-21 distinct tags in 32
//! commands, 46 in 128, 73-80 in 256, all 127 over 1600-1750 commands. A fast kernel host sends
//! thousands of commands per tick, so the gauge reads about the queue size, and the groups are
//! as large as the bounds allow (32). The kernel host reads everything the socket holds in one
//! go (no 32 KiB pipe as SPDK's), and under emulation it cannot be timed here, so what that
//! costs it is not measured.

/// CIDs are counted by their low 12 bits (Linux keeps a generation counter above them).
const CID_BITS: usize = 1 << 12;

pub(super) struct DepthGauge {
    seen: [u64; CID_BITS / 64],
    /// Distinct CIDs of the last tick that saw any command; 0 before the first.
    depth: u32,
}

impl DepthGauge {
    pub fn new() -> DepthGauge {
        DepthGauge { seen: [0; CID_BITS / 64], depth: 0 }
    }

    #[inline]
    pub fn saw(&mut self, cid: u16) {
        let bit = cid as usize % CID_BITS;
        self.seen[bit / 64] |= 1 << (bit % 64);
    }

    /// Ends a window: a tick without commands keeps the depth seen before it.
    pub fn tick(&mut self) {
        let distinct: u32 = self.seen.iter().map(|w| w.count_ones()).sum();
        if distinct > 0 {
            self.depth = distinct;
            self.seen = [0; CID_BITS / 64];
        }
    }

    pub fn depth(&self) -> u32 {
        self.depth
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_distinct_cids_per_tick_and_keeps_the_last_busy_one() {
        let mut g = DepthGauge::new();
        assert_eq!(g.depth(), 0);
        for round in 0..50u16 {
            for cid in 0..32u16 {
                g.saw(cid + (round % 3) * 4096); // Linux's generation bits above the tag
            }
        }
        g.tick();
        assert_eq!(g.depth(), 32);
        g.tick(); // nothing came: the last busy tick's depth stays
        assert_eq!(g.depth(), 32);
        g.saw(5);
        g.tick();
        assert_eq!(g.depth(), 1);
    }
}
