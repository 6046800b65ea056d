//! What a host queue pair carries, whatever the transport: a command's data movement
//! ([`Xfer`]), its outcome ([`Completion`]) and its name in error messages. The NVMe/TCP machine
//! ([`crate::machine`]) and the NVMe/RDMA queue ([`crate::rdma`]) both speak in these.

use nvmf_proto::nvme::io_opcode;

use crate::error::Result;

/// Data movement of one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Xfer {
    None,
    /// Controller to host (C2HData) into the slot buffer.
    Read(usize),
    /// Host to controller from the slot buffer: in the capsule when it fits, else by R2T.
    Write(usize),
    /// Host to controller, always in the capsule (Fabrics Connect data).
    WriteInCapsule(usize),
}

/// One finished command: `Ok` carries CQE DW0 (low half) and DW1.
#[derive(Debug)]
pub struct Completion {
    pub tag: u16,
    pub result: Result<u64>,
}

/// Readable name of a command for error messages.
pub fn command_name(opcode: u8, fctype: u8, qid: u16) -> &'static str {
    use nvmf_proto::fabrics::fctype as f;
    use nvmf_proto::nvme::admin_opcode as a;
    if opcode == a::FABRICS {
        return match fctype {
            f::CONNECT => "Connect",
            f::PROPERTY_GET => "Property Get",
            f::PROPERTY_SET => "Property Set",
            f::DISCONNECT => "Disconnect",
            f::AUTH_SEND => "AUTH_Send",
            f::AUTH_RECV => "AUTH_Receive",
            _ => "Fabrics command",
        };
    }
    if qid == 0 {
        match opcode {
            a::GET_LOG_PAGE => "Get Log Page",
            a::IDENTIFY => "Identify",
            a::SET_FEATURES => "Set Features",
            a::GET_FEATURES => "Get Features",
            a::KEEP_ALIVE => "Keep Alive",
            a::ASYNC_EVENT_REQUEST => "Asynchronous Event Request",
            _ => "Admin command",
        }
    } else {
        match opcode {
            io_opcode::READ => "Read",
            io_opcode::WRITE => "Write",
            io_opcode::FLUSH => "Flush",
            io_opcode::WRITE_ZEROES => "Write Zeroes",
            io_opcode::DATASET_MANAGEMENT => "Dataset Management",
            _ => "I/O command",
        }
    }
}
