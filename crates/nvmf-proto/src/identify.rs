//! Identify data structures (NVMe Base 2.0, figures 275, 276 and 280; NVMe-oF 1.1 figure 28 for
//! the fabrics fields of the controller structure). Only the fields a fabrics controller fills
//! are modelled; every other byte is zero.

use crate::le::{put_str, put_u16, put_u32, put_u64, str_at, u16_at, u32_at, u64_at};
use crate::DecodeError;

pub const IDENTIFY_LEN: usize = 4096;

fn check_len(what: &'static str, b: &[u8]) -> Result<(), DecodeError> {
    if b.len() < IDENTIFY_LEN {
        return Err(DecodeError::Short { what, need: IDENTIFY_LEN, got: b.len() });
    }
    Ok(())
}

/// Controller type (CNTRLTYPE).
pub mod cntrltype {
    pub const IO: u8 = 1;
    pub const DISCOVERY: u8 = 2;
}

/// SGL support bits (SGLS).
pub mod sgls {
    /// SGLs supported, no alignment requirement.
    pub const SUPPORTED: u32 = 1 << 0;
    /// The SGL Data Block descriptor may carry an offset (needed for in-capsule data).
    pub const OFFSET: u32 = 1 << 20;
}

/// Optional NVM command support (ONCS).
pub mod oncs {
    pub const DSM: u16 = 1 << 2;
    pub const WRITE_ZEROES: u16 = 1 << 3;
}

/// Identify Controller VWC (byte 525).
pub mod vwc {
    /// Bit 0: a volatile write cache is present; Flush makes completed writes durable.
    pub const PRESENT: u8 = 1;
    /// Bits 2:1 = 11b: Flush with NSID FFFFFFFFh flushes every namespace (only meaningful,
    /// and only reported, with PRESENT).
    pub const FLUSH_ALL_NSID: u8 = 0b11 << 1;
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyController {
    pub vid: u16,
    pub ssvid: u16,
    pub sn: String,
    pub mn: String,
    pub fr: String,
    pub rab: u8,
    pub ieee: [u8; 3],
    pub cmic: u8,
    /// Maximum data transfer size as a power of two of the minimum page size (0 = no limit).
    pub mdts: u8,
    pub cntlid: u16,
    pub ver: u32,
    pub oaes: u32,
    pub ctratt: u32,
    pub cntrltype: u8,
    pub oacs: u16,
    pub acl: u8,
    pub aerl: u8,
    pub frmw: u8,
    pub lpa: u8,
    pub elpe: u8,
    /// Keep alive granularity in 100 ms units.
    pub kas: u16,
    pub sqes: u8,
    pub cqes: u8,
    pub maxcmd: u16,
    pub nn: u32,
    pub oncs: u16,
    pub vwc: u8,
    pub sgls: u32,
    pub subnqn: String,
    /// I/O queue command capsule size in 16-byte units (SQE plus in-capsule data).
    pub ioccsz: u32,
    /// I/O queue response capsule size in 16-byte units.
    pub iorcsz: u32,
    pub icdoff: u16,
    pub fcatt: u8,
    pub msdbd: u8,
}

impl IdentifyController {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        put_u16(&mut b, 0, self.vid);
        put_u16(&mut b, 2, self.ssvid);
        put_str(&mut b, 4, 20, &self.sn, b' ');
        put_str(&mut b, 24, 40, &self.mn, b' ');
        put_str(&mut b, 64, 8, &self.fr, b' ');
        b[72] = self.rab;
        b[73..76].copy_from_slice(&self.ieee);
        b[76] = self.cmic;
        b[77] = self.mdts;
        put_u16(&mut b, 78, self.cntlid);
        put_u32(&mut b, 80, self.ver);
        put_u32(&mut b, 92, self.oaes);
        put_u32(&mut b, 96, self.ctratt);
        b[111] = self.cntrltype;
        put_u16(&mut b, 256, self.oacs);
        b[258] = self.acl;
        b[259] = self.aerl;
        b[260] = self.frmw;
        b[261] = self.lpa;
        b[262] = self.elpe;
        put_u16(&mut b, 320, self.kas);
        b[512] = self.sqes;
        b[513] = self.cqes;
        put_u16(&mut b, 514, self.maxcmd);
        put_u32(&mut b, 516, self.nn);
        put_u16(&mut b, 520, self.oncs);
        b[525] = self.vwc;
        put_u32(&mut b, 536, self.sgls);
        put_str(&mut b, 768, 256, &self.subnqn, 0);
        put_u32(&mut b, 1792, self.ioccsz);
        put_u32(&mut b, 1796, self.iorcsz);
        put_u16(&mut b, 1800, self.icdoff);
        b[1802] = self.fcatt;
        b[1803] = self.msdbd;
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        check_len("identify controller", b)?;
        Ok(IdentifyController {
            vid: u16_at(b, 0),
            ssvid: u16_at(b, 2),
            sn: str_at(b, 4, 20),
            mn: str_at(b, 24, 40),
            fr: str_at(b, 64, 8),
            rab: b[72],
            ieee: b[73..76].try_into().expect("3 bytes"),
            cmic: b[76],
            mdts: b[77],
            cntlid: u16_at(b, 78),
            ver: u32_at(b, 80),
            oaes: u32_at(b, 92),
            ctratt: u32_at(b, 96),
            cntrltype: b[111],
            oacs: u16_at(b, 256),
            acl: b[258],
            aerl: b[259],
            frmw: b[260],
            lpa: b[261],
            elpe: b[262],
            kas: u16_at(b, 320),
            sqes: b[512],
            cqes: b[513],
            maxcmd: u16_at(b, 514),
            nn: u32_at(b, 516),
            oncs: u16_at(b, 520),
            vwc: b[525],
            sgls: u32_at(b, 536),
            subnqn: str_at(b, 768, 256),
            ioccsz: u32_at(b, 1792),
            iorcsz: u32_at(b, 1796),
            icdoff: u16_at(b, 1800),
            fcatt: b[1802],
            msdbd: b[1803],
        })
    }

    /// Bytes of in-capsule data an I/O command may carry.
    pub fn in_capsule_data_size(&self) -> usize {
        (self.ioccsz as usize * 16).saturating_sub(crate::nvme::SQE_LEN)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyNamespace {
    pub nsze: u64,
    pub ncap: u64,
    pub nuse: u64,
    pub nsfeat: u8,
    /// Number of LBA formats, 0's based.
    pub nlbaf: u8,
    pub flbas: u8,
    pub nmic: u8,
    pub dlfeat: u8,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    /// LBA data size of format 0 as a power of two.
    pub lbads: u8,
}

impl IdentifyNamespace {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; IDENTIFY_LEN];
        put_u64(&mut b, 0, self.nsze);
        put_u64(&mut b, 8, self.ncap);
        put_u64(&mut b, 16, self.nuse);
        b[24] = self.nsfeat;
        b[25] = self.nlbaf;
        b[26] = self.flbas;
        b[30] = self.nmic;
        b[33] = self.dlfeat;
        b[104..120].copy_from_slice(&self.nguid);
        b[120..128].copy_from_slice(&self.eui64);
        // LBA format 0: MS (16 bits) = 0, LBADS, RP = 0.
        b[130] = self.lbads;
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        check_len("identify namespace", b)?;
        let flbas = b[26];
        let fmt = 128 + 4 * (flbas & 0xF) as usize;
        Ok(IdentifyNamespace {
            nsze: u64_at(b, 0),
            ncap: u64_at(b, 8),
            nuse: u64_at(b, 16),
            nsfeat: b[24],
            nlbaf: b[25],
            flbas,
            nmic: b[30],
            dlfeat: b[33],
            nguid: b[104..120].try_into().expect("16 bytes"),
            eui64: b[120..128].try_into().expect("8 bytes"),
            lbads: b[fmt + 2],
        })
    }

    pub fn block_size(&self) -> u64 {
        1u64.checked_shl(self.lbads as u32).unwrap_or(0)
    }
}

/// Namespace Identification Descriptor types (NIDT).
pub mod nidt {
    pub const EUI64: u8 = 0x01;
    pub const NGUID: u8 = 0x02;
    pub const UUID: u8 = 0x03;
    pub const CSI: u8 = 0x04;
}

/// One Namespace Identification Descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsDescriptor {
    pub nidt: u8,
    pub nid: Vec<u8>,
}

/// Encodes a descriptor list into a 4096-byte page (a zero NIDT ends the list).
pub fn encode_ns_descriptors(descs: &[NsDescriptor]) -> Vec<u8> {
    let mut b = Vec::with_capacity(IDENTIFY_LEN);
    for d in descs {
        b.push(d.nidt);
        b.push(d.nid.len() as u8);
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&d.nid);
    }
    b.resize(IDENTIFY_LEN, 0);
    b
}

pub fn decode_ns_descriptors(b: &[u8]) -> Result<Vec<NsDescriptor>, DecodeError> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 4 <= b.len() && b[off] != 0 {
        let (nidt, nidl) = (b[off], b[off + 1] as usize);
        let nid = b.get(off + 4..off + 4 + nidl).ok_or(DecodeError::Invalid {
            what: "namespace descriptor",
            detail: format!("descriptor at {off} runs past the page"),
        })?;
        out.push(NsDescriptor { nidt, nid: nid.to_vec() });
        off += 4 + nidl;
    }
    Ok(out)
}

/// Encodes up to 1024 NSIDs (ascending) into an Active Namespace ID list page.
pub fn encode_ns_list(nsids: &[u32]) -> Vec<u8> {
    let mut b = vec![0u8; IDENTIFY_LEN];
    for (i, nsid) in nsids.iter().take(IDENTIFY_LEN / 4).enumerate() {
        put_u32(&mut b, i * 4, *nsid);
    }
    b
}

pub fn decode_ns_list(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4).map(|c| u32_at(c, 0)).take_while(|&n| n != 0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_fields_at_spec_offsets() {
        let id = IdentifyController {
            sn: "SN1".into(),
            mn: "nvmflab".into(),
            cntlid: 0x1234,
            ver: 0x0001_0400,
            cntrltype: cntrltype::IO,
            kas: 10,
            maxcmd: 128,
            nn: 4,
            sgls: sgls::SUPPORTED | sgls::OFFSET,
            subnqn: "nqn.x".into(),
            ioccsz: (64 + 8192) / 16,
            iorcsz: 1,
            ..Default::default()
        };
        let b = id.encode();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[4..8], b"SN1 ", "serial is space padded");
        assert_eq!(&b[78..80], &[0x34, 0x12]);
        assert_eq!(b[111], 1);
        assert_eq!(&b[514..516], &[128, 0]);
        assert_eq!(&b[536..540], &0x0010_0001u32.to_le_bytes());
        assert_eq!(&b[768..773], b"nqn.x");
        assert_eq!(&b[1792..1796], &((64 + 8192) / 16u32).to_le_bytes());
        let back = IdentifyController::decode(&b).unwrap();
        assert_eq!(back, id);
        assert_eq!(back.in_capsule_data_size(), 8192);
    }

    #[test]
    fn namespace_fields_at_spec_offsets() {
        let ns = IdentifyNamespace { nsze: 2048, ncap: 2048, nuse: 2048, lbads: 12, nguid: [7; 16], ..Default::default() };
        let b = ns.encode();
        assert_eq!(&b[0..8], &2048u64.to_le_bytes());
        assert_eq!(b[130], 12, "LBADS of format 0 at byte 130");
        let back = IdentifyNamespace::decode(&b).unwrap();
        assert_eq!(back, ns);
        assert_eq!(back.block_size(), 4096);
        assert!(IdentifyNamespace::decode(&b[..100]).is_err());
    }

    #[test]
    fn descriptor_and_namespace_lists() {
        let descs = vec![
            NsDescriptor { nidt: nidt::NGUID, nid: vec![1; 16] },
            NsDescriptor { nidt: nidt::CSI, nid: vec![0] },
        ];
        let b = encode_ns_descriptors(&descs);
        assert_eq!(&b[0..4], &[0x02, 16, 0, 0]);
        assert_eq!(&b[20..24], &[0x04, 1, 0, 0]);
        assert_eq!(decode_ns_descriptors(&b).unwrap(), descs);
        let mut bad = vec![0u8; 8];
        bad[0] = 2;
        bad[1] = 16;
        assert!(decode_ns_descriptors(&bad).is_err());
        assert_eq!(decode_ns_list(&encode_ns_list(&[1, 2, 5])), vec![1, 2, 5]);
    }
}
