//! Reads fuzz input as a script. Every read succeeds (an exhausted input reads as zeros), so
//! every byte string is a valid script and a mutation changes one decision, not the framing.

pub struct Script<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Script<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Script { data, pos: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub fn u8(&mut self) -> u8 {
        let v = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        v
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 != 0
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        (self.u32() as u64) | ((self.u32() as u64) << 32)
    }

    /// A choice among `n` (> 0) options.
    pub fn pick(&mut self, n: usize) -> usize {
        self.u8() as usize % n
    }

    /// Up to `n` raw bytes (fewer when the input ends).
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.pos = end.max(self.pos);
        &self.data[start..end]
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let n = self.data.len().saturating_sub(self.pos);
        self.bytes(n)
    }
}

/// Deterministic payload bytes, so a test can tell data that travelled from data that did not.
pub fn pattern(seed: u16, offset: usize) -> u8 {
    (offset as u8) ^ ((offset >> 8) as u8).rotate_left(3) ^ (seed as u8) ^ 0x5A
}
