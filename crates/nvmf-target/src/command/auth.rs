//! AUTH_Send / AUTH_Receive on a connected queue: the command half of DH-HMAC-CHAP. The
//! conversation itself is [`crate::auth::QueueAuth`]; here its messages are taken from the
//! commands' data and given back as data to send, and a queue whose authentication failed ends.

use super::{in_capsule, Action, Commands, Queue, Work};
use crate::auth::QueueAuth;
use crate::core::{Controller, ADMIN_IN_CAPSULE};
use nvmf_proto::auth::{AuthCmd, CONNECT_AUTHREQ_ATR, MAX_MESSAGE_LEN};
use nvmf_proto::fabrics::fctype;
use nvmf_proto::{Sqe, Status};
use std::time::Instant;

/// The queue may run commands other than Connect and AUTH_Send/Receive.
pub(super) fn allows(q: &Queue) -> bool {
    q.auth.as_ref().is_none_or(QueueAuth::authenticated)
}

/// Connect response DW0 bits asking the host to authenticate (AUTHREQ).
pub(super) fn authreq(auth: &Option<QueueAuth>) -> u64 {
    if auth.is_some() {
        CONNECT_AUTHREQ_ATR
    } else {
        0
    }
}

fn send_len_ok(cmd: AuthCmd) -> bool {
    cmd.len != 0 && cmd.len as usize <= MAX_MESSAGE_LEN
}

impl Commands {
    /// Authentication state for a new queue: hosts with a DH-HMAC-CHAP key must authenticate
    /// on every subsystem (the discovery controller excepted, as in Linux nvmet).
    pub(super) fn queue_auth(&self, ctrl: &Controller, hostnqn: &str, now: Instant) -> Option<QueueAuth> {
        let subsys = ctrl.subsys.as_ref()?;
        let host = self.target.host_auth(hostnqn)?;
        Some(QueueAuth::new(host, &subsys.nqn, now))
    }

    pub(super) fn auth_command(&mut self, sqe: &Sqe, data: &[u8]) -> Action<'static> {
        let cmd = AuthCmd::from_sqe(sqe);
        let result = if !cmd.is_dhchap() {
            Err(Status::INVALID_FIELD.with_dnr())
        } else if sqe.fctype() == fctype::AUTH_SEND {
            in_capsule(sqe, data, ADMIN_IN_CAPSULE).and_then(|d| self.auth_send(cmd, d))
        } else {
            self.auth_receive(sqe, cmd)
        };
        self.auth_done(result)
    }

    /// AUTH_Send with its message to come through the transport: checked now, run when the
    /// data is in ([`Commands::data_in`]).
    pub(super) fn auth_send_by_transfer(&mut self, sqe: &Sqe) -> Action<'static> {
        let cmd = AuthCmd::from_sqe(sqe);
        let has_auth = self.queue.as_ref().is_some_and(|q| q.auth.is_some());
        if !cmd.is_dhchap() || !has_auth || !send_len_ok(cmd) {
            return Action::Respond(Status::INVALID_FIELD.with_dnr(), 0);
        }
        if sqe.sgl().length != cmd.len {
            return Action::Respond(Status::SGL_INVALID_DATA_LEN.with_dnr(), 0);
        }
        Action::Buffer { work: Work::AuthSend(*sqe), len: cmd.len, in_capsule: None }
    }

    /// The message of [`auth_send_by_transfer`](Self::auth_send_by_transfer) arrived
    /// (`failed`: damaged on the way).
    pub(super) fn auth_send_arrived(&mut self, sqe: Sqe, data: &[u8], failed: Option<Status>) -> Action<'static> {
        let result = match failed {
            Some(status) => Err(status),
            None => self.auth_send(AuthCmd::from_sqe(&sqe), data),
        };
        self.auth_done(result)
    }

    /// Completes an AUTH command; a failed authentication ends the queue (and with the admin
    /// queue, the controller), as Linux nvmet's fatal error does: nothing the host sends later
    /// is executed.
    fn auth_done(&mut self, result: Result<Option<Vec<u8>>, Status>) -> Action<'static> {
        // The time this step took us (a DH key pair or shared secret: seconds for ffdhe8192 on a
        // slow CPU) is not the host's silence: keep-alive counts from now. Found by blktests'
        // nvme/043 (ffdhe6144/8192 under qemu TCG: the controller expired mid-authentication).
        let now = Instant::now();
        if let Some(q) = &mut self.queue {
            q.ctrl.touch(self.target.now_ns(now));
            if let Some(auth) = &mut q.auth {
                auth.heard(now);
            }
        }
        if self.queue.as_ref().and_then(|q| q.auth.as_ref()).is_some_and(QueueAuth::failed) {
            tracing::info!("closing queue after failed authentication");
            self.release();
            self.ending = true;
        }
        match result {
            Ok(Some(message)) => Action::Send(message),
            Ok(None) => Action::Respond(Status::SUCCESS, 0),
            Err(status) => Action::Respond(status, 0),
        }
    }

    fn auth_send(&mut self, cmd: AuthCmd, d: &[u8]) -> Result<Option<Vec<u8>>, Status> {
        if !send_len_ok(cmd) || d.len() != cmd.len as usize {
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        let auth = self.queue.as_mut().and_then(|q| q.auth.as_mut()).ok_or(Status::INVALID_FIELD.with_dnr())?;
        auth.send(d).map(|()| None)
    }

    fn auth_receive(&mut self, sqe: &Sqe, cmd: AuthCmd) -> Result<Option<Vec<u8>>, Status> {
        let sgl = sqe.sgl();
        if sgl.sgl_type != self.caps.transfer_sgl {
            return Err(Status::SGL_INVALID_TYPE.with_dnr());
        }
        if sgl.length != cmd.len {
            return Err(Status::SGL_INVALID_DATA_LEN.with_dnr());
        }
        let auth = self.queue.as_mut().and_then(|q| q.auth.as_mut()).ok_or(Status::INVALID_FIELD.with_dnr())?;
        auth.receive(cmd.len).map(Some)
    }
}
