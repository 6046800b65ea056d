//! Fabrics commands a host queue sends to join a controller: Connect (with DH-HMAC-CHAP when
//! the controller asks for it). Used by the admin queue and by I/O queues alike.

use nvmf_proto::fabrics::{ConnectCmd, ConnectData, CATTR_DISABLE_SQFLOW};

use crate::connection::ConnectOptions;
use crate::error::Result;
use crate::queue::{QueuePair, Xfer};

/// What an I/O queue needs to join a controller (cheap to clone into job threads).
#[derive(Debug, Clone)]
pub struct IoQueueParams {
    pub opts: ConnectOptions,
    pub subnqn: String,
    pub cntlid: u16,
    /// Bytes of write data carried in the capsule (from IOCCSZ).
    pub in_capsule: usize,
}

/// Connects queue `conn_q` (its qid) to `subnqn`: controller `cntlid` or a new one
/// (CNTLID_DYNAMIC); authenticates if asked. Returns the controller ID.
pub(crate) fn connect(
    conn_q: &mut QueuePair,
    opts: &ConnectOptions,
    subnqn: &str,
    cntlid: u16,
    sqsize: u16,
    kato_ms: u32,
) -> Result<u16> {
    let qid = conn_q.qid();
    let cattr = if opts.disable_sqflow { CATTR_DISABLE_SQFLOW } else { 0 };
    let sqe = ConnectCmd { recfmt: 0, qid, sqsize, cattr, kato: kato_ms }.to_sqe(0);
    let data = ConnectData { hostid: opts.hostid, cntlid, subnqn: subnqn.to_string(), hostnqn: opts.hostnqn.clone() }.encode();
    conn_q.ensure_buffer(0, data.len());
    conn_q.buffer(0)[..data.len()].copy_from_slice(&data);
    let result = conn_q.execute(sqe, Xfer::WriteInCapsule(data.len()), opts.timeout)?;
    crate::auth::authenticate_if_asked(conn_q, opts, subnqn, result)?;
    // Connect response DW0 bits 15:0 hold the controller ID.
    Ok(result as u16)
}
