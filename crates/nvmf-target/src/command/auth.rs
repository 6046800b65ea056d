//! AUTH_Send / AUTH_Receive on a connected queue: the transport half of DH-HMAC-CHAP. The
//! conversation itself is [`crate::auth::QueueAuth`]; here its messages are taken out of capsules
//! and put into C2HData, and a queue whose authentication failed is closed.

use super::{Connection, Phase, Queue, SlotState, Work};
use crate::auth::QueueAuth;
use crate::core::{Controller, ADMIN_IN_CAPSULE};
use nvmf_proto::auth::{AuthCmd, CONNECT_AUTHREQ_ATR, MAX_MESSAGE_LEN};
use nvmf_proto::fabrics::fctype;
use nvmf_proto::nvme::SGL_TRANSPORT_DATA_BLOCK;
use nvmf_proto::{Sqe, Status};
use std::time::Instant;

/// The queue may run commands other than Connect and AUTH_Send/Receive.
pub(super) fn allows(q: &Queue) -> bool {
    q.auth.as_ref().map_or(true, QueueAuth::authenticated)
}

/// Connect response DW0 bits asking the host to authenticate (AUTHREQ).
pub(super) fn authreq(auth: &Option<QueueAuth>) -> u64 {
    if auth.is_some() {
        CONNECT_AUTHREQ_ATR
    } else {
        0
    }
}

impl Connection {
    /// Authentication state for a new queue: hosts with a DH-HMAC-CHAP key must authenticate
    /// on every subsystem (the discovery controller excepted, as in Linux nvmet).
    pub(super) fn queue_auth(&self, ctrl: &Controller, hostnqn: &str, now: Instant) -> Option<QueueAuth> {
        let subsys = ctrl.subsys.as_ref()?;
        let host = self.target.host_auth(hostnqn)?;
        Some(QueueAuth::new(host.clone(), &subsys.nqn, now))
    }

    pub(super) fn auth_command(&mut self, sqe: Sqe, data: &[u8]) {
        let cmd = AuthCmd::from_sqe(&sqe);
        let result = if !cmd.is_dhchap() {
            Err(Status::INVALID_FIELD.with_dnr())
        } else if sqe.fctype() == fctype::AUTH_SEND {
            self.in_capsule(&sqe, data, ADMIN_IN_CAPSULE).and_then(|d| self.auth_send(cmd, d))
        } else {
            self.auth_receive(&sqe, cmd)
        };
        self.auth_done(sqe.cid(), result);
    }

    /// AUTH_Send with its message to come through R2T: checked now, run when the data is in.
    pub(super) fn auth_send_via_r2t(&mut self, sqe: Sqe) {
        let (cid, cmd) = (sqe.cid(), AuthCmd::from_sqe(&sqe));
        let has_auth = self.queue.as_ref().is_some_and(|q| q.auth.is_some());
        if !cmd.is_dhchap() || !has_auth || !Self::send_len_ok(cmd) {
            return self.respond(cid, Status::INVALID_FIELD.with_dnr(), 0);
        }
        if sqe.sgl().length != cmd.len {
            return self.respond(cid, Status::SGL_INVALID_DATA_LEN.with_dnr(), 0);
        }
        let limit = self.queue.as_ref().map_or(1, |q| q.sqsize as usize + 1);
        let Some(idx) = self.slots.alloc(limit, cid, Work::AuthSend(sqe), cmd.len) else {
            return self.respond(cid, Status::CMD_SEQ_ERROR.with_dnr(), 0);
        };
        if self.slots.reserve(idx, true).is_err() {
            self.slots.free(idx);
            return self.respond(cid, Status::INTERNAL_ERROR, 0);
        }
        self.slots[idx].state = SlotState::AwaitData;
        self.send_r2ts(idx);
    }

    /// The R2T'd message of [`auth_send_via_r2t`](Self::auth_send_via_r2t) arrived (`failed`:
    /// its data digest was wrong).
    pub(super) fn auth_send_arrived(&mut self, sqe: Sqe, data: &[u8], failed: Option<Status>) {
        let result = match failed {
            Some(status) => Err(status),
            None => self.auth_send(AuthCmd::from_sqe(&sqe), data),
        };
        self.auth_done(sqe.cid(), result);
    }

    /// Completes an AUTH command; a failed authentication ends the queue (and with the admin
    /// queue, the controller), as Linux nvmet's fatal error does: nothing the host sends later
    /// is executed.
    fn auth_done(&mut self, cid: u16, result: Result<Option<Vec<u8>>, Status>) {
        match result {
            Ok(Some(message)) => {
                Self::send_copied(&mut self.out, self.digests, cid, &message, false, false);
                self.respond(cid, Status::SUCCESS, 0);
            }
            Ok(None) => self.respond(cid, Status::SUCCESS, 0),
            Err(status) => self.respond(cid, status, 0),
        }
        if self.queue.as_ref().and_then(|q| q.auth.as_ref()).is_some_and(QueueAuth::failed) {
            tracing::info!("closing queue after failed authentication");
            self.phase = Phase::Closing;
            self.release();
        }
    }

    fn send_len_ok(cmd: AuthCmd) -> bool {
        cmd.len != 0 && cmd.len as usize <= MAX_MESSAGE_LEN
    }

    fn auth_send(&mut self, cmd: AuthCmd, d: &[u8]) -> Result<Option<Vec<u8>>, Status> {
        if !Self::send_len_ok(cmd) || d.len() != cmd.len as usize {
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        let auth = self.queue.as_mut().and_then(|q| q.auth.as_mut()).ok_or(Status::INVALID_FIELD.with_dnr())?;
        auth.send(d).map(|()| None)
    }

    fn auth_receive(&mut self, sqe: &Sqe, cmd: AuthCmd) -> Result<Option<Vec<u8>>, Status> {
        let sgl = sqe.sgl();
        if sgl.sgl_type != SGL_TRANSPORT_DATA_BLOCK {
            return Err(Status::SGL_INVALID_TYPE.with_dnr());
        }
        if sgl.length != cmd.len {
            return Err(Status::SGL_INVALID_DATA_LEN.with_dnr());
        }
        let auth = self.queue.as_mut().and_then(|q| q.auth.as_mut()).ok_or(Status::INVALID_FIELD.with_dnr())?;
        auth.receive(cmd.len).map(Some)
    }
}
