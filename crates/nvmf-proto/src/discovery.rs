//! The discovery log page (NVMe over Fabrics 1.1, figures 37 and 38).

use crate::le::{put_str, put_u16, put_u64, str_at, u16_at, u64_at};
use crate::DecodeError;

pub const HEADER_LEN: usize = 1024;
pub const ENTRY_LEN: usize = 1024;

pub const TRTYPE_TCP: u8 = 3;
pub const ADRFAM_IPV4: u8 = 1;
pub const ADRFAM_IPV6: u8 = 2;
/// Subsystem types.
pub const SUBTYPE_REFERRAL: u8 = 1;
pub const SUBTYPE_NVME: u8 = 2;
pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;
/// TREQ bits 1:0, secure channel: not specified (what Linux nvmet says without TLS) or not required.
pub const TREQ_NOT_SPECIFIED: u8 = 0x0;
/// TREQ bits 1:0: a secure channel is required (Linux's NVMF_TREQ_REQUIRED).
pub const TREQ_REQUIRED: u8 = 0x1;
pub const TREQ_NOT_REQUIRED: u8 = 0x2;
/// TREQ bit 2: the host may disable SQ flow control (Connect CATTR bit 2).
pub const TREQ_DISABLE_SQFLOW: u8 = 0x4;
/// TSAS for TCP: no security.
pub const SECTYPE_NONE: u8 = 0;
/// TSAS for TCP: TLS 1.3 (Linux's NVMF_TCP_SECTYPE_TLS13).
pub const SECTYPE_TLS13: u8 = 2;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryLogEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub portid: u16,
    pub cntlid: u16,
    pub asqsz: u16,
    /// Entry flags (EFLAGS, bytes 11:10): explicit persistent connection, duplicate returned
    /// information, no CDC connectivity.
    pub eflags: u16,
    pub trsvcid: String,
    pub subnqn: String,
    pub traddr: String,
    pub sectype: u8,
}

impl DiscoveryLogEntry {
    fn encode_into(&self, b: &mut [u8]) {
        b[0] = self.trtype;
        b[1] = self.adrfam;
        b[2] = self.subtype;
        b[3] = self.treq;
        put_u16(b, 4, self.portid);
        put_u16(b, 6, self.cntlid);
        put_u16(b, 8, self.asqsz);
        put_u16(b, 10, self.eflags);
        put_str(b, 32, 32, &self.trsvcid, b' ');
        put_str(b, 256, 256, &self.subnqn, 0);
        put_str(b, 512, 256, &self.traddr, b' ');
        b[768] = self.sectype;
    }

    fn decode(b: &[u8]) -> Self {
        DiscoveryLogEntry {
            trtype: b[0],
            adrfam: b[1],
            subtype: b[2],
            treq: b[3],
            portid: u16_at(b, 4),
            cntlid: u16_at(b, 6),
            asqsz: u16_at(b, 8),
            eflags: u16_at(b, 10),
            trsvcid: str_at(b, 32, 32),
            subnqn: str_at(b, 256, 256),
            traddr: str_at(b, 512, 256),
            sectype: b[768],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiscoveryLogPage {
    pub genctr: u64,
    pub entries: Vec<DiscoveryLogEntry>,
}

impl DiscoveryLogPage {
    /// The whole page: a 1024-byte header then one 1024-byte record per entry. A Get Log Page
    /// returns the slice its offset and length select.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN + ENTRY_LEN * self.entries.len()];
        put_u64(&mut b, 0, self.genctr);
        put_u64(&mut b, 8, self.entries.len() as u64);
        // RECFMT 0 at byte 16.
        for (i, e) in self.entries.iter().enumerate() {
            let off = HEADER_LEN + i * ENTRY_LEN;
            e.encode_into(&mut b[off..off + ENTRY_LEN]);
        }
        b
    }

    /// Number of records announced in a page header (read the header first, then the rest).
    pub fn numrec(header: &[u8]) -> Result<u64, DecodeError> {
        if header.len() < 16 {
            return Err(DecodeError::Short { what: "discovery log header", need: 16, got: header.len() });
        }
        Ok(u64_at(header, 8))
    }

    /// Decodes as many whole records as `b` holds, up to NUMREC.
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        let numrec = Self::numrec(b)?;
        let available = b.len().saturating_sub(HEADER_LEN) / ENTRY_LEN;
        let n = (numrec.min(available as u64)) as usize;
        let entries = (0..n)
            .map(|i| DiscoveryLogEntry::decode(&b[HEADER_LEN + i * ENTRY_LEN..HEADER_LEN + (i + 1) * ENTRY_LEN]))
            .collect();
        Ok(DiscoveryLogPage { genctr: u64_at(b, 0), entries })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(nqn: &str) -> DiscoveryLogEntry {
        DiscoveryLogEntry {
            trtype: TRTYPE_TCP,
            adrfam: ADRFAM_IPV4,
            subtype: SUBTYPE_NVME,
            treq: TREQ_NOT_REQUIRED,
            portid: 1,
            cntlid: 0xFFFF,
            asqsz: 32,
            eflags: 0,
            trsvcid: "4420".into(),
            subnqn: nqn.into(),
            traddr: "127.0.0.1".into(),
            sectype: SECTYPE_NONE,
        }
    }

    #[test]
    fn page_layout_and_round_trip() {
        let page = DiscoveryLogPage { genctr: 5, entries: vec![entry("nqn.a"), entry("nqn.b")] };
        let b = page.encode();
        assert_eq!(b.len(), 3 * 1024);
        assert_eq!(&b[8..16], &2u64.to_le_bytes(), "NUMREC");
        let e = &b[1024..2048];
        assert_eq!(e[0], 3, "TRTYPE tcp");
        assert_eq!(&e[32..36], b"4420");
        assert_eq!(e[36], b' ', "TRSVCID is space padded");
        assert_eq!(&e[256..261], b"nqn.a");
        assert_eq!(&e[512..521], b"127.0.0.1");
        assert_eq!(DiscoveryLogPage::decode(&b).unwrap(), page);
        // A page cut short decodes the whole records it holds.
        assert_eq!(DiscoveryLogPage::decode(&b[..2048]).unwrap().entries.len(), 1);
    }
}
