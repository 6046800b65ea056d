//! CRC32C header and data digests (NVMe/TCP 3.6.2.6). The digest is stored little endian.

/// Digest over a PDU header (the `hlen` bytes before HDGST).
pub fn header_digest(header: &[u8]) -> u32 {
    crc32c::crc32c(header)
}

/// Digest over a PDU's data (the DATAL bytes between PDO and DDGST).
pub fn data_digest(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Continues a digest over data that arrives or is sent in pieces.
pub fn crc32c_append(crc: u32, more: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, more)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_standard_check_value() {
        // CRC-32C (Castagnoli) check value from the iSCSI/RFC 3720 test vectors.
        assert_eq!(data_digest(b"123456789"), 0xE306_9283);
        assert_eq!(data_digest(&[0u8; 32]), 0x8A91_36AA);
    }

    #[test]
    fn append_equals_whole() {
        let whole = data_digest(b"hello, nvme over tcp");
        let split = crc32c_append(data_digest(b"hello, "), b"nvme over tcp");
        assert_eq!(whole, split);
    }
}
