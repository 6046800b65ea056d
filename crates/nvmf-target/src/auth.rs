//! DH-HMAC-CHAP on one queue, the controller's side (NVMe Base 2.0 section 8.13.5). Sans-I/O:
//! the transport hands in AUTH_Send data and asks for AUTH_Receive data; this decides what the
//! host gets and whether the queue is authenticated.
//!
//! The conversation: Negotiate (host) → Challenge (us) → Reply (host) → Success1 (us) →
//! Success2 (host, bidirectional only). Anything wrong turns the next AUTH_Receive into a
//! Failure1 and the queue is then dead: the transport closes it, and until then every command
//! but AUTH_Send/Receive is refused with Authentication Required (as Linux nvmet does).

use crate::config::HostAuthConfig;
use nvmf_proto::auth::{
    augmented_challenge, ctrl_response, failure, host_response, Challenge, DhGroup, DhKeyPair, Failure, HashId,
    Message, Negotiate, Reply, ResponseInput, Success1, MAX_MESSAGE_LEN,
};
use nvmf_proto::Status;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An unauthenticated queue whose host sends no authentication command for this long is closed
/// (the host stalled or never started). Counted from the end of our last step, not from the
/// Connect: one DH step of a slow host and our own (ffdhe8192 in a loaded qemu TCG guest) took
/// longer than this all together, yet neither side was silent (blktests nvme/043).
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// However steadily the host talks, an unauthenticated queue is closed after this long, so a
/// host that restarts the negotiation every few seconds cannot hold a queue forever.
pub const AUTH_TRANSACTION_LIMIT: Duration = Duration::from_secs(60);
/// The largest AUTH_Receive allocation length we serve (Linux asks for 4096).
pub const MAX_RECEIVE_LEN: u32 = 2 * MAX_MESSAGE_LEN as u32;

enum Step {
    /// Waiting for AUTH_Negotiate.
    Negotiate,
    /// Negotiated; the host's AUTH_Receive gets the challenge.
    SendChallenge {
        t_id: u16,
        hash: HashId,
        group: DhGroup,
    },
    AwaitReply(Pending),
    /// The host's response matched; the next AUTH_Receive gets Success1 (with R2 if asked).
    SendSuccess1 {
        t_id: u16,
        hash: HashId,
        ctrl_response: Option<Vec<u8>>,
    },
    AwaitSuccess2 {
        t_id: u16,
    },
    Authenticated,
    /// The next AUTH_Receive gets Failure1 with this reason code explanation.
    SendFailure1 {
        t_id: u16,
        explanation: u8,
    },
    Failed,
}

/// What the controller remembers between Challenge and Reply.
struct Pending {
    t_id: u16,
    hash: HashId,
    challenge: Vec<u8>,
    seqnum: u32,
    dh: Option<DhKeyPair>,
}

pub struct QueueAuth {
    host: Arc<HostAuthConfig>,
    subnqn: String,
    step: Step,
    /// Kept through a re-authentication the host starts on a live queue (its I/O goes on, as
    /// with Linux nvmet); cleared by any failure.
    authenticated: bool,
    started: Instant,
    /// When we last finished handling an authentication command of the host.
    last_heard: Instant,
}

fn random(buf: &mut [u8]) {
    // The OS random source failing is not something a connection can recover from.
    getrandom::getrandom(buf).expect("OS random number generator");
}

/// Constant-time comparison, so response checks leak nothing through timing.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl QueueAuth {
    /// The state of a new queue of `host` on subsystem `subnqn`.
    pub fn new(host: Arc<HostAuthConfig>, subnqn: &str, now: Instant) -> QueueAuth {
        QueueAuth { host, subnqn: subnqn.to_string(), step: Step::Negotiate, authenticated: false, started: now, last_heard: now }
    }

    /// Commands other than AUTH_Send/Receive may run.
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// The transaction failed for good: the queue must close once its last response is out.
    pub fn failed(&self) -> bool {
        matches!(self.step, Step::Failed)
    }

    /// Still unauthenticated, and the host silent for [`AUTH_TIMEOUT`] or the transaction older
    /// than [`AUTH_TRANSACTION_LIMIT`].
    pub fn expired(&self, now: Instant) -> bool {
        !self.authenticated()
            && (now.saturating_duration_since(self.last_heard) > AUTH_TIMEOUT
                || now.saturating_duration_since(self.started) > AUTH_TRANSACTION_LIMIT)
    }

    /// An authentication command of the host was handled at `now` (after our part of the step).
    pub fn heard(&mut self, now: Instant) {
        self.last_heard = self.last_heard.max(now);
    }

    /// AUTH_Send with `data`. The command's own status is an error only for malformed commands;
    /// protocol failures are reported through the next AUTH_Receive, as the specification asks.
    pub fn send(&mut self, data: &[u8]) -> Result<(), Status> {
        if self.failed() {
            return Err(Status::AUTH_REQUIRED.with_dnr());
        }
        let msg = match Message::decode(data) {
            Ok(m) => m,
            Err(e) => {
                tracing::info!(hostnqn = %self.host.nqn, "bad authentication message: {e}");
                let t_id = if data.len() >= 6 { u16::from_le_bytes([data[4], data[5]]) } else { 0 };
                self.fail(t_id, e.explanation);
                return Ok(());
            }
        };
        let step = std::mem::replace(&mut self.step, Step::Failed);
        self.step = match (step, msg) {
            // A Negotiate (re)starts a transaction in any live state, as Linux allows.
            (_, Message::Negotiate(n)) => self.negotiate(n),
            (Step::AwaitReply(p), Message::Reply(r)) if r.t_id == p.t_id => self.reply(p, r),
            (Step::AwaitSuccess2 { t_id }, Message::Success2(s)) if s.t_id == t_id => {
                tracing::debug!(hostnqn = %self.host.nqn, "controller authenticated to the host");
                Step::Authenticated
            }
            (_, Message::Failure(f)) if !f.from_controller => {
                tracing::warn!(
                    hostnqn = %self.host.nqn,
                    "host ended authentication: {}",
                    failure::describe(f.explanation)
                );
                Step::Failed
            }
            (_, m) => {
                tracing::info!(hostnqn = %self.host.nqn, message = m.name(), "unexpected authentication message");
                Step::SendFailure1 { t_id: m.t_id(), explanation: failure::INCORRECT_MESSAGE }
            }
        };
        self.track();
        Ok(())
    }

    /// Keeps `authenticated` in step with the conversation.
    fn track(&mut self) {
        match self.step {
            Step::Authenticated => self.authenticated = true,
            Step::Failed | Step::SendFailure1 { .. } => self.authenticated = false,
            _ => {}
        }
    }

    /// AUTH_Receive with allocation length `al`: the message for the host, zero-padded to `al`
    /// (the host reads exactly that much, as from Linux nvmet).
    pub fn receive(&mut self, al: u32) -> Result<Vec<u8>, Status> {
        if al == 0 || al > MAX_RECEIVE_LEN {
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        if self.failed() {
            return Err(Status::AUTH_REQUIRED.with_dnr());
        }
        let step = std::mem::replace(&mut self.step, Step::Failed);
        let (msg, next) = match step {
            Step::SendChallenge { t_id, hash, group } => self.challenge(t_id, hash, group),
            Step::SendSuccess1 { t_id, hash, ctrl_response } => {
                let next = if ctrl_response.is_some() { Step::AwaitSuccess2 { t_id } } else { Step::Authenticated };
                let msg =
                    Message::Success1(Success1 { t_id, hash_len: hash.digest_len() as u8, response: ctrl_response });
                (msg, next)
            }
            Step::SendFailure1 { t_id, explanation } => {
                tracing::warn!(hostnqn = %self.host.nqn, "authentication failed: {}", failure::describe(explanation));
                (Message::Failure(Failure::new(t_id, true, explanation)), Step::Failed)
            }
            other => {
                // A receive the conversation does not expect: Linux answers Failure1 too.
                let t_id = match &other {
                    Step::AwaitReply(p) => p.t_id,
                    Step::AwaitSuccess2 { t_id } => *t_id,
                    _ => 0,
                };
                tracing::info!(hostnqn = %self.host.nqn, "AUTH_Receive out of turn");
                (Message::Failure(Failure::new(t_id, true, failure::INCORRECT_MESSAGE)), Step::Failed)
            }
        };
        let mut bytes = msg.encode();
        if bytes.len() > al as usize {
            // Too small a buffer for the message: nothing sensible to send; the host may retry.
            self.step = Step::SendFailure1 { t_id: msg.t_id(), explanation: failure::INCORRECT_PAYLOAD };
            self.track();
            return Err(Status::INVALID_FIELD.with_dnr());
        }
        bytes.resize(al as usize, 0);
        self.step = next;
        self.track();
        Ok(bytes)
    }

    fn fail(&mut self, t_id: u16, explanation: u8) {
        self.step = Step::SendFailure1 { t_id, explanation };
        self.track();
    }

    fn negotiate(&self, n: Negotiate) -> Step {
        let fail = |explanation| Step::SendFailure1 { t_id: n.t_id, explanation };
        if n.sc_c != 0 {
            return fail(failure::CONCAT_MISMATCH);
        }
        // The configured hash if offered, else the host's first usable one.
        let want = self.host.dhchap_hash;
        let hash = if n.hashes.contains(&want.id()) {
            want
        } else {
            match n.hashes.iter().find_map(|id| HashId::from_id(*id)) {
                Some(h) => h,
                None => return fail(failure::HASH_UNUSABLE),
            }
        };
        // The configured DH group only: falling back would let a host weaken the exchange.
        let group = self.host.dhchap_dhgroup;
        if !n.dhgroups.contains(&group.id()) {
            tracing::info!(hostnqn = %self.host.nqn, group = group.name(), "host does not offer the configured DH group");
            return fail(failure::DHGROUP_UNUSABLE);
        }
        Step::SendChallenge { t_id: n.t_id, hash, group }
    }

    fn challenge(&self, t_id: u16, hash: HashId, group: DhGroup) -> (Message, Step) {
        let mut challenge = vec![0u8; hash.digest_len()];
        random(&mut challenge);
        let mut seq = [0u8; 4];
        random(&mut seq);
        let seqnum = u32::from_le_bytes(seq).max(1);
        let dh = (group != DhGroup::Null).then(|| {
            let mut x = vec![0u8; group.private_len()];
            random(&mut x);
            DhKeyPair::new(group, &x).expect("a real group")
        });
        let msg = Message::Challenge(Challenge {
            t_id,
            hash_id: hash.id(),
            dhgroup_id: group.id(),
            seqnum,
            challenge: challenge.clone(),
            dh_value: dh.as_ref().map_or(Vec::new(), |k| k.public().to_vec()),
        });
        (msg, Step::AwaitReply(Pending { t_id, hash, challenge, seqnum, dh }))
    }

    fn reply(&self, p: Pending, r: Reply) -> Step {
        let fail = |explanation| Step::SendFailure1 { t_id: p.t_id, explanation };
        if r.response.len() != p.hash.digest_len() {
            return fail(failure::INCORRECT_PAYLOAD);
        }
        let session_key = match (&p.dh, r.dh_value.is_empty()) {
            (None, true) => None,
            (None, false) | (Some(_), true) => return fail(failure::INCORRECT_PAYLOAD),
            (Some(k), false) => match k.session_key(&r.dh_value) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::info!(hostnqn = %self.host.nqn, "host DH value refused: {e}");
                    return fail(failure::DHGROUP_UNUSABLE);
                }
            },
        };
        let augment = |c: &[u8]| match &session_key {
            Some(ks) => augmented_challenge(p.hash, ks, c),
            None => c.to_vec(),
        };
        let hostnqn = self.host.nqn.as_str();
        let key = self.host.dhchap_key.transformed(hostnqn);
        let c1 = augment(&p.challenge);
        let expected = host_response(&ResponseInput {
            hash: p.hash,
            key: &key,
            challenge: &c1,
            seqnum: p.seqnum,
            transaction: p.t_id,
            hostnqn,
            subnqn: &self.subnqn,
        });
        if !same(&expected, &r.response) {
            tracing::warn!(hostnqn, subnqn = %self.subnqn, "host response does not match its DH-HMAC-CHAP key");
            return fail(failure::FAILED);
        }
        // S2 = 0 means no controller authentication even with a C2 (Linux's reading of the spec).
        let ctrl_response = match (r.challenge, r.seqnum) {
            (Some(c2), s2) if s2 != 0 => {
                let Some(ctrl_key) = &self.host.dhchap_ctrl_key else {
                    tracing::warn!(hostnqn, "host asks the controller to authenticate but no dhchap_ctrl_key is set");
                    return fail(failure::FAILED);
                };
                let key = ctrl_key.transformed(&self.subnqn);
                let c2 = augment(&c2);
                Some(ctrl_response(&ResponseInput {
                    hash: p.hash,
                    key: &key,
                    challenge: &c2,
                    seqnum: s2,
                    transaction: p.t_id,
                    hostnqn,
                    subnqn: &self.subnqn,
                }))
            }
            _ => None,
        };
        Step::SendSuccess1 { t_id: p.t_id, hash: p.hash, ctrl_response }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_proto::auth::{Secret, Success2};

    const HOSTNQN: &str = "nqn.test:host";
    const SUBNQN: &str = "nqn.test:sub";

    fn host(ctrl_key: bool, group: DhGroup) -> Arc<HostAuthConfig> {
        Arc::new(HostAuthConfig {
            nqn: HOSTNQN.into(),
            dhchap_key: Secret { key: vec![7; 32], transform: Some(HashId::Sha256) },
            dhchap_ctrl_key: ctrl_key.then(|| Secret { key: vec![9; 48], transform: None }),
            dhchap_hash: HashId::Sha384,
            dhchap_dhgroup: group,
        })
    }

    fn negotiate(t_id: u16) -> Vec<u8> {
        Message::Negotiate(Negotiate { t_id, sc_c: 0, hashes: vec![1, 2, 3], dhgroups: vec![0, 1] }).encode()
    }

    fn challenge_of(auth: &mut QueueAuth) -> Challenge {
        match Message::decode(&auth.receive(4096).unwrap()).unwrap() {
            Message::Challenge(c) => c,
            m => panic!("expected a challenge, got {}", m.name()),
        }
    }

    fn answer(c: &Challenge, key: &Secret, c2: Option<(Vec<u8>, u32)>) -> Vec<u8> {
        let hash = HashId::from_id(c.hash_id).unwrap();
        let r = host_response(&ResponseInput {
            hash,
            key: &key.transformed(HOSTNQN),
            challenge: &c.challenge,
            seqnum: c.seqnum,
            transaction: c.t_id,
            hostnqn: HOSTNQN,
            subnqn: SUBNQN,
        });
        let (challenge, seqnum) = match c2 {
            Some((c2, s2)) => (Some(c2), s2),
            None => (None, 0),
        };
        Message::Reply(Reply { t_id: c.t_id, response: r, challenge, seqnum, dh_value: vec![] }).encode()
    }

    fn failure1(auth: &mut QueueAuth) -> u8 {
        match Message::decode(&auth.receive(4096).unwrap()).unwrap() {
            Message::Failure(f) if f.from_controller => f.explanation,
            m => panic!("expected Failure1, got {}", m.name()),
        }
    }

    #[test]
    fn right_key_authenticates_with_the_configured_hash() {
        let h = host(false, DhGroup::Null);
        let mut auth = QueueAuth::new(h.clone(), SUBNQN, Instant::now());
        assert!(!auth.authenticated());
        auth.send(&negotiate(4)).unwrap();
        let c = challenge_of(&mut auth);
        assert_eq!((c.t_id, c.hash_id, c.challenge.len()), (4, HashId::Sha384.id(), 48));
        assert!(c.dh_value.is_empty());
        auth.send(&answer(&c, &h.dhchap_key, None)).unwrap();
        assert!(!auth.authenticated(), "not before Success1 is out");
        let s1 = auth.receive(4096).unwrap();
        assert_eq!(s1.len(), 4096, "padded to the allocation length");
        assert!(matches!(Message::decode(&s1).unwrap(), Message::Success1(Success1 { response: None, .. })));
        assert!(auth.authenticated());
    }

    #[test]
    fn reauthentication_keeps_the_queue_usable_until_it_fails() {
        let h = host(false, DhGroup::Null);
        let mut auth = QueueAuth::new(h.clone(), SUBNQN, Instant::now());
        auth.send(&negotiate(1)).unwrap();
        let c = challenge_of(&mut auth);
        auth.send(&answer(&c, &h.dhchap_key, None)).unwrap();
        auth.receive(4096).unwrap();
        assert!(auth.authenticated());
        // The host starts over on the live queue: still usable meanwhile.
        auth.send(&negotiate(2)).unwrap();
        let c = challenge_of(&mut auth);
        assert!(auth.authenticated());
        auth.send(&answer(&c, &Secret { key: vec![1; 32], transform: None }, None)).unwrap();
        assert!(!auth.authenticated(), "a failed re-authentication ends it");
        assert_eq!(failure1(&mut auth), failure::FAILED);
        assert!(auth.failed());
    }

    #[test]
    fn wrong_key_gets_failure1_and_the_queue_dies() {
        let mut auth = QueueAuth::new(host(false, DhGroup::Null), SUBNQN, Instant::now());
        auth.send(&negotiate(1)).unwrap();
        let c = challenge_of(&mut auth);
        auth.send(&answer(&c, &Secret { key: vec![8; 32], transform: Some(HashId::Sha256) }, None)).unwrap();
        assert_eq!(failure1(&mut auth), failure::FAILED);
        assert!(auth.failed() && !auth.authenticated());
        assert_eq!(auth.send(&negotiate(2)), Err(Status::AUTH_REQUIRED.with_dnr()), "no second try");
    }

    #[test]
    fn bidirectional_returns_the_controller_response_and_waits_for_success2() {
        let h = host(true, DhGroup::Null);
        let mut auth = QueueAuth::new(h.clone(), SUBNQN, Instant::now());
        auth.send(&negotiate(5)).unwrap();
        let c = challenge_of(&mut auth);
        let c2 = vec![3u8; 48];
        auth.send(&answer(&c, &h.dhchap_key, Some((c2.clone(), 77)))).unwrap();
        let Message::Success1(s1) = Message::decode(&auth.receive(4096).unwrap()).unwrap() else { panic!() };
        let expected = ctrl_response(&ResponseInput {
            hash: HashId::Sha384,
            key: &h.dhchap_ctrl_key.as_ref().unwrap().transformed(SUBNQN),
            challenge: &c2,
            seqnum: 77,
            transaction: 5,
            hostnqn: HOSTNQN,
            subnqn: SUBNQN,
        });
        assert_eq!(s1.response, Some(expected));
        assert!(!auth.authenticated(), "until the host's Success2");
        auth.send(&Message::Success2(Success2 { t_id: 5 }).encode()).unwrap();
        assert!(auth.authenticated());
    }

    #[test]
    fn controller_challenge_without_ctrl_key_fails() {
        let h = host(false, DhGroup::Null);
        let mut auth = QueueAuth::new(h.clone(), SUBNQN, Instant::now());
        auth.send(&negotiate(5)).unwrap();
        let c = challenge_of(&mut auth);
        auth.send(&answer(&c, &h.dhchap_key, Some((vec![3; 48], 9)))).unwrap();
        assert_eq!(failure1(&mut auth), failure::FAILED);
    }

    #[test]
    fn out_of_order_and_garbage_are_protocol_failures() {
        let h = host(false, DhGroup::Null);
        // A Reply before any challenge.
        let mut auth = QueueAuth::new(h.clone(), SUBNQN, Instant::now());
        let fake =
            Challenge { t_id: 1, hash_id: 2, dhgroup_id: 0, seqnum: 1, challenge: vec![0; 48], dh_value: vec![] };
        auth.send(&answer(&fake, &h.dhchap_key, None)).unwrap();
        assert_eq!(failure1(&mut auth), failure::INCORRECT_MESSAGE);
        // Garbage.
        let mut auth = QueueAuth::new(h.clone(), SUBNQN, Instant::now());
        auth.send(&[1, 2, 3]).unwrap();
        assert_eq!(failure1(&mut auth), failure::INCORRECT_PAYLOAD);
        // A Reply with another transaction ID.
        let mut auth = QueueAuth::new(h.clone(), SUBNQN, Instant::now());
        auth.send(&negotiate(1)).unwrap();
        let mut c = challenge_of(&mut auth);
        c.t_id = 2;
        auth.send(&answer(&c, &h.dhchap_key, None)).unwrap();
        assert_eq!(failure1(&mut auth), failure::INCORRECT_MESSAGE);
        // A DH group the host does not offer.
        let mut auth = QueueAuth::new(host(false, DhGroup::Ffdhe4096), SUBNQN, Instant::now());
        auth.send(&negotiate(1)).unwrap();
        assert_eq!(failure1(&mut auth), failure::DHGROUP_UNUSABLE);
        // Receive limits.
        let mut auth = QueueAuth::new(h, SUBNQN, Instant::now());
        assert_eq!(auth.receive(0), Err(Status::INVALID_FIELD.with_dnr()));
        assert_eq!(auth.receive(u32::MAX), Err(Status::INVALID_FIELD.with_dnr()));
    }

    #[test]
    fn a_slow_host_that_keeps_talking_is_not_expired_but_a_silent_or_endless_one_is() {
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let mut auth = QueueAuth::new(host(false, DhGroup::Ffdhe2048), SUBNQN, t0);
        // Steps 8 s apart (ffdhe8192 under TCG): 24 s in all, never 10 s of silence.
        for step in [8, 16, 24] {
            assert!(!auth.expired(s(step)), "expired at {step} s although the host spoke 8 s before");
            auth.heard(s(step));
        }
        assert!(!auth.expired(s(33)));
        assert!(auth.expired(s(35)), "11 s of silence ends the queue");
        // Talking every 9 s does not hold a queue past the transaction limit.
        let mut endless = QueueAuth::new(host(false, DhGroup::Ffdhe2048), SUBNQN, t0);
        let mut at = 0;
        while at + 9 <= AUTH_TRANSACTION_LIMIT.as_secs() {
            at += 9;
            endless.heard(s(at));
        }
        assert!(!endless.expired(s(AUTH_TRANSACTION_LIMIT.as_secs())));
        assert!(endless.expired(s(AUTH_TRANSACTION_LIMIT.as_secs() + 1)));
    }

    #[test]
    fn with_a_dh_group_the_host_needs_the_exchange() {
        let h = host(false, DhGroup::Ffdhe2048);
        let mut auth = QueueAuth::new(h.clone(), SUBNQN, Instant::now());
        auth.send(&negotiate(1)).unwrap();
        let c = challenge_of(&mut auth);
        assert_eq!(c.dh_value.len(), 256);
        // A response over the plain challenge (no DH value) is refused.
        auth.send(&answer(&c, &h.dhchap_key, None)).unwrap();
        assert_eq!(failure1(&mut auth), failure::INCORRECT_PAYLOAD);
        assert!(auth.expired(Instant::now() + AUTH_TIMEOUT * 2));
    }
}
