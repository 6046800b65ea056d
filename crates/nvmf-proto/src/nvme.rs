//! Submission and completion queue entries, SGL descriptors, status codes and opcodes
//! (NVMe Base Specification 2.0, figures 88, 90, 92 and 94).

use crate::le::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};

pub const SQE_LEN: usize = 64;
pub const CQE_LEN: usize = 16;
pub const SGL_DESC_LEN: usize = 16;

/// Admin command opcodes used over fabrics.
pub mod admin_opcode {
    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0A;
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0C;
    pub const KEEP_ALIVE: u8 = 0x18;
    /// Fabrics commands share one opcode on both admin and I/O queues; FCTYPE says which.
    pub const FABRICS: u8 = 0x7F;
}

/// NVM command set I/O opcodes.
pub mod io_opcode {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;
    pub const DATASET_MANAGEMENT: u8 = 0x09;
}

/// Feature identifiers (Set/Get Features CDW10 bits 7:0).
pub mod feature {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MANAGEMENT: u8 = 0x02;
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    pub const INTERRUPT_VECTOR_CONFIG: u8 = 0x09;
    pub const WRITE_ATOMICITY_NORMAL: u8 = 0x0A;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
    pub const TIMESTAMP: u8 = 0x0E;
    pub const KEEP_ALIVE_TIMER: u8 = 0x0F;
    pub const HOST_IDENTIFIER: u8 = 0x81;

    /// Get Features CDW10 bits 10:8 (SEL).
    pub mod sel {
        pub const CURRENT: u8 = 0;
        pub const DEFAULT: u8 = 1;
        pub const SAVED: u8 = 2;
        pub const SUPPORTED_CAPABILITIES: u8 = 3;
    }

    /// Bits of the SEL = supported capabilities result.
    pub mod capability {
        pub const SAVEABLE: u32 = 1 << 0;
        pub const NAMESPACE_SPECIFIC: u32 = 1 << 1;
        pub const CHANGEABLE: u32 = 1 << 2;
    }
}

/// Log page identifiers (Get Log Page CDW10 bits 7:0).
pub mod log_page {
    pub const ERROR_INFO: u8 = 0x01;
    pub const SMART_HEALTH: u8 = 0x02;
    pub const FIRMWARE_SLOT: u8 = 0x03;
    pub const CHANGED_NS_LIST: u8 = 0x04;
    pub const COMMANDS_SUPPORTED: u8 = 0x05;
    pub const DISCOVERY: u8 = 0x70;
}

/// Identify CNS values (CDW10 bits 7:0).
pub mod cns {
    pub const NAMESPACE: u8 = 0x00;
    pub const CONTROLLER: u8 = 0x01;
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    pub const NS_DESCRIPTORS: u8 = 0x03;
}

/// SGL descriptor type byte: type in bits 7:4, subtype in bits 3:0.
pub const SGL_DATA_BLOCK_OFFSET: u8 = 0x01;
pub const SGL_TRANSPORT_DATA_BLOCK: u8 = 0x5A;

/// PSDT value for "SGLs used, metadata contiguous" which NVMe/TCP requires (CDW0 bits 15:14 = 01b).
pub const PSDT_SGL: u8 = 0x01;

/// A Scatter Gather List descriptor as carried in DPTR (SGL1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SglDescriptor {
    pub addr: u64,
    pub length: u32,
    pub sgl_type: u8,
}

impl SglDescriptor {
    pub fn decode(b: &[u8; SGL_DESC_LEN]) -> Self {
        SglDescriptor { addr: u64_at(b, 0), length: u32_at(b, 8), sgl_type: b[15] }
    }

    pub fn encode(&self) -> [u8; SGL_DESC_LEN] {
        let mut b = [0u8; SGL_DESC_LEN];
        put_u64(&mut b, 0, self.addr);
        put_u32(&mut b, 8, self.length);
        b[15] = self.sgl_type;
        b
    }

    /// In-capsule data: the data follows the SQE inside the same CapsuleCmd PDU at `offset`.
    pub fn in_capsule(offset: u64, length: u32) -> Self {
        SglDescriptor { addr: offset, length, sgl_type: SGL_DATA_BLOCK_OFFSET }
    }

    /// Data moved by the transport (C2HData for reads, R2T/H2CData for writes).
    pub fn transport(length: u32) -> Self {
        SglDescriptor { addr: 0, length, sgl_type: SGL_TRANSPORT_DATA_BLOCK }
    }
}

/// A 64-byte submission queue entry, kept as bytes with typed accessors so that a command
/// round-trips exactly and unknown fields survive.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_LEN]);

impl Default for Sqe {
    fn default() -> Self {
        Sqe([0u8; SQE_LEN])
    }
}

impl std::fmt::Debug for Sqe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqe")
            .field("opcode", &format_args!("{:#04x}", self.opcode()))
            .field("cid", &self.cid())
            .field("nsid", &self.nsid())
            .field("sgl", &self.sgl())
            .field("cdw10", &format_args!("{:#x}", self.cdw(10)))
            .finish()
    }
}

impl Sqe {
    pub fn new(opcode: u8, cid: u16) -> Self {
        let mut sqe = Sqe::default();
        sqe.set_opcode(opcode);
        sqe.set_cid(cid);
        sqe.set_psdt(PSDT_SGL);
        sqe
    }

    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        Some(Sqe(b.get(..SQE_LEN)?.try_into().ok()?))
    }

    pub fn opcode(&self) -> u8 {
        self.0[0]
    }
    pub fn set_opcode(&mut self, v: u8) {
        self.0[0] = v;
    }
    /// CDW0 bits 15:8: FUSE (1:0) and PSDT (7:6).
    pub fn flags(&self) -> u8 {
        self.0[1]
    }
    pub fn psdt(&self) -> u8 {
        self.0[1] >> 6
    }
    pub fn set_psdt(&mut self, v: u8) {
        self.0[1] = (self.0[1] & 0x3F) | (v << 6);
    }
    pub fn cid(&self) -> u16 {
        u16_at(&self.0, 2)
    }
    pub fn set_cid(&mut self, v: u16) {
        put_u16(&mut self.0, 2, v);
    }
    pub fn nsid(&self) -> u32 {
        u32_at(&self.0, 4)
    }
    pub fn set_nsid(&mut self, v: u32) {
        put_u32(&mut self.0, 4, v);
    }
    /// Fabrics command type: byte 4 of a Fabrics command (where NSID sits in others).
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }
    pub fn set_fctype(&mut self, v: u8) {
        self.0[4] = v;
    }
    /// Command dword `n` (0..=15).
    pub fn cdw(&self, n: usize) -> u32 {
        u32_at(&self.0, n * 4)
    }
    pub fn set_cdw(&mut self, n: usize, v: u32) {
        put_u32(&mut self.0, n * 4, v);
    }
    pub fn sgl(&self) -> SglDescriptor {
        SglDescriptor::decode(self.0[24..40].try_into().expect("16 bytes"))
    }
    pub fn set_sgl(&mut self, sgl: SglDescriptor) {
        self.0[24..40].copy_from_slice(&sgl.encode());
    }
    /// Starting LBA of a Read/Write/Write Zeroes (CDW10-11).
    pub fn slba(&self) -> u64 {
        u64_at(&self.0, 40)
    }
    pub fn set_slba(&mut self, v: u64) {
        put_u64(&mut self.0, 40, v);
    }
    /// Number of logical blocks, 0's based (CDW12 bits 15:0).
    pub fn nlb(&self) -> u16 {
        u16_at(&self.0, 48)
    }
    pub fn set_nlb(&mut self, v: u16) {
        put_u16(&mut self.0, 48, v);
    }
}

/// Status field of a completion: SCT and SC plus the More and Do Not Retry bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    pub sct: u8,
    pub sc: u8,
    pub more: bool,
    pub dnr: bool,
}

macro_rules! statuses {
    ($($name:ident = ($sct:expr, $sc:expr, $text:expr);)*) => {
        impl Status {
            $(pub const $name: Status = Status { sct: $sct, sc: $sc, more: false, dnr: false };)*

            /// The specification's name for this status, for error messages.
            pub fn name(&self) -> &'static str {
                match (self.sct, self.sc) {
                    $(($sct, $sc) => $text,)*
                    _ => "Unknown Status",
                }
            }
        }
    };
}

statuses! {
    SUCCESS = (0, 0x00, "Successful Completion");
    INVALID_OPCODE = (0, 0x01, "Invalid Command Opcode");
    INVALID_FIELD = (0, 0x02, "Invalid Field in Command");
    CID_CONFLICT = (0, 0x03, "Command ID Conflict");
    DATA_TRANSFER_ERROR = (0, 0x04, "Data Transfer Error");
    INTERNAL_ERROR = (0, 0x06, "Internal Error");
    ABORT_REQUESTED = (0, 0x07, "Command Abort Requested");
    ABORT_SQ_DELETED = (0, 0x08, "Command Aborted due to SQ Deletion");
    INVALID_NS = (0, 0x0B, "Invalid Namespace or Format");
    CMD_SEQ_ERROR = (0, 0x0C, "Command Sequence Error");
    SGL_INVALID_DATA_LEN = (0, 0x0F, "Data SGL Length Invalid");
    SGL_INVALID_TYPE = (0, 0x11, "SGL Descriptor Type Invalid");
    SGL_INVALID_OFFSET = (0, 0x16, "SGL Offset Invalid");
    KEEP_ALIVE_EXPIRED = (0, 0x19, "Keep Alive Timer Expired");
    KEEP_ALIVE_INVALID = (0, 0x1A, "Keep Alive Timeout Invalid");
    TRANSIENT_TRANSPORT_ERROR = (0, 0x22, "Transient Transport Error");
    LBA_OUT_OF_RANGE = (0, 0x80, "LBA Out of Range");
    CAPACITY_EXCEEDED = (0, 0x81, "Capacity Exceeded");
    NS_NOT_READY = (0, 0x82, "Namespace Not Ready");
    INVALID_QUEUE_ID = (1, 0x01, "Invalid Queue Identifier");
    INVALID_QUEUE_SIZE = (1, 0x02, "Invalid Queue Size");
    AER_LIMIT_EXCEEDED = (1, 0x05, "Asynchronous Event Request Limit Exceeded");
    INVALID_LOG_PAGE = (1, 0x09, "Invalid Log Page");
    FEATURE_NOT_SAVEABLE = (1, 0x0D, "Feature Identifier Not Saveable");
    FEATURE_NOT_CHANGEABLE = (1, 0x0E, "Feature Not Changeable");
    CONNECT_INCOMPATIBLE_FORMAT = (1, 0x80, "Connect Incompatible Format");
    CONNECT_CTRL_BUSY = (1, 0x81, "Connect Controller Busy");
    CONNECT_INVALID_PARAM = (1, 0x82, "Connect Invalid Parameters");
    CONNECT_RESTART_DISC = (1, 0x83, "Connect Restart Discovery");
    CONNECT_INVALID_HOST = (1, 0x84, "Connect Invalid Host");
    AUTH_REQUIRED = (1, 0x91, "Authentication Required");
}

impl Status {
    pub fn is_success(&self) -> bool {
        self.sct == 0 && self.sc == 0
    }

    pub fn with_dnr(mut self) -> Self {
        self.dnr = true;
        self
    }

    /// Encodes CQE DW3 bits 31:16 (phase tag bit 0 left clear: fabrics has no phase).
    pub fn to_u16(&self) -> u16 {
        ((self.sc as u16) << 1)
            | (((self.sct & 0x7) as u16) << 9)
            | ((self.more as u16) << 14)
            | ((self.dnr as u16) << 15)
    }

    pub fn from_u16(v: u16) -> Self {
        Status {
            sc: ((v >> 1) & 0xFF) as u8,
            sct: ((v >> 9) & 0x7) as u8,
            more: v & (1 << 14) != 0,
            dnr: v & (1 << 15) != 0,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (SCT {:#x}, SC {:#04x})", self.name(), self.sct, self.sc)
    }
}

/// A 16-byte completion queue entry. `result` is DW0 in the low half and DW1 in the high half
/// (Property Get of an 8-byte property returns it across both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    pub result: u64,
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    pub status: Status,
}

impl Cqe {
    pub fn new(cid: u16, status: Status) -> Self {
        Cqe { cid, status, ..Default::default() }
    }

    pub fn decode(b: &[u8; CQE_LEN]) -> Self {
        Cqe {
            result: u64_at(b, 0),
            sqhd: u16_at(b, 8),
            sqid: u16_at(b, 10),
            cid: u16_at(b, 12),
            status: Status::from_u16(u16_at(b, 14)),
        }
    }

    pub fn encode(&self) -> [u8; CQE_LEN] {
        let mut b = [0u8; CQE_LEN];
        put_u64(&mut b, 0, self.result);
        put_u16(&mut b, 8, self.sqhd);
        put_u16(&mut b, 10, self.sqid);
        put_u16(&mut b, 12, self.cid);
        put_u16(&mut b, 14, self.status.to_u16());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqe_fields_sit_at_spec_offsets() {
        let mut sqe = Sqe::new(io_opcode::READ, 0xBEEF);
        sqe.set_nsid(7);
        sqe.set_slba(0x0102_0304_0506_0708);
        sqe.set_nlb(15);
        sqe.set_sgl(SglDescriptor::transport(8192));
        let b = sqe.0;
        assert_eq!(b[0], 0x02);
        assert_eq!(b[1], 0x40, "PSDT=01b in bits 7:6");
        assert_eq!(&b[2..4], &[0xEF, 0xBE]);
        assert_eq!(&b[4..8], &[7, 0, 0, 0]);
        assert_eq!(&b[32..36], &8192u32.to_le_bytes(), "SGL length at DPTR+8");
        assert_eq!(b[39], 0x5A, "SGL type in the last byte of DPTR");
        assert_eq!(&b[40..48], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&b[48..50], &[15, 0]);
        assert_eq!(Sqe::from_bytes(&b).unwrap(), sqe);
        assert_eq!(sqe.cdw(12), 15);
    }

    #[test]
    fn status_encoding_matches_the_completion_layout() {
        // LBA Out of Range: SC 0x80 -> bits 8:1, SCT 0.
        assert_eq!(Status::LBA_OUT_OF_RANGE.to_u16(), 0x80 << 1);
        // Connect Invalid Host: SCT 1 -> bit 9, SC 0x84 -> bits 8:1; with DNR bit 15.
        let v = Status::CONNECT_INVALID_HOST.with_dnr().to_u16();
        assert_eq!(v, (1 << 15) | (1 << 9) | (0x84 << 1));
        assert_eq!(Status::from_u16(v), Status::CONNECT_INVALID_HOST.with_dnr());
        assert_eq!(Status::from_u16(v).name(), "Connect Invalid Host");
    }

    #[test]
    fn cqe_round_trips_with_fields_at_spec_offsets() {
        let cqe = Cqe {
            result: 0x1122_3344_5566_7788,
            sqhd: 3,
            sqid: 2,
            cid: 9,
            status: Status::INVALID_FIELD.with_dnr(),
        };
        let b = cqe.encode();
        assert_eq!(&b[0..4], &0x5566_7788u32.to_le_bytes(), "DW0");
        assert_eq!(&b[12..14], &[9, 0], "CID in DW3 low half");
        assert_eq!(Cqe::decode(&b), cqe);
    }
}
