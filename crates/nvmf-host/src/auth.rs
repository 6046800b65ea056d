//! DH-HMAC-CHAP, the host's side (NVMe Base 2.0 section 8.13.5): run right after a queue's
//! Connect when the controller asks for it (Connect response AUTHREQ.ATR), as the Linux host does
//! on every queue. With a controller secret the host also authenticates the controller and
//! refuses one that cannot prove it holds that secret.

use std::sync::atomic::{AtomicU16, Ordering};

use nvmf_proto::auth::{
    augmented_challenge, ctrl_response, failure, host_response, AuthCmd, Challenge, DhGroup, DhKeyPair, Failure,
    HashId, Message, Negotiate, Reply, ResponseInput, Secret, Success1, Success2, CONNECT_AUTHREQ_ASCR,
    CONNECT_AUTHREQ_ATR, MAX_MESSAGE_LEN,
};
use nvmf_proto::fabrics::fctype;

use crate::connection::ConnectOptions;
use crate::error::{Error, Result};
use crate::queue::{QueuePair, Xfer};

/// Transaction IDs, one per authentication, process-wide (Linux counts per controller).
static TRANSACTION: AtomicU16 = AtomicU16::new(1);

/// Authenticates the queue `q` just connected if its Connect response (`result`) asks for it.
/// Fails when the controller asks and no host secret is set, or when a controller secret is set
/// but the controller does not authenticate (a host that wants proof must not go on without it).
pub(crate) fn authenticate_if_asked(q: &mut QueuePair, opts: &ConnectOptions, subnqn: &str, result: u64) -> Result<()> {
    if result & CONNECT_AUTHREQ_ASCR != 0 {
        return Err(Error::Unsupported(
            "the controller requires secure channel concatenation (TLS), which this host does not do".into(),
        ));
    }
    if result & CONNECT_AUTHREQ_ATR == 0 {
        if opts.dhchap_ctrl_secret.is_some() {
            return Err(Error::Auth(format!(
                "queue {}: the controller does not ask for authentication, so it cannot prove it holds --dhchap-ctrl-secret; refusing it",
                q.qid()
            )));
        }
        return Ok(());
    }
    let Some(secret) = &opts.dhchap_secret else {
        return Err(Error::Auth(format!(
            "queue {}: the controller requires DH-HMAC-CHAP authentication; give the host's secret (--dhchap-secret)",
            q.qid()
        )));
    };
    let mut t = Transaction { q, opts, subnqn, secret, t_id: TRANSACTION.fetch_add(1, Ordering::Relaxed) };
    t.run()
}

struct Transaction<'a> {
    q: &'a mut QueuePair,
    opts: &'a ConnectOptions,
    subnqn: &'a str,
    secret: &'a Secret,
    t_id: u16,
}

/// A failure of the exchange: the reason code explanation to tell the controller, and ours.
struct Abort(u8, String);

/// The error when the connection ends while the host waits for the answer to its Reply. Linux
/// nvmet (6.12) marks the controller failed as it hands out Failure1, so the connection often
/// closes before the Failure1 reaches the host: that is a refusal of our response, not a lost
/// connection (which would be worth reconnecting with the same key).
fn closed_after_reply(qid: u16, e: Error) -> Error {
    let closed = match &e {
        Error::Closed => true,
        Error::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof
        ),
        _ => false,
    };
    if !closed {
        return e;
    }
    Error::Auth(format!(
        "queue {qid}: the controller refused authentication: it closed the connection instead of answering our \
         DH-HMAC-CHAP_Reply ({e}; Linux nvmet does so after a wrong response); check --dhchap-secret"
    ))
}

fn random(buf: &mut [u8]) -> Result<()> {
    getrandom::getrandom(buf).map_err(|e| Error::Auth(format!("no random numbers from the OS: {e}")))
}

impl Transaction<'_> {
    fn run(&mut self) -> Result<()> {
        let qid = self.q.qid();
        let all_groups: Vec<u8> = DhGroup::ALL.iter().map(|g| g.id()).collect();
        let negotiate = Negotiate {
            t_id: self.t_id,
            sc_c: 0,
            hashes: HashId::ALL.iter().map(|h| h.id()).collect(),
            dhgroups: all_groups,
        };
        self.send(&Message::Negotiate(negotiate))?;
        let challenge = match self.receive()? {
            Message::Challenge(c) if c.t_id == self.t_id => c,
            other => return Err(self.refused(other, "DH-HMAC-CHAP_Challenge")),
        };
        // Our C2 and S2 when the controller must authenticate too.
        let ctrl_challenge = match &self.opts.dhchap_ctrl_secret {
            Some(_) => {
                let mut c2 = vec![0u8; challenge.challenge.len()];
                random(&mut c2)?;
                let mut s2 = [0u8; 4];
                random(&mut s2)?;
                Some((c2, u32::from_le_bytes(s2).max(1)))
            }
            None => None,
        };
        let (reply, hash, session_key) = match self.reply(&challenge, ctrl_challenge.clone()) {
            Ok(r) => r,
            Err(Abort(code, why)) => return Err(self.abort(code, why)),
        };
        self.send(&Message::Reply(reply))?;
        let answer = self.receive().map_err(|e| closed_after_reply(qid, e))?;
        let success = match answer {
            Message::Success1(s) if s.t_id == self.t_id => s,
            other => return Err(self.refused(other, "DH-HMAC-CHAP_Success1")),
        };
        if let Err(Abort(code, why)) = self.check_controller(&success, hash, session_key.as_deref(), ctrl_challenge) {
            return Err(self.abort(code, why));
        }
        if self.opts.dhchap_ctrl_secret.is_some() {
            self.send(&Message::Success2(Success2 { t_id: self.t_id }))?;
        }
        tracing::debug!(qid, hash = hash.name(), group = challenge.dhgroup_id, "queue authenticated");
        Ok(())
    }

    /// Checks the challenge and builds our Reply; also returns the hash and the session key.
    fn reply(
        &self,
        c: &Challenge,
        ctrl_challenge: Option<(Vec<u8>, u32)>,
    ) -> std::result::Result<(Reply, HashId, Option<Vec<u8>>), Abort> {
        let hash = HashId::from_id(c.hash_id)
            .ok_or_else(|| Abort(failure::HASH_UNUSABLE, format!("the controller chose unknown hash {}", c.hash_id)))?;
        if c.challenge.len() != hash.digest_len() {
            return Err(Abort(
                failure::INCORRECT_PAYLOAD,
                format!("challenge of {} bytes for {}", c.challenge.len(), hash.name()),
            ));
        }
        let group = DhGroup::from_id(c.dhgroup_id).ok_or_else(|| {
            Abort(failure::DHGROUP_UNUSABLE, format!("the controller chose unknown DH group {}", c.dhgroup_id))
        })?;
        let (session_key, dh_value) = if group == DhGroup::Null {
            if !c.dh_value.is_empty() {
                return Err(Abort(failure::INCORRECT_PAYLOAD, "a DH value with the NULL group".into()));
            }
            (None, Vec::new())
        } else {
            let mut x = vec![0u8; group.private_len()];
            random(&mut x).map_err(|e| Abort(failure::FAILED, e.to_string()))?;
            let pair = DhKeyPair::new(group, &x).map_err(|e| Abort(failure::DHGROUP_UNUSABLE, e.to_string()))?;
            let ks = pair
                .session_key(&c.dh_value)
                .map_err(|e| Abort(failure::DHGROUP_UNUSABLE, format!("the controller's DH value: {e}")))?;
            (Some(ks), pair.public().to_vec())
        };
        let challenge = match &session_key {
            Some(ks) => augmented_challenge(hash, ks, &c.challenge),
            None => c.challenge.clone(),
        };
        let key = self.secret.transformed(&self.opts.hostnqn);
        let response = host_response(&ResponseInput {
            hash,
            key: &key,
            challenge: &challenge,
            seqnum: c.seqnum,
            transaction: self.t_id,
            hostnqn: &self.opts.hostnqn,
            subnqn: self.subnqn,
        });
        let (challenge, seqnum) = match ctrl_challenge {
            Some((c2, s2)) => (Some(c2), s2),
            None => (None, 0),
        };
        Ok((Reply { t_id: self.t_id, response, challenge, seqnum, dh_value }, hash, session_key))
    }

    /// With a controller secret: the controller's R2 must be what that secret gives.
    fn check_controller(
        &self,
        s: &Success1,
        hash: HashId,
        session_key: Option<&[u8]>,
        ctrl_challenge: Option<(Vec<u8>, u32)>,
    ) -> std::result::Result<(), Abort> {
        let (Some(ctrl_secret), Some((c2, s2))) = (&self.opts.dhchap_ctrl_secret, ctrl_challenge) else {
            return Ok(());
        };
        let Some(got) = &s.response else {
            return Err(Abort(failure::FAILED, "the controller did not answer our challenge".into()));
        };
        let challenge = match session_key {
            Some(ks) => augmented_challenge(hash, ks, &c2),
            None => c2,
        };
        let key = ctrl_secret.transformed(self.subnqn);
        let expected = ctrl_response(&ResponseInput {
            hash,
            key: &key,
            challenge: &challenge,
            seqnum: s2,
            transaction: self.t_id,
            hostnqn: &self.opts.hostnqn,
            subnqn: self.subnqn,
        });
        let same = expected.len() == got.len() && expected.iter().zip(got).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0;
        if !same {
            return Err(Abort(
                failure::FAILED,
                "the controller's response does not match --dhchap-ctrl-secret: refusing the controller".into(),
            ));
        }
        Ok(())
    }

    fn send(&mut self, m: &Message) -> Result<()> {
        let bytes = m.encode();
        let sqe = AuthCmd::dhchap(bytes.len() as u32).to_sqe(fctype::AUTH_SEND, 0);
        self.q.ensure_buffer(0, bytes.len());
        self.q.buffer(0)[..bytes.len()].copy_from_slice(&bytes);
        self.q.execute(sqe, Xfer::WriteInCapsule(bytes.len()), self.opts.timeout).map(|_| ())
    }

    fn receive(&mut self) -> Result<Message> {
        let sqe = AuthCmd::dhchap(MAX_MESSAGE_LEN as u32).to_sqe(fctype::AUTH_RECV, 0);
        self.q.ensure_buffer(0, MAX_MESSAGE_LEN);
        self.q.execute(sqe, Xfer::Read(MAX_MESSAGE_LEN), self.opts.timeout)?;
        Message::decode(&self.q.buffer(0)[..MAX_MESSAGE_LEN])
            .map_err(|e| Error::Auth(format!("bad message from the controller: {e}")))
    }

    /// The controller sent Failure1 or something out of turn.
    fn refused(&mut self, got: Message, expected: &str) -> Error {
        match got {
            Message::Failure(f) if f.from_controller => Error::Auth(format!(
                "queue {}: the controller refused authentication: {} (reason code explanation {:#04x}); check --dhchap-secret",
                self.q.qid(),
                failure::describe(f.explanation),
                f.explanation
            )),
            other => {
                let why = format!("expected {expected}, got {} (T_ID {})", other.name(), other.t_id());
                self.abort(failure::INCORRECT_MESSAGE, why)
            }
        }
    }

    /// Tells the controller we give up (Failure2) and returns the error.
    fn abort(&mut self, code: u8, why: String) -> Error {
        // Best effort: the error to report is ours, whatever becomes of the Failure2.
        let _ = self.send(&Message::Failure(Failure::new(self.t_id, false, code)));
        Error::Auth(format!("queue {}: {why}", self.q.qid()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_closed_after_the_reply_is_a_refusal_not_a_loss() {
        for e in [
            Error::Closed,
            Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
            Error::Io(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
        ] {
            assert!(e.is_connection_loss());
            let mapped = closed_after_reply(3, e);
            assert!(matches!(mapped, Error::Auth(_)), "{mapped:?}");
            assert!(!mapped.is_connection_loss(), "a refused key must not be retried by reconnecting");
            let text = mapped.to_string();
            assert!(text.contains("queue 3") && text.contains("refused authentication"), "{text}");
        }
        // Anything else keeps its meaning.
        let t = closed_after_reply(0, Error::Timeout("auth receive".into()));
        assert!(matches!(t, Error::Timeout(_)), "{t:?}");
        let p = closed_after_reply(0, Error::Protocol("bad pdu".into()));
        assert!(matches!(p, Error::Protocol(_)), "{p:?}");
    }
}
