//! The NVMe over RDMA transport binding's encodings (Linux's `nvme-rdma.h`), for the target and
//! the host alike: the RDMA CM private data of a connect request, its accept and its reject,
//! and the keyed SGL data block descriptor through which the host names its memory. Nothing
//! here needs an RDMA library.

use crate::nvme::PSDT_SGL;
use crate::Sqe;

/// Length of `struct nvme_rdma_cm_req` (recfmt, qid, hrqsize, hsqsize, cntlid, reserved).
pub const CM_REQ_LEN: usize = 32;
/// Length of `struct nvme_rdma_cm_rep` (recfmt, crqsize, reserved).
pub const CM_REP_LEN: usize = 32;
/// Largest queue a host may ask for: MQES (1023) + 1 entries.
pub const MAX_QUEUE_SIZE: u32 = 1024;

/// SGL descriptor type 4h, Keyed SGL Data Block, subtype 0h (address) or Fh (invalidate key).
pub const SGL_KEYED_DATA_BLOCK: u8 = 0x4;
const SGL_SUBTYPE_ADDRESS: u8 = 0x0;
const SGL_SUBTYPE_INVALIDATE: u8 = 0xF;
/// Largest length a keyed SGL data block carries (24 bits).
pub const KEYED_SGL_MAX_LEN: u32 = (1 << 24) - 1;

/// Reject status codes (`enum nvme_rdma_cm_status`).
pub mod cm_status {
    pub const INVALID_LEN: u16 = 0x01;
    pub const INVALID_RECFMT: u16 = 0x02;
    pub const INVALID_QID: u16 = 0x03;
    pub const INVALID_HSQSIZE: u16 = 0x04;
    pub const INVALID_HRQSIZE: u16 = 0x05;
    pub const NO_RESOURCES: u16 = 0x06;
    pub const INVALID_IRD: u16 = 0x07;
    pub const INVALID_ORD: u16 = 0x08;

    /// The status's name in the binding, for messages.
    pub fn name(status: u16) -> &'static str {
        match status {
            INVALID_LEN => "invalid private data length",
            INVALID_RECFMT => "invalid record format",
            INVALID_QID => "invalid queue ID",
            INVALID_HSQSIZE => "invalid host send queue size",
            INVALID_HRQSIZE => "invalid host receive queue size",
            NO_RESOURCES => "no resources",
            INVALID_IRD => "invalid IRD",
            INVALID_ORD => "invalid ORD",
            _ => "unknown status",
        }
    }
}

fn u16_at(data: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([data[o], data[o + 1]])
}

/// A connect request's private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmRequest {
    pub qid: u16,
    /// Host receive queue size: responses the host can take at once.
    pub hrqsize: u16,
    /// Host send queue size, 0's based (the Connect command's SQSIZE).
    pub hsqsize: u16,
    pub cntlid: u16,
}

impl CmRequest {
    /// Parses and checks the private data; `Err` holds the reject status.
    pub fn parse(data: &[u8]) -> Result<CmRequest, u16> {
        if data.len() < CM_REQ_LEN {
            return Err(cm_status::INVALID_LEN);
        }
        if u16_at(data, 0) != 0 {
            return Err(cm_status::INVALID_RECFMT);
        }
        let req = CmRequest { qid: u16_at(data, 2), hrqsize: u16_at(data, 4), hsqsize: u16_at(data, 6), cntlid: u16_at(data, 8) };
        if req.qid == u16::MAX {
            return Err(cm_status::INVALID_QID);
        }
        if req.hsqsize == 0 || req.hsqsize as u32 + 1 > MAX_QUEUE_SIZE {
            return Err(cm_status::INVALID_HSQSIZE);
        }
        if req.hrqsize == 0 || req.hrqsize as u32 > MAX_QUEUE_SIZE {
            return Err(cm_status::INVALID_HRQSIZE);
        }
        Ok(req)
    }

    /// Commands the host may have outstanding: the controller's receive queue's depth.
    pub fn depth(&self) -> u32 {
        self.hsqsize as u32 + 1
    }

    /// Record format 0 and the fields, little endian.
    pub fn encode(&self) -> [u8; CM_REQ_LEN] {
        let mut b = [0u8; CM_REQ_LEN];
        for (o, v) in [(2, self.qid), (4, self.hrqsize), (6, self.hsqsize), (8, self.cntlid)] {
            b[o..o + 2].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
}

/// The accept's private data: record format 0 and the controller's receive queue size.
pub fn cm_reply(crqsize: u16) -> [u8; CM_REP_LEN] {
    let mut b = [0u8; CM_REP_LEN];
    b[2..4].copy_from_slice(&crqsize.to_le_bytes());
    b
}

/// CRQSIZE of an accept's private data (the host's side of [`cm_reply`]). Some controllers
/// send none: `None` then, and the host relies on HSQSIZE.
pub fn parse_cm_reply(data: &[u8]) -> Option<u16> {
    (data.len() >= 4 && u16_at(data, 0) == 0).then(|| u16_at(data, 2))
}

/// The reject's private data (`struct nvme_rdma_cm_rej`): record format 0 and the status.
pub fn cm_reject(status: u16) -> [u8; 4] {
    let mut b = [0u8; 4];
    b[2..4].copy_from_slice(&status.to_le_bytes());
    b
}

/// The status of a reject's private data (the host's side of [`cm_reject`]), if it has one.
pub fn parse_cm_reject(data: &[u8]) -> Option<u16> {
    (data.len() >= 4 && u16_at(data, 0) == 0).then(|| u16_at(data, 2))
}

/// A keyed SGL data block descriptor: host memory at `addr`, `len` bytes, remote key `key`;
/// `invalidate`: the host asks the controller to invalidate the key with the response (SEND
/// with Invalidate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyedSgl {
    pub addr: u64,
    pub len: u32,
    pub key: u32,
    pub invalidate: bool,
}

impl KeyedSgl {
    /// The 16 descriptor bytes: address 8, length 3 (24 bits), key 4, type and subtype 1.
    /// `None` when `len` does not fit 24 bits.
    pub fn encode(&self) -> Option<[u8; 16]> {
        if self.len > KEYED_SGL_MAX_LEN {
            return None;
        }
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&self.addr.to_le_bytes());
        d[8..11].copy_from_slice(&self.len.to_le_bytes()[..3]);
        d[11..15].copy_from_slice(&self.key.to_le_bytes());
        let subtype = if self.invalidate { SGL_SUBTYPE_INVALIDATE } else { SGL_SUBTYPE_ADDRESS };
        d[15] = SGL_KEYED_DATA_BLOCK << 4 | subtype;
        Some(d)
    }

    /// Puts the descriptor into `sqe`'s DPTR (SGL1) and marks the SQE's PSDT as SGL.
    pub fn set_in(&self, sqe: &mut Sqe) -> Option<()> {
        let d = self.encode()?;
        // Raw bytes: SglDescriptor (address, 32-bit length, type) cannot hold the keyed layout.
        sqe.set_psdt(PSDT_SGL);
        sqe.0[24..40].copy_from_slice(&d);
        Some(())
    }
}

/// The keyed SGL of an SQE's DPTR, if SGL1 is one (bytes 24..40: address 8 bytes, length 3,
/// key 4, type 1).
pub fn keyed_sgl(sqe: &Sqe) -> Option<KeyedSgl> {
    let d = &sqe.0[24..40];
    let (kind, subtype) = (d[15] >> 4, d[15] & 0xF);
    if kind != SGL_KEYED_DATA_BLOCK || !matches!(subtype, SGL_SUBTYPE_ADDRESS | SGL_SUBTYPE_INVALIDATE) {
        return None;
    }
    Some(KeyedSgl {
        addr: u64::from_le_bytes(d[0..8].try_into().expect("8 bytes")),
        len: u32::from_le_bytes([d[8], d[9], d[10], 0]),
        key: u32::from_le_bytes(d[11..15].try_into().expect("4 bytes")),
        invalidate: subtype == SGL_SUBTYPE_INVALIDATE,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(recfmt: u16, qid: u16, hrqsize: u16, hsqsize: u16) -> Vec<u8> {
        let mut b = CmRequest { qid, hrqsize, hsqsize, cntlid: 0xFFFF }.encode().to_vec();
        b[0..2].copy_from_slice(&recfmt.to_le_bytes());
        b
    }

    #[test]
    fn connect_request_private_data_round_trips_and_is_checked() {
        let enc = CmRequest { qid: 3, hrqsize: 128, hsqsize: 127, cntlid: 0x1234 }.encode();
        assert_eq!(&enc[..10], &[0, 0, 3, 0, 128, 0, 127, 0, 0x34, 0x12], "recfmt 0, then LE fields");
        assert!(enc[10..].iter().all(|b| *b == 0), "reserved bytes are zero");
        let r = CmRequest::parse(&req(0, 3, 128, 127)).unwrap();
        assert_eq!(r, CmRequest { qid: 3, hrqsize: 128, hsqsize: 127, cntlid: 0xFFFF });
        assert_eq!(r.depth(), 128);
        assert_eq!(CmRequest::parse(&req(0, 3, 128, 127)[..31]), Err(cm_status::INVALID_LEN));
        assert_eq!(CmRequest::parse(&req(1, 3, 128, 127)), Err(cm_status::INVALID_RECFMT));
        assert_eq!(CmRequest::parse(&req(0, 0xFFFF, 128, 127)), Err(cm_status::INVALID_QID));
        assert_eq!(CmRequest::parse(&req(0, 1, 128, 0)), Err(cm_status::INVALID_HSQSIZE));
        assert_eq!(CmRequest::parse(&req(0, 1, 128, 1024)), Err(cm_status::INVALID_HSQSIZE));
        assert_eq!(CmRequest::parse(&req(0, 1, 0, 31)), Err(cm_status::INVALID_HRQSIZE));
        assert_eq!(CmRequest::parse(&req(0, 1, 1025, 31)), Err(cm_status::INVALID_HRQSIZE));
        assert!(CmRequest::parse(&req(0, 0, 1024, 1023)).is_ok());
    }

    #[test]
    fn accept_and_reject_carry_record_format_zero_and_parse_back() {
        let rep = cm_reply(128);
        assert_eq!(&rep[..4], &[0, 0, 128, 0]);
        assert_eq!(parse_cm_reply(&rep), Some(128));
        assert_eq!(parse_cm_reply(&[]), None, "no private data");
        assert_eq!(parse_cm_reply(&[1, 0, 128, 0]), None, "another record format");
        assert_eq!(cm_reject(cm_status::INVALID_HSQSIZE), [0, 0, 4, 0]);
        assert_eq!(parse_cm_reject(&cm_reject(cm_status::NO_RESOURCES)), Some(cm_status::NO_RESOURCES));
        assert_eq!(parse_cm_reject(&[0, 0, 6]), None, "short");
        assert_eq!(cm_status::name(cm_status::INVALID_HRQSIZE), "invalid host receive queue size");
    }

    #[test]
    fn keyed_sgl_encodes_its_24_bit_length_and_key_and_parses_back() {
        let k = KeyedSgl { addr: 0x1122_3344_5566_7788, len: 1 << 20, key: 0xAABB_CCDD, invalidate: false };
        let d = k.encode().unwrap();
        assert_eq!(&d[8..11], &[0x00, 0x00, 0x10], "1 MiB in 24 bits");
        assert_eq!(&d[11..15], &0xAABB_CCDDu32.to_le_bytes());
        assert_eq!(d[15], 0x40, "type 4h, subtype 0h");
        let mut sqe = Sqe::new(0x02, 9);
        k.set_in(&mut sqe).unwrap();
        assert_eq!(sqe.0[1] >> 6, 0b01, "PSDT: SGL");
        assert_eq!(keyed_sgl(&sqe), Some(k));
        let inv = KeyedSgl { invalidate: true, ..k };
        assert_eq!(inv.encode().unwrap()[15], 0x4F);
        assert!(KeyedSgl { len: 1 << 24, ..k }.encode().is_none(), "16 MiB does not fit 24 bits");
        assert_eq!(KeyedSgl { len: KEYED_SGL_MAX_LEN, ..k }.encode().unwrap()[8..11], [0xFF; 3]);
    }
}
