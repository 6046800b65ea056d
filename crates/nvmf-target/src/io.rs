//! I/O commands: Read, Write, Flush, Write Zeroes, Dataset Management. Checks each command
//! against its namespace and says what the transport must move and what the backend must do.

use crate::core::{Namespace, Subsystem, MAX_TRANSFER};
use nvmf_proto::nvme::io_opcode;
use nvmf_proto::{Sqe, Status};

/// Read/Write CDW12 bit 30: Force Unit Access.
const CDW12_FUA: u32 = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoPlan {
    // Namespaces are named by nsid, not by index: the queue's view of its subsystem may be
    // taken again (a namespace added or removed at run time) before the command executes.
    /// Read `len` bytes at byte `offset` and send them to the host.
    Read { nsid: u32, offset: u64, len: u32 },
    /// Receive `len` bytes from the host and write them at `offset`; with `fua` (Force Unit
    /// Access) the write must be durable before it completes.
    Write { nsid: u32, offset: u64, len: u32, fua: bool },
    /// Flush one namespace, or every namespace (`nsid = None`, nsid FFFFFFFFh).
    Flush { nsid: Option<u32> },
    WriteZeroes { nsid: u32, offset: u64, len: u64 },
    /// Receive `ranges` 16-byte range descriptors; deallocate them if `deallocate`.
    Dsm { nsid: u32, ranges: u32, deallocate: bool },
}

impl IoPlan {
    /// Bytes the host sends with the command (in-capsule or through R2T).
    pub fn host_data_len(&self) -> u32 {
        match self {
            IoPlan::Write { len, .. } => *len,
            IoPlan::Dsm { ranges, .. } => ranges * 16,
            _ => 0,
        }
    }
}

fn namespace(subsys: &Subsystem, nsid: u32) -> Result<&Namespace, Status> {
    subsys.namespace(nsid).map(|(_, n)| &**n).ok_or(Status::INVALID_NS.with_dnr())
}

/// Byte range of SLBA/NLB after the range check.
fn lba_range(ns: &Namespace, sqe: &Sqe) -> Result<(u64, u64), Status> {
    let slba = sqe.slba();
    let nlb = sqe.nlb() as u64 + 1;
    if slba.checked_add(nlb).is_none_or(|end| end > ns.nlb) {
        return Err(Status::LBA_OUT_OF_RANGE.with_dnr());
    }
    Ok((slba << ns.lbads, nlb << ns.lbads))
}

pub fn plan(subsys: &Subsystem, sqe: &Sqe) -> Result<IoPlan, Status> {
    match sqe.opcode() {
        op @ (io_opcode::READ | io_opcode::WRITE) => {
            let (nsid, ns) = (sqe.nsid(), namespace(subsys, sqe.nsid())?);
            let (offset, len) = lba_range(ns, sqe)?;
            if len > MAX_TRANSFER as u64 {
                return Err(Status::INVALID_FIELD.with_dnr());
            }
            let len = len as u32;
            Ok(if op == io_opcode::READ {
                IoPlan::Read { nsid, offset, len }
            } else {
                IoPlan::Write { nsid, offset, len, fua: sqe.cdw(12) & CDW12_FUA != 0 }
            })
        }
        io_opcode::FLUSH => match sqe.nsid() {
            u32::MAX => Ok(IoPlan::Flush { nsid: None }),
            nsid => namespace(subsys, nsid).map(|_| IoPlan::Flush { nsid: Some(nsid) }),
        },
        io_opcode::WRITE_ZEROES => {
            let ns = namespace(subsys, sqe.nsid())?;
            let (offset, len) = lba_range(ns, sqe)?;
            Ok(IoPlan::WriteZeroes { nsid: sqe.nsid(), offset, len })
        }
        io_opcode::DATASET_MANAGEMENT => {
            namespace(subsys, sqe.nsid())?;
            let ranges = (sqe.cdw(10) & 0xFF) + 1;
            Ok(IoPlan::Dsm { nsid: sqe.nsid(), ranges, deallocate: sqe.cdw(11) & (1 << 2) != 0 })
        }
        _ => Err(Status::INVALID_OPCODE.with_dnr()),
    }
}

/// Decodes DSM range descriptors into byte ranges, checking each against the namespace.
pub fn dsm_ranges(ns: &Namespace, data: &[u8], out: &mut Vec<(u64, u64)>) -> Result<(), Status> {
    for r in data.chunks_exact(16) {
        let nlb = u32::from_le_bytes(r[4..8].try_into().expect("4 bytes")) as u64;
        let slba = u64::from_le_bytes(r[8..16].try_into().expect("8 bytes"));
        if slba.checked_add(nlb).is_none_or(|end| end > ns.nlb) {
            return Err(Status::LBA_OUT_OF_RANGE.with_dnr());
        }
        if nlb > 0 {
            out.push((slba << ns.lbads, nlb << ns.lbads));
        }
    }
    Ok(())
}
