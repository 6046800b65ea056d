//! Self-describing block patterns for `--verify`.
//!
//! Every logical block written under `--verify` starts with a 32-byte header and is filled with
//! bytes derived from its LBA and the run's generation number, so a reader can tell, from the
//! block alone, whether it holds the data meant for that LBA:
//!
//! | bytes  | field                                                   |
//! |--------|---------------------------------------------------------|
//! | 0..4   | magic `NVFL`                                            |
//! | 4..8   | CRC32C of bytes 8..block_size                           |
//! | 8..16  | LBA the block was written for                           |
//! | 16..24 | generation (one random number per run)                  |
//! | 24..28 | block size                                              |
//! | 28..32 | zero                                                    |
//! | 32..   | splitmix64 stream seeded by (LBA, generation)           |
//!
//! One generation per run, not per write, so two writes of the same LBA racing at iodepth > 1
//! leave identical bytes and a read-back never reports a false mismatch.

use std::fmt;

pub const MAGIC: [u8; 4] = *b"NVFL";
pub const HEADER_LEN: usize = 32;

/// What a block held instead of the expected pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// No pattern at all (never written, zeroes, foreign data).
    NoPattern { magic: [u8; 4] },
    /// Header present but the checksum does not match the contents.
    Corrupted { stored_crc: u32, computed_crc: u32 },
    /// A valid pattern, but for another LBA or generation.
    Pattern { lba: u64, generation: u64 },
}

/// A block whose contents are not what `--verify` expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub lba: u64,
    pub expected_generation: Option<u64>,
    pub found: Found,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "verify failed at LBA {}: expected the pattern for LBA {}", self.lba, self.lba)?;
        if let Some(g) = self.expected_generation {
            write!(f, " generation {g:#x}")?;
        }
        match &self.found {
            Found::NoPattern { magic } => write!(f, ", found no pattern (first bytes {magic:02x?})"),
            Found::Corrupted { stored_crc, computed_crc } => write!(
                f,
                ", found a corrupted block (stored CRC32C {stored_crc:#010x}, contents give {computed_crc:#010x})"
            ),
            Found::Pattern { lba, generation } => {
                write!(f, ", found the pattern for LBA {lba} generation {generation:#x}")
            }
        }
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Writes the pattern of `lba` into one block (`block.len()` is the block size, >= 64).
pub fn fill_block(block: &mut [u8], lba: u64, generation: u64) {
    let seed = splitmix64(lba ^ generation.rotate_left(32));
    for (i, chunk) in block[HEADER_LEN..].chunks_mut(8).enumerate() {
        let w = splitmix64(seed.wrapping_add(i as u64)).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
    block[0..4].copy_from_slice(&MAGIC);
    block[8..16].copy_from_slice(&lba.to_le_bytes());
    block[16..24].copy_from_slice(&generation.to_le_bytes());
    let size = block.len() as u32;
    block[24..28].copy_from_slice(&size.to_le_bytes());
    block[28..32].fill(0);
    let crc = crc32c::crc32c(&block[8..]);
    block[4..8].copy_from_slice(&crc.to_le_bytes());
}

/// Fills a buffer of consecutive blocks starting at `slba`.
pub fn fill(buf: &mut [u8], block_size: usize, slba: u64, generation: u64) {
    for (i, block) in buf.chunks_exact_mut(block_size).enumerate() {
        fill_block(block, slba + i as u64, generation);
    }
}

/// Checks one block against the pattern for `lba`; `generation` None accepts any generation
/// (a read workload checking data written by an earlier run).
pub fn check_block(block: &[u8], lba: u64, generation: Option<u64>) -> Result<(), Mismatch> {
    let fail = |found| Err(Mismatch { lba, expected_generation: generation, found });
    let magic: [u8; 4] = block[0..4].try_into().expect("block >= 32 bytes");
    if magic != MAGIC {
        return fail(Found::NoPattern { magic });
    }
    let stored_crc = u32::from_le_bytes(block[4..8].try_into().expect("4 bytes"));
    let computed_crc = crc32c::crc32c(&block[8..]);
    if stored_crc != computed_crc {
        return fail(Found::Corrupted { stored_crc, computed_crc });
    }
    let found_lba = u64::from_le_bytes(block[8..16].try_into().expect("8 bytes"));
    let found_gen = u64::from_le_bytes(block[16..24].try_into().expect("8 bytes"));
    if found_lba != lba || generation.is_some_and(|g| g != found_gen) {
        return fail(Found::Pattern { lba: found_lba, generation: found_gen });
    }
    Ok(())
}

/// Checks a buffer of consecutive blocks starting at `slba`; reports the first bad block.
pub fn check(buf: &[u8], block_size: usize, slba: u64, generation: Option<u64>) -> Result<(), Mismatch> {
    for (i, block) in buf.chunks_exact(block_size).enumerate() {
        check_block(block, slba + i as u64, generation)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filled_buffer_checks_clean() {
        for bs in [512usize, 4096] {
            let mut buf = vec![0u8; bs * 4];
            fill(&mut buf, bs, 100, 7);
            assert_eq!(check(&buf, bs, 100, Some(7)), Ok(()));
            assert_eq!(check(&buf, bs, 100, None), Ok(()));
        }
    }

    #[test]
    fn wrong_lba_is_detected_and_named() {
        let mut buf = vec![0u8; 1024];
        fill(&mut buf, 512, 100, 7);
        let err = check(&buf, 512, 200, Some(7)).unwrap_err();
        assert_eq!(err.lba, 200);
        assert_eq!(err.found, Found::Pattern { lba: 100, generation: 7 });
        let msg = err.to_string();
        assert!(msg.contains("LBA 200") && msg.contains("LBA 100"), "{msg}");
    }

    #[test]
    fn wrong_generation_is_detected() {
        let mut buf = vec![0u8; 512];
        fill(&mut buf, 512, 5, 1);
        let err = check(&buf, 512, 5, Some(2)).unwrap_err();
        assert_eq!(err.found, Found::Pattern { lba: 5, generation: 1 });
        assert!(check(&buf, 512, 5, None).is_ok(), "any generation is fine for read workloads");
    }

    #[test]
    fn corruption_anywhere_is_detected() {
        let mut buf = vec![0u8; 4096];
        fill(&mut buf, 4096, 9, 3);
        for pos in [9usize, 40, 2000, 4095] {
            let mut bad = buf.clone();
            bad[pos] ^= 0x10;
            let err = check(&bad, 4096, 9, Some(3)).unwrap_err();
            assert!(matches!(err.found, Found::Corrupted { .. } | Found::Pattern { .. }), "{pos}: {err}");
        }
        let err = check(&[0u8; 512], 512, 1, Some(3)).unwrap_err();
        assert_eq!(err.found, Found::NoPattern { magic: [0; 4] });
        assert!(err.to_string().contains("no pattern"));
    }

    #[test]
    fn the_second_block_is_named_when_it_is_the_bad_one() {
        let mut buf = vec![0u8; 1536];
        fill(&mut buf, 512, 10, 1);
        buf[512 + 100] ^= 1;
        assert_eq!(check(&buf, 512, 10, Some(1)).unwrap_err().lba, 11);
    }
}
