//! Fabrics commands (NVMe over Fabrics 1.1, section 3): Connect, Property Get/Set, Disconnect,
//! and the controller properties they act on.

use crate::le::{put_u16, put_u32, put_u64, str_at, u16_at, u32_at, u64_at};
use crate::nvme::{admin_opcode, Sqe};
use crate::DecodeError;

pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
pub const NQN_MAX_LEN: usize = 223;
pub const CONNECT_DATA_LEN: usize = 1024;
/// CNTLID a host puts in Connect data to ask for any controller (dynamic controller model).
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;

pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTH_SEND: u8 = 0x05;
    pub const AUTH_RECV: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}

/// Property offsets.
pub mod reg {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1C;
    pub const NSSR: u32 = 0x20;
}

fn fabrics_sqe(fctype: u8, cid: u16) -> Sqe {
    let mut sqe = Sqe::new(admin_opcode::FABRICS, cid);
    sqe.set_fctype(fctype);
    sqe
}

/// Connect CATTR bit 2: the host disables SQ flow control (it ignores SQHD).
pub const CATTR_DISABLE_SQFLOW: u8 = 1 << 2;

/// Connect command fields (SQE bytes 40..52).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectCmd {
    pub recfmt: u16,
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    pub cattr: u8,
    /// Keep alive timeout in milliseconds (admin queue only).
    pub kato: u32,
}

impl ConnectCmd {
    pub fn from_sqe(sqe: &Sqe) -> Self {
        let b = &sqe.0;
        ConnectCmd { recfmt: u16_at(b, 40), qid: u16_at(b, 42), sqsize: u16_at(b, 44), cattr: b[46], kato: u32_at(b, 48) }
    }

    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut sqe = fabrics_sqe(fctype::CONNECT, cid);
        put_u16(&mut sqe.0, 40, self.recfmt);
        put_u16(&mut sqe.0, 42, self.qid);
        put_u16(&mut sqe.0, 44, self.sqsize);
        sqe.0[46] = self.cattr;
        put_u32(&mut sqe.0, 48, self.kato);
        sqe
    }
}

/// The 1024-byte data of a Connect command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    pub hostid: [u8; 16],
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

impl ConnectData {
    pub fn decode(b: &[u8]) -> Result<Self, DecodeError> {
        if b.len() < CONNECT_DATA_LEN {
            return Err(DecodeError::Short { what: "connect data", need: CONNECT_DATA_LEN, got: b.len() });
        }
        Ok(ConnectData {
            hostid: b[0..16].try_into().expect("16 bytes"),
            cntlid: u16_at(b, 16),
            subnqn: str_at(b, 256, 256),
            hostnqn: str_at(b, 512, 256),
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; CONNECT_DATA_LEN];
        b[0..16].copy_from_slice(&self.hostid);
        put_u16(&mut b, 16, self.cntlid);
        crate::le::put_str(&mut b, 256, 256, &self.subnqn, 0);
        crate::le::put_str(&mut b, 512, 256, &self.hostnqn, 0);
        b
    }
}

/// Property Get: ATTRIB bits 2:0 = 1 for an 8-byte property.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertyGet {
    pub size8: bool,
    pub offset: u32,
}

impl PropertyGet {
    pub fn from_sqe(sqe: &Sqe) -> Self {
        PropertyGet { size8: sqe.0[40] & 0x7 == 1, offset: u32_at(&sqe.0, 44) }
    }

    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut sqe = fabrics_sqe(fctype::PROPERTY_GET, cid);
        sqe.0[40] = self.size8 as u8;
        put_u32(&mut sqe.0, 44, self.offset);
        sqe
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertySet {
    pub size8: bool,
    pub offset: u32,
    pub value: u64,
}

impl PropertySet {
    pub fn from_sqe(sqe: &Sqe) -> Self {
        PropertySet { size8: sqe.0[40] & 0x7 == 1, offset: u32_at(&sqe.0, 44), value: u64_at(&sqe.0, 48) }
    }

    pub fn to_sqe(&self, cid: u16) -> Sqe {
        let mut sqe = fabrics_sqe(fctype::PROPERTY_SET, cid);
        sqe.0[40] = self.size8 as u8;
        put_u32(&mut sqe.0, 44, self.offset);
        put_u64(&mut sqe.0, 48, self.value);
        sqe
    }
}

pub fn disconnect_sqe(cid: u16) -> Sqe {
    fabrics_sqe(fctype::DISCONNECT, cid)
}

/// Controller Capabilities fields that fabrics controllers report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// Maximum queue entries supported, 0's based.
    pub mqes: u16,
    /// Worst-case time to become ready, in 500 ms units.
    pub to: u8,
    /// NVM command set supported (CSS bit 0).
    pub css_nvm: bool,
}

impl Cap {
    pub fn to_u64(&self) -> u64 {
        (self.mqes as u64)
            | (1 << 16) // CQR: queues must be physically contiguous (always set over fabrics)
            | ((self.to as u64) << 24)
            | ((self.css_nvm as u64) << 37)
    }

    pub fn from_u64(v: u64) -> Self {
        Cap { mqes: v as u16, to: (v >> 24) as u8, css_nvm: v & (1 << 37) != 0 }
    }
}

/// Controller Configuration bits that matter over fabrics.
pub mod cc {
    pub const EN: u32 = 1 << 0;
    pub const SHN_SHIFT: u32 = 14;
    pub const SHN_MASK: u32 = 0x3 << SHN_SHIFT;
    pub const SHN_NORMAL: u32 = 1 << SHN_SHIFT;
    pub const SHN_ABRUPT: u32 = 2 << SHN_SHIFT;
    /// I/O SQ entry size 2^6 = 64 and CQ entry size 2^4 = 16, the only sizes fabrics allow.
    pub const IOSQES_64: u32 = 6 << 16;
    pub const IOCQES_16: u32 = 4 << 20;
}

/// Controller Status bits.
pub mod csts {
    pub const RDY: u32 = 1 << 0;
    pub const CFS: u32 = 1 << 1;
    pub const SHST_MASK: u32 = 0x3 << 2;
    pub const SHST_OCCURRING: u32 = 1 << 2;
    pub const SHST_COMPLETE: u32 = 2 << 2;
}

/// Version register value for NVMe `major.minor.tertiary`.
pub const fn nvme_version(major: u16, minor: u8, tertiary: u8) -> u32 {
    ((major as u32) << 16) | ((minor as u32) << 8) | tertiary as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_command_layout() {
        let sqe = ConnectCmd { recfmt: 0, qid: 3, sqsize: 127, cattr: 0, kato: 0 }.to_sqe(11);
        assert_eq!(sqe.opcode(), 0x7F);
        assert_eq!(sqe.fctype(), 0x01, "FCTYPE at byte 4");
        assert_eq!(&sqe.0[42..44], &[3, 0], "QID at byte 42");
        assert_eq!(&sqe.0[44..46], &[127, 0], "SQSIZE at byte 44");
        assert_eq!(ConnectCmd::from_sqe(&sqe).qid, 3);
    }

    #[test]
    fn connect_data_layout() {
        let d = ConnectData {
            hostid: [0xAB; 16],
            cntlid: CNTLID_DYNAMIC,
            subnqn: "nqn.2024-01.io.nvmflab:a".into(),
            hostnqn: "nqn.2014-08.org.nvmexpress:uuid:1".into(),
        };
        let b = d.encode();
        assert_eq!(b.len(), 1024);
        assert_eq!(&b[16..18], &[0xFF, 0xFF]);
        assert_eq!(&b[256..260], b"nqn.");
        assert_eq!(b[256 + d.subnqn.len()], 0, "NUL padded");
        assert_eq!(&b[512..516], b"nqn.");
        assert_eq!(ConnectData::decode(&b).unwrap(), d);
        assert!(ConnectData::decode(&b[..1000]).is_err());
    }

    #[test]
    fn property_commands_and_registers() {
        let sqe = PropertySet { size8: false, offset: reg::CC, value: 0x460001 }.to_sqe(2);
        assert_eq!(sqe.fctype(), 0x00);
        assert_eq!(&sqe.0[44..48], &0x14u32.to_le_bytes());
        assert_eq!(PropertySet::from_sqe(&sqe).value, 0x460001);
        let get = PropertyGet::from_sqe(&PropertyGet { size8: true, offset: reg::CAP }.to_sqe(1));
        assert!(get.size8);
        let cap = Cap { mqes: 127, to: 30, css_nvm: true };
        assert_eq!(cap.to_u64() & 0xFFFF, 127);
        assert_eq!(Cap::from_u64(cap.to_u64()), cap);
        assert_eq!(nvme_version(1, 3, 0), 0x0001_0300);
    }
}
