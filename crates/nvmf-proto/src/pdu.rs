//! NVMe/TCP PDU headers (Transport Specification 1.0, section 3.6) and their encoding.

use crate::digest::{data_digest, header_digest};
use crate::le::{put_u16, put_u32, u16_at, u32_at};
use crate::nvme::{Cqe, Sqe, CQE_LEN, SQE_LEN};

pub const COMMON_HEADER_LEN: usize = 8;
pub const DIGEST_LEN: usize = 4;
/// A TermReq carries at most this many bytes of the PDU header that caused it.
pub const TERM_REQ_MAX_HEADER: usize = 152;

pub const IC_REQ_HLEN: u8 = 128;
pub const IC_RESP_HLEN: u8 = 128;
pub const TERM_REQ_HLEN: u8 = 24;
pub const CAPSULE_CMD_HLEN: u8 = (COMMON_HEADER_LEN + SQE_LEN) as u8;
pub const CAPSULE_RESP_HLEN: u8 = (COMMON_HEADER_LEN + CQE_LEN) as u8;
pub const DATA_HLEN: u8 = 24;
pub const R2T_HLEN: u8 = 24;

/// PFV of NVMe/TCP 1.0, the only format version.
pub const PFV_1_0: u16 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PduType {
    IcReq = 0x00,
    IcResp = 0x01,
    H2CTermReq = 0x02,
    C2HTermReq = 0x03,
    CapsuleCmd = 0x04,
    CapsuleResp = 0x05,
    H2CData = 0x06,
    C2HData = 0x07,
    R2T = 0x09,
}

impl PduType {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2CTermReq,
            0x03 => PduType::C2HTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2CData,
            0x07 => PduType::C2HData,
            0x09 => PduType::R2T,
            _ => return None,
        })
    }

    /// The fixed header length of this type (HLEN), which a receiver must check.
    pub fn hlen(self) -> u8 {
        match self {
            PduType::IcReq => IC_REQ_HLEN,
            PduType::IcResp => IC_RESP_HLEN,
            PduType::H2CTermReq | PduType::C2HTermReq => TERM_REQ_HLEN,
            PduType::CapsuleCmd => CAPSULE_CMD_HLEN,
            PduType::CapsuleResp => CAPSULE_RESP_HLEN,
            PduType::H2CData | PduType::C2HData => DATA_HLEN,
            PduType::R2T => R2T_HLEN,
        }
    }

    /// Whether PDUs of this type may carry a header digest once digests are negotiated
    /// (ICReq/ICResp and TermReqs never do).
    pub fn has_header_digest(self) -> bool {
        !matches!(
            self,
            PduType::IcReq | PduType::IcResp | PduType::H2CTermReq | PduType::C2HTermReq
        )
    }

    /// Whether PDUs of this type may carry data (and so a data digest).
    pub fn may_carry_data(self) -> bool {
        matches!(self, PduType::CapsuleCmd | PduType::H2CData | PduType::C2HData)
    }
}

/// Common header FLAGS bits.
pub mod flags {
    pub const HDGSTF: u8 = 0x01;
    pub const DDGSTF: u8 = 0x02;
    /// H2CData/C2HData: the last data PDU of the command's transfer.
    pub const LAST_PDU: u8 = 0x04;
    /// C2HData: the command completed successfully, no CapsuleResp follows.
    pub const SUCCESS: u8 = 0x08;
}

/// Fatal Error Status carried in a TermReq.
pub mod fes {
    pub const INVALID_PDU_HDR: u16 = 0x01;
    pub const PDU_SEQ_ERR: u16 = 0x02;
    pub const HDR_DIGEST_ERR: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const DATA_LIMIT_EXCEEDED: u16 = 0x05;
    pub const UNSUPPORTED_PARAM: u16 = 0x06;
}

/// The 8-byte header every PDU starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    pub pdu_type: u8,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

impl CommonHeader {
    pub fn parse(b: &[u8]) -> Option<Self> {
        if b.len() < COMMON_HEADER_LEN {
            return None;
        }
        Some(CommonHeader { pdu_type: b[0], flags: b[1], hlen: b[2], pdo: b[3], plen: u32_at(b, 4) })
    }

    pub fn write(&self, b: &mut [u8]) {
        b[0] = self.pdu_type;
        b[1] = self.flags;
        b[2] = self.hlen;
        b[3] = self.pdo;
        put_u32(b, 4, self.plen);
    }
}

/// Which digests were negotiated at connection setup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

fn flag_if(cond: bool, flag: u8) -> u8 {
    if cond {
        flag
    } else {
        0
    }
}

fn digest_bits(hdgst: bool, ddgst: bool) -> u8 {
    (hdgst as u8) | ((ddgst as u8) << 1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    pub pfv: u16,
    /// Host PDU data alignment, in dwords minus one.
    pub hpda: u8,
    pub hdgst: bool,
    pub ddgst: bool,
    /// Maximum outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    pub pfv: u16,
    /// Controller PDU data alignment, in dwords minus one.
    pub cpda: u8,
    pub hdgst: bool,
    pub ddgst: bool,
    /// Largest H2CData payload the controller accepts, in bytes.
    pub maxh2cdata: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TermReq {
    pub fes: u16,
    /// Fatal error information: for an invalid header field, the byte offset of that field.
    pub fei: u32,
    /// The offending PDU header (at most 152 bytes).
    pub header: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapsuleCmd {
    pub sqe: Sqe,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapsuleResp {
    pub cqe: Cqe,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct H2CData {
    pub cccid: u16,
    pub ttag: u16,
    pub datao: u32,
    pub datal: u32,
    pub last: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct C2HData {
    pub cccid: u16,
    pub datao: u32,
    pub datal: u32,
    pub last: bool,
    pub success: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct R2T {
    pub cccid: u16,
    pub ttag: u16,
    pub r2to: u32,
    pub r2tl: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PduHeader {
    IcReq(IcReq),
    IcResp(IcResp),
    H2CTermReq(TermReq),
    C2HTermReq(TermReq),
    CapsuleCmd(CapsuleCmd),
    CapsuleResp(CapsuleResp),
    H2CData(H2CData),
    C2HData(C2HData),
    R2T(R2T),
}

impl PduHeader {
    pub fn pdu_type(&self) -> PduType {
        match self {
            PduHeader::IcReq(_) => PduType::IcReq,
            PduHeader::IcResp(_) => PduType::IcResp,
            PduHeader::H2CTermReq(_) => PduType::H2CTermReq,
            PduHeader::C2HTermReq(_) => PduType::C2HTermReq,
            PduHeader::CapsuleCmd(_) => PduType::CapsuleCmd,
            PduHeader::CapsuleResp(_) => PduType::CapsuleResp,
            PduHeader::H2CData(_) => PduType::H2CData,
            PduHeader::C2HData(_) => PduType::C2HData,
            PduHeader::R2T(_) => PduType::R2T,
        }
    }

    /// Type-specific flag bits (the digest flags are added by the encoder).
    fn type_flags(&self) -> u8 {
        match self {
            PduHeader::H2CData(h) => flag_if(h.last, flags::LAST_PDU),
            PduHeader::C2HData(c) => flag_if(c.last, flags::LAST_PDU) | flag_if(c.success, flags::SUCCESS),
            _ => 0,
        }
    }

    /// Writes the type-specific part of the header (bytes 8..hlen) into `b`.
    fn write_specific(&self, b: &mut [u8]) {
        match self {
            PduHeader::IcReq(r) => {
                put_u16(b, 8, r.pfv);
                b[10] = r.hpda;
                b[11] = digest_bits(r.hdgst, r.ddgst);
                put_u32(b, 12, r.maxr2t);
            }
            PduHeader::IcResp(r) => {
                put_u16(b, 8, r.pfv);
                b[10] = r.cpda;
                b[11] = digest_bits(r.hdgst, r.ddgst);
                put_u32(b, 12, r.maxh2cdata);
            }
            PduHeader::H2CTermReq(t) | PduHeader::C2HTermReq(t) => {
                put_u16(b, 8, t.fes);
                put_u32(b, 10, t.fei);
            }
            PduHeader::CapsuleCmd(c) => b[8..8 + SQE_LEN].copy_from_slice(&c.sqe.0),
            PduHeader::CapsuleResp(c) => b[8..8 + CQE_LEN].copy_from_slice(&c.cqe.encode()),
            PduHeader::H2CData(d) => {
                put_u16(b, 8, d.cccid);
                put_u16(b, 10, d.ttag);
                put_u32(b, 12, d.datao);
                put_u32(b, 16, d.datal);
            }
            PduHeader::C2HData(d) => {
                put_u16(b, 8, d.cccid);
                put_u32(b, 12, d.datao);
                put_u32(b, 16, d.datal);
            }
            PduHeader::R2T(r) => {
                put_u16(b, 8, r.cccid);
                put_u16(b, 10, r.ttag);
                put_u32(b, 12, r.r2to);
                put_u32(b, 16, r.r2tl);
            }
        }
    }

    /// Parses the type-specific part of a header whose type, hlen and length were validated.
    pub(crate) fn parse_specific(ty: PduType, flags_byte: u8, h: &[u8]) -> PduHeader {
        match ty {
            PduType::IcReq => PduHeader::IcReq(IcReq {
                pfv: u16_at(h, 8),
                hpda: h[10],
                hdgst: h[11] & 1 != 0,
                ddgst: h[11] & 2 != 0,
                maxr2t: u32_at(h, 12),
            }),
            PduType::IcResp => PduHeader::IcResp(IcResp {
                pfv: u16_at(h, 8),
                cpda: h[10],
                hdgst: h[11] & 1 != 0,
                ddgst: h[11] & 2 != 0,
                maxh2cdata: u32_at(h, 12),
            }),
            PduType::H2CTermReq | PduType::C2HTermReq => {
                let t = TermReq { fes: u16_at(h, 8), fei: u32_at(h, 10), header: Vec::new() };
                if ty == PduType::H2CTermReq { PduHeader::H2CTermReq(t) } else { PduHeader::C2HTermReq(t) }
            }
            PduType::CapsuleCmd => {
                PduHeader::CapsuleCmd(CapsuleCmd { sqe: Sqe::from_bytes(&h[8..]).expect("hlen checked") })
            }
            PduType::CapsuleResp => PduHeader::CapsuleResp(CapsuleResp {
                cqe: Cqe::decode(h[8..8 + CQE_LEN].try_into().expect("hlen checked")),
            }),
            PduType::H2CData => PduHeader::H2CData(H2CData {
                cccid: u16_at(h, 8),
                ttag: u16_at(h, 10),
                datao: u32_at(h, 12),
                datal: u32_at(h, 16),
                last: flags_byte & flags::LAST_PDU != 0,
            }),
            PduType::C2HData => PduHeader::C2HData(C2HData {
                cccid: u16_at(h, 8),
                datao: u32_at(h, 12),
                datal: u32_at(h, 16),
                last: flags_byte & flags::LAST_PDU != 0,
                success: flags_byte & flags::SUCCESS != 0,
            }),
            PduType::R2T => PduHeader::R2T(R2T {
                cccid: u16_at(h, 8),
                ttag: u16_at(h, 10),
                r2to: u32_at(h, 12),
                r2tl: u32_at(h, 16),
            }),
        }
    }
}

/// Appends everything of a PDU that comes before its data: header, header digest and (for a
/// PDU with data) the data offset. The caller then appends `data_len` bytes of data and, when
/// `dg.data` and `data_len > 0`, the data digest. Data is placed right after the header (PDA 0,
/// which every host and controller must accept).
pub fn encode_pdu_header(out: &mut Vec<u8>, hdr: &PduHeader, data_len: usize, dg: Digests) {
    let ty = hdr.pdu_type();
    let hlen = ty.hlen() as usize;
    let hdgst = dg.header && ty.has_header_digest();
    let ddgst = dg.data && ty.may_carry_data() && data_len > 0;
    let (term_extra, pdo) = match hdr {
        PduHeader::H2CTermReq(t) | PduHeader::C2HTermReq(t) => (t.header.len().min(TERM_REQ_MAX_HEADER), 0),
        _ if data_len > 0 => (0, hlen + if hdgst { DIGEST_LEN } else { 0 }),
        _ => (0, 0),
    };
    let plen = hlen
        + if hdgst { DIGEST_LEN } else { 0 }
        + term_extra
        + data_len
        + if ddgst { DIGEST_LEN } else { 0 };
    let start = out.len();
    out.resize(start + hlen, 0);
    let h = &mut out[start..];
    let flag_bits =
        hdr.type_flags() | if hdgst { flags::HDGSTF } else { 0 } | if ddgst { flags::DDGSTF } else { 0 };
    CommonHeader { pdu_type: ty as u8, flags: flag_bits, hlen: hlen as u8, pdo: pdo as u8, plen: plen as u32 }
        .write(h);
    hdr.write_specific(h);
    if hdgst {
        let d = header_digest(&out[start..start + hlen]);
        out.extend_from_slice(&d.to_le_bytes());
    }
    if let PduHeader::H2CTermReq(t) | PduHeader::C2HTermReq(t) = hdr {
        out.extend_from_slice(&t.header[..term_extra]);
    }
}

/// Appends a whole PDU: header, header digest, data and data digest as negotiated.
pub fn encode_pdu(out: &mut Vec<u8>, hdr: &PduHeader, data: &[u8], dg: Digests) {
    encode_pdu_header(out, hdr, data.len(), dg);
    out.extend_from_slice(data);
    if dg.data && hdr.pdu_type().may_carry_data() && !data.is_empty() {
        out.extend_from_slice(&data_digest(data).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvme::{io_opcode, SglDescriptor, Status};

    #[test]
    fn icreq_layout() {
        let mut out = Vec::new();
        let req = IcReq { pfv: 0, hpda: 0, hdgst: true, ddgst: false, maxr2t: 0 };
        encode_pdu(&mut out, &PduHeader::IcReq(req), &[], Digests::default());
        assert_eq!(out.len(), 128);
        assert_eq!(&out[..8], &[0x00, 0x00, 128, 0, 128, 0, 0, 0]);
        assert_eq!(out[11], 0x01, "DGST byte: bit 0 = header digest");
    }

    #[test]
    fn icresp_layout() {
        let mut out = Vec::new();
        let resp = IcResp { pfv: 0, cpda: 0, hdgst: false, ddgst: true, maxh2cdata: 0x2_0000 };
        encode_pdu(&mut out, &PduHeader::IcResp(resp), &[], Digests::default());
        assert_eq!(out.len(), 128);
        assert_eq!(out[0], 0x01);
        assert_eq!(out[11], 0x02);
        assert_eq!(&out[12..16], &0x2_0000u32.to_le_bytes(), "MAXH2CDATA at byte 12");
    }

    #[test]
    fn capsule_with_in_capsule_data_and_both_digests() {
        let mut sqe = Sqe::new(io_opcode::WRITE, 5);
        sqe.set_sgl(SglDescriptor::in_capsule(0, 512));
        let data = vec![0xA5u8; 512];
        let mut out = Vec::new();
        let dg = Digests { header: true, data: true };
        encode_pdu(&mut out, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &data, dg);
        let ch = CommonHeader::parse(&out).unwrap();
        assert_eq!(ch.pdu_type, 0x04);
        assert_eq!(ch.hlen, 72);
        assert_eq!(ch.flags, flags::HDGSTF | flags::DDGSTF);
        assert_eq!(ch.pdo, 76, "data starts after the 72-byte header and its digest");
        assert_eq!(ch.plen as usize, 72 + 4 + 512 + 4);
        assert_eq!(out.len(), ch.plen as usize);
        assert_eq!(&out[72..76], &header_digest(&out[..72]).to_le_bytes());
        assert_eq!(&out[588..592], &data_digest(&data).to_le_bytes());
    }

    #[test]
    fn data_pdus_and_r2t_layout() {
        let mut out = Vec::new();
        let c2h = C2HData { cccid: 3, datao: 4096, datal: 8, last: true, success: true };
        encode_pdu(&mut out, &PduHeader::C2HData(c2h), &[1; 8], Digests::default());
        assert_eq!(&out[..4], &[0x07, flags::LAST_PDU | flags::SUCCESS, 24, 24]);
        assert_eq!(&out[12..16], &4096u32.to_le_bytes(), "DATAO at byte 12");
        assert_eq!(&out[16..20], &8u32.to_le_bytes(), "DATAL at byte 16");

        out.clear();
        let r2t = R2T { cccid: 3, ttag: 0x77, r2to: 0, r2tl: 65536 };
        encode_pdu(&mut out, &PduHeader::R2T(r2t), &[], Digests { header: true, data: true });
        assert_eq!(out.len(), 28, "no data, so no data digest; header digest present");
        assert_eq!(&out[..4], &[0x09, flags::HDGSTF, 24, 0]);
        assert_eq!(&out[10..12], &0x77u16.to_le_bytes(), "TTAG at byte 10");
    }

    #[test]
    fn capsule_resp_and_termreq_layout() {
        let mut out = Vec::new();
        let cqe = Cqe::new(9, Status::INVALID_OPCODE);
        encode_pdu(&mut out, &PduHeader::CapsuleResp(CapsuleResp { cqe }), &[], Digests::default());
        assert_eq!(out.len(), 24);
        assert_eq!(&out[20..22], &[9, 0]);

        out.clear();
        let t = TermReq { fes: fes::INVALID_PDU_HDR, fei: 2, header: vec![0xEE; 200] };
        encode_pdu(&mut out, &PduHeader::C2HTermReq(t), &[], Digests { header: true, data: true });
        assert_eq!(out.len(), 24 + 152, "no digests on TermReq, header copy capped at 152");
        assert_eq!(out[1], 0);
        assert_eq!(&out[8..10], &[1, 0]);
        assert_eq!(&out[10..14], &2u32.to_le_bytes());
    }
}
