//! Splits a received byte stream into validated PDUs.
//!
//! The framer checks everything the transport specification lets a receiver check from the
//! header alone: the type is known and allowed in this direction, HLEN is the type's, PLEN and
//! PDO are consistent, the digest flags match what was negotiated, the header digest is right
//! and the data fits the negotiated limit. Any violation is a [`FatalError`] carrying the FES and
//! FEI for the TermReq the caller must send before closing the connection.

use std::ops::Range;

use crate::digest::{data_digest, header_digest};
use crate::pdu::{fes, flags, CommonHeader, Digests, PduHeader, PduType, COMMON_HEADER_LEN, DIGEST_LEN, TERM_REQ_MAX_HEADER};

/// Which end of the connection is receiving: decides which PDU types are acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The controller side: receives host-to-controller PDUs.
    Target,
    /// The host side: receives controller-to-host PDUs.
    Host,
}

/// A protocol error that ends the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("fatal NVMe/TCP error: FES {fes:#x}, FEI {fei}")]
pub struct FatalError {
    pub fes: u16,
    pub fei: u32,
    /// How many bytes of the offending header the TermReq should echo (at most 152).
    pub hlen: usize,
}

/// Byte offsets of common-header fields, reported as FEI for an invalid header field.
mod field {
    pub const PDU_TYPE: u32 = 0;
    pub const FLAGS: u32 = 1;
    pub const HLEN: u32 = 2;
    pub const PDO: u32 = 3;
    pub const PLEN: u32 = 4;
}

/// One complete PDU at the front of the receive buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub header: PduHeader,
    pub flags: u8,
    /// Length of the whole PDU (PLEN): consume this many bytes.
    pub len: usize,
    /// Where the PDU's data lies in the buffer passed to [`Framer::next`] (empty if none).
    pub data: Range<usize>,
    /// False only when a data digest was negotiated, present, and wrong.
    pub data_digest_ok: bool,
}

/// The validated header of a PDU whose data may not have arrived yet ([`Framer::next_header`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameHeader {
    pub header: PduHeader,
    pub flags: u8,
    /// Length of the whole PDU (PLEN).
    pub len: usize,
    /// Where the PDU's data lies, counted from the PDU's first byte (empty if none).
    pub data: Range<usize>,
    /// True when a data digest follows the data (at `data.end`).
    pub data_digest: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framer {
    pub role: Role,
    pub digests: Digests,
    /// Largest data payload accepted in one PDU (in-capsule size or MAXH2CDATA on a target,
    /// the largest C2HData expected on a host).
    pub max_data_len: u32,
}

fn fatal(fes: u16, fei: u32, hlen: usize) -> FatalError {
    FatalError { fes, fei, hlen: hlen.min(TERM_REQ_MAX_HEADER) }
}

impl Framer {
    /// Before ICReq/ICResp completes: no digests.
    pub fn new(role: Role, max_data_len: u32) -> Self {
        Framer { role, digests: Digests::default(), max_data_len }
    }

    /// The largest PDU this framer can accept: a receive buffer this big never deadlocks.
    pub fn max_pdu_len(&self) -> usize {
        // Largest header (ICReq) or data header + PDO padding (PDO is one byte) + two digests.
        (u8::MAX as usize) + 2 * DIGEST_LEN + self.max_data_len as usize
    }

    fn accepts(&self, ty: PduType) -> bool {
        match self.role {
            Role::Target => matches!(
                ty,
                PduType::IcReq | PduType::H2CTermReq | PduType::CapsuleCmd | PduType::H2CData
            ),
            Role::Host => matches!(
                ty,
                PduType::IcResp | PduType::C2HTermReq | PduType::CapsuleResp | PduType::C2HData | PduType::R2T
            ),
        }
    }

    /// Looks at the front of `buf`. `Ok(None)`: not a whole PDU yet. Never panics.
    pub fn next(&self, buf: &[u8]) -> Result<Option<Frame>, FatalError> {
        let Some(h) = self.next_header(buf)? else { return Ok(None) };
        if buf.len() < h.len {
            return Ok(None);
        }
        let data_digest_ok = if h.data_digest && !h.data.is_empty() {
            let got = u32::from_le_bytes(buf[h.data.end..h.data.end + DIGEST_LEN].try_into().expect("4 bytes"));
            data_digest(&buf[h.data.clone()]) == got
        } else {
            true
        };
        Ok(Some(Frame { header: h.header, flags: h.flags, len: h.len, data: h.data, data_digest_ok }))
    }

    /// Like [`Framer::next`], but for a PDU with data it needs only the bytes before the data
    /// (header, header digest, padding): the caller may then receive the data (and the data
    /// digest, [`FrameHeader::data_digest`]) wherever it belongs. PDUs without data, TermReqs
    /// included, still need all their bytes. Never panics.
    pub fn next_header(&self, buf: &[u8]) -> Result<Option<FrameHeader>, FatalError> {
        let Some(ch) = CommonHeader::parse(buf) else { return Ok(None) };
        let echo = (ch.hlen as usize).clamp(COMMON_HEADER_LEN, TERM_REQ_MAX_HEADER).min(buf.len());
        let ty = match PduType::from_u8(ch.pdu_type) {
            Some(ty) if self.accepts(ty) => ty,
            _ => return Err(fatal(fes::INVALID_PDU_HDR, field::PDU_TYPE, echo)),
        };
        let hlen = ty.hlen() as usize;
        if ch.hlen as usize != hlen {
            return Err(fatal(fes::INVALID_PDU_HDR, field::HLEN, echo));
        }

        let hdgst = self.digests.header && ty.has_header_digest();
        if (ch.flags & flags::HDGSTF != 0) != hdgst {
            return Err(fatal(fes::INVALID_PDU_HDR, field::FLAGS, echo));
        }
        let ddgst_flag = ch.flags & flags::DDGSTF != 0;
        if ddgst_flag && !(self.digests.data && ty.may_carry_data()) {
            return Err(fatal(fes::INVALID_PDU_HDR, field::FLAGS, echo));
        }

        let header_end = hlen + if hdgst { DIGEST_LEN } else { 0 };
        let plen = ch.plen as usize;
        let data = self.data_range(ty, &ch, header_end, ddgst_flag, echo)?;
        if data.len() > self.max_data_len as usize {
            return Err(fatal(fes::DATA_LIMIT_EXCEEDED, 0, echo));
        }

        let needed = if data.is_empty() { plen } else { data.start };
        if buf.len() < needed {
            return Ok(None);
        }
        if hdgst {
            let want = header_digest(&buf[..hlen]);
            let got = u32::from_le_bytes(buf[hlen..hlen + DIGEST_LEN].try_into().expect("4 bytes"));
            if want != got {
                return Err(fatal(fes::HDR_DIGEST_ERR, 0, echo));
            }
        }
        let mut header = PduHeader::parse_specific(ty, ch.flags, &buf[..hlen]);
        if let PduHeader::H2CTermReq(t) | PduHeader::C2HTermReq(t) = &mut header {
            t.header = buf[hlen..plen].to_vec();
        }
        let data_digest = ddgst_flag && !data.is_empty();
        Ok(Some(FrameHeader { header, flags: ch.flags, len: plen, data, data_digest }))
    }

    /// Checks PLEN and PDO against the type and returns where the data lies.
    fn data_range(
        &self,
        ty: PduType,
        ch: &CommonHeader,
        header_end: usize,
        ddgst_flag: bool,
        echo: usize,
    ) -> Result<Range<usize>, FatalError> {
        let plen = ch.plen as usize;
        let bad_plen = || fatal(fes::INVALID_PDU_HDR, field::PLEN, echo);
        match ty {
            PduType::IcReq | PduType::IcResp => {
                if plen != header_end {
                    return Err(bad_plen());
                }
                Ok(0..0)
            }
            PduType::H2CTermReq | PduType::C2HTermReq => {
                if plen < header_end || plen > header_end + TERM_REQ_MAX_HEADER {
                    return Err(bad_plen());
                }
                Ok(0..0)
            }
            PduType::CapsuleResp | PduType::R2T => {
                if plen != header_end {
                    return Err(bad_plen());
                }
                Ok(0..0)
            }
            PduType::CapsuleCmd | PduType::H2CData | PduType::C2HData => {
                if plen < header_end {
                    return Err(bad_plen());
                }
                if plen == header_end {
                    // No data. A data PDU must carry data; a capsule need not.
                    if ty != PduType::CapsuleCmd || ddgst_flag {
                        return Err(bad_plen());
                    }
                    return Ok(0..0);
                }
                let pdo = ch.pdo as usize;
                let digest = if ddgst_flag { DIGEST_LEN } else { 0 };
                if self.digests.data && !ddgst_flag {
                    return Err(fatal(fes::INVALID_PDU_HDR, field::FLAGS, echo));
                }
                // Data must start after the header (and its digest) and be non-empty.
                let end = plen.saturating_sub(digest);
                if pdo < header_end || pdo >= end {
                    return Err(fatal(fes::INVALID_PDU_HDR, field::PDO, echo));
                }
                Ok(pdo..end)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nvme::{io_opcode, Cqe, SglDescriptor, Sqe, Status};
    use crate::pdu::{encode_pdu, CapsuleCmd, CapsuleResp, H2CData, IcReq, R2T};

    fn target(dg: Digests) -> Framer {
        Framer { role: Role::Target, digests: dg, max_data_len: 65536 }
    }

    fn capsule(data: &[u8], dg: Digests) -> Vec<u8> {
        let mut sqe = Sqe::new(io_opcode::WRITE, 1);
        sqe.set_sgl(SglDescriptor::in_capsule(0, data.len() as u32));
        let mut out = Vec::new();
        encode_pdu(&mut out, &PduHeader::CapsuleCmd(CapsuleCmd { sqe }), data, dg);
        out
    }

    #[test]
    fn decodes_what_the_encoder_wrote_for_every_digest_setting() {
        for dg in [
            Digests::default(),
            Digests { header: true, data: false },
            Digests { header: false, data: true },
            Digests { header: true, data: true },
        ] {
            let data: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
            let bytes = capsule(&data, dg);
            let f = target(dg).next(&bytes).unwrap().unwrap();
            assert_eq!(f.len, bytes.len());
            assert_eq!(&bytes[f.data.clone()], &data[..]);
            assert!(f.data_digest_ok);
            assert!(matches!(f.header, PduHeader::CapsuleCmd(_)));
        }
    }

    #[test]
    fn header_is_ready_before_the_data_arrives() {
        let dg = Digests { header: true, data: true };
        let bytes = capsule(&[7u8; 100], dg);
        let whole = target(dg).next(&bytes).unwrap().unwrap();
        for cut in 0..bytes.len() {
            let h = target(dg).next_header(&bytes[..cut]).unwrap();
            assert_eq!(h.is_some(), cut >= whole.data.start, "cut at {cut}");
            if let Some(h) = h {
                assert_eq!((h.len, h.data.clone(), h.data_digest), (whole.len, whole.data.clone(), true));
            }
        }
        let mut bad = bytes.clone();
        bad[70] ^= 1; // inside the header digest's range: refused before any data
        assert_eq!(target(dg).next_header(&bad[..whole.data.start]).unwrap_err().fes, fes::HDR_DIGEST_ERR);
    }

    #[test]
    fn waits_for_the_whole_pdu() {
        let bytes = capsule(&[7u8; 100], Digests::default());
        for cut in 0..bytes.len() {
            assert_eq!(target(Digests::default()).next(&bytes[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn rejects_unknown_and_wrong_direction_types() {
        let mut bytes = capsule(&[], Digests::default());
        bytes[0] = 0x08;
        assert_eq!(target(Digests::default()).next(&bytes).unwrap_err().fes, fes::INVALID_PDU_HDR);
        let mut resp = Vec::new();
        encode_pdu(&mut resp, &PduHeader::CapsuleResp(CapsuleResp { cqe: Cqe::new(1, Status::SUCCESS) }), &[], Digests::default());
        let err = target(Digests::default()).next(&resp).unwrap_err();
        assert_eq!((err.fes, err.fei), (fes::INVALID_PDU_HDR, 0));
    }

    #[test]
    fn rejects_bad_hlen_and_plen() {
        let mut bytes = capsule(&[], Digests::default());
        bytes[2] = 70;
        let err = target(Digests::default()).next(&bytes).unwrap_err();
        assert_eq!((err.fes, err.fei), (fes::INVALID_PDU_HDR, 2));

        let mut bytes = capsule(&[], Digests::default());
        bytes[4..8].copy_from_slice(&10u32.to_le_bytes());
        let err = target(Digests::default()).next(&bytes).unwrap_err();
        assert_eq!((err.fes, err.fei), (fes::INVALID_PDU_HDR, 4), "plen smaller than hlen");

        let mut icreq = Vec::new();
        encode_pdu(&mut icreq, &PduHeader::IcReq(IcReq { pfv: 0, hpda: 0, hdgst: false, ddgst: false, maxr2t: 0 }), &[], Digests::default());
        icreq[4..8].copy_from_slice(&200u32.to_le_bytes());
        assert_eq!(target(Digests::default()).next(&icreq).unwrap_err().fei, 4);
    }

    #[test]
    fn checks_digests() {
        let dg = Digests { header: true, data: true };
        let mut bytes = capsule(&[1u8; 64], dg);
        bytes[72] ^= 0xFF;
        assert_eq!(target(dg).next(&bytes).unwrap_err().fes, fes::HDR_DIGEST_ERR);

        let mut bytes = capsule(&[1u8; 64], dg);
        let n = bytes.len();
        bytes[n - 1] ^= 0xFF;
        assert!(!target(dg).next(&bytes).unwrap().unwrap().data_digest_ok);

        // A header digest the host did not negotiate is an invalid FLAGS field.
        let bytes = capsule(&[1u8; 64], Digests { header: true, data: false });
        let err = target(Digests::default()).next(&bytes).unwrap_err();
        assert_eq!((err.fes, err.fei), (fes::INVALID_PDU_HDR, 1));
    }

    #[test]
    fn enforces_the_data_limit_before_buffering() {
        let mut out = Vec::new();
        let h2c = H2CData { cccid: 1, ttag: 1, datao: 0, datal: 70000, last: true };
        crate::pdu::encode_pdu_header(&mut out, &PduHeader::H2CData(h2c), 70000, Digests::default());
        let err = target(Digests::default()).next(&out).unwrap_err();
        assert_eq!(err.fes, fes::DATA_LIMIT_EXCEEDED);
    }

    #[test]
    fn host_accepts_r2t_and_rejects_a_pdo_inside_the_header() {
        let host = Framer { role: Role::Host, digests: Digests::default(), max_data_len: 1 << 20 };
        let mut out = Vec::new();
        encode_pdu(&mut out, &PduHeader::R2T(R2T { cccid: 4, ttag: 2, r2to: 0, r2tl: 8192 }), &[], Digests::default());
        assert!(matches!(host.next(&out).unwrap().unwrap().header, PduHeader::R2T(r) if r.r2tl == 8192));

        let c2h = crate::pdu::C2HData { cccid: 1, datao: 0, datal: 16, last: true, success: false };
        let mut out = Vec::new();
        encode_pdu(&mut out, &PduHeader::C2HData(c2h), &[0; 16], Digests::default());
        out[3] = 10;
        assert_eq!(host.next(&out).unwrap_err().fei, 3);
    }
}
