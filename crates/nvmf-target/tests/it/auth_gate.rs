//! DH-HMAC-CHAP at the connection level, driven with hand-built PDUs: Connect asks the host to
//! authenticate (AUTHREQ.ATR), nothing but AUTH_Send/Receive runs before it has, and after a
//! failed authentication nothing the host sends is executed.

use nvmf_proto::auth::{
    host_response, AuthCmd, Challenge, HashId, Message, Negotiate, Reply, ResponseInput, Secret, CONNECT_AUTHREQ_ATR,
};
use nvmf_proto::fabrics::{
    fctype, reg, ConnectCmd, ConnectData, PropertyGet, PropertySet, CNTLID_DYNAMIC, DISCOVERY_NQN,
};
use nvmf_proto::nvme::{admin_opcode, cns, SglDescriptor};
use nvmf_proto::pdu::{encode_pdu, CapsuleCmd, H2CData, IcReq};
use nvmf_proto::{Cqe, Digests, Framer, PduHeader, Role, Sqe, Status};
use nvmf_target::config::{BackendConfig, HostAuthConfig, NamespaceConfig, PortConfig, SubsystemConfig, TargetConfig};
use nvmf_target::core::Target;
use nvmf_target::transport::tcp::Connection;
use std::sync::Arc;
use std::time::Instant;

const SUB: &str = "nqn.2024-01.io.nvmflab:auth-gate";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:auth-gate-host";

fn key(seed: u8) -> Secret {
    Secret { key: vec![seed; 32], transform: Some(HashId::Sha256) }
}

fn target() -> Arc<Target> {
    target_with(nvmf_proto::auth::DhGroup::Null)
}

fn target_with(dhgroup: nvmf_proto::auth::DhGroup) -> Arc<Target> {
    let mut c = TargetConfig::empty();
    c.ports.push(PortConfig { addr: "127.0.0.1:4420".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() });
    let mut s = SubsystemConfig::new(SUB);
    s.namespaces.push(NamespaceConfig {
        nsid: 1,
        backend: BackendConfig::Ram { size: 1 << 20 },
        block_size: 512,
        nguid: None,
        uuid: None,
    });
    c.subsystems.push(s);
    c.hosts.push(HostAuthConfig {
        nqn: HOST.into(),
        dhchap_key: key(1),
        dhchap_ctrl_key: None,
        dhchap_hash: HashId::Sha256,
        dhchap_dhgroup: dhgroup,
    });
    c.validate("test").unwrap();
    Arc::new(Target::new(c.target.clone(), &c.subsystems, &c.ports).unwrap().with_host_auth(&c.hosts))
}

struct Host {
    conn: Connection,
    framer: Framer,
    now: Instant,
    rx: Vec<u8>,
    cid: u16,
}

impl Host {
    fn new(target: Arc<Target>) -> Host {
        let now = Instant::now();
        let conn = Connection::new(target, None, now);
        Host { conn, framer: Framer::new(Role::Host, 1 << 20), now, rx: Vec::new(), cid: 0 }
    }

    fn send_pdu(&mut self, hdr: PduHeader, data: &[u8]) {
        let mut b = Vec::new();
        encode_pdu(&mut b, &hdr, data, Digests::default());
        self.conn.feed(&b);
        self.conn.process(self.now);
        self.rx.extend_from_slice(&self.conn.take_output());
    }

    /// Sends a command; returns (C2H data, response), or None when the target answered nothing.
    fn command(&mut self, mut sqe: Sqe, data: &[u8]) -> Option<(Vec<u8>, Cqe)> {
        self.cid += 1;
        sqe.set_cid(self.cid);
        self.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), data);
        let mut read = Vec::new();
        loop {
            let f = self.framer.next(&self.rx).expect("valid PDU")?;
            let bytes = self.rx[f.data.clone()].to_vec();
            self.rx.drain(..f.len);
            match f.header {
                PduHeader::C2HData(_) => read.extend_from_slice(&bytes),
                PduHeader::CapsuleResp(r) => return Some((read, r.cqe)),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn status(&mut self, sqe: Sqe) -> Status {
        self.command(sqe, &[]).expect("a response").1.status
    }

    fn connect(&mut self, subnqn: &str) -> Cqe {
        self.connect_kato(subnqn, 0)
    }

    fn connect_kato(&mut self, subnqn: &str, kato: u32) -> Cqe {
        self.send_pdu(PduHeader::IcReq(IcReq { pfv: 0, hpda: 0, hdgst: false, ddgst: false, maxr2t: 0 }), &[]);
        let f = self.framer.next(&self.rx).unwrap().unwrap();
        self.rx.drain(..f.len);
        let mut sqe = ConnectCmd { recfmt: 0, qid: 0, sqsize: 31, cattr: 0, kato }.to_sqe(0);
        sqe.set_sgl(SglDescriptor::in_capsule(0, 1024));
        let data = ConnectData { hostid: [7; 16], cntlid: CNTLID_DYNAMIC, subnqn: subnqn.into(), hostnqn: HOST.into() }
            .encode();
        let cqe = self.command(sqe, &data).unwrap().1;
        self.conn.attach(0, &nvmf_target::stats::ReactorStats::new(0, 0, nvmf_target::config::ReactorMode::Event, 0));
        cqe
    }

    fn auth_send(&mut self, m: &Message) -> Status {
        let bytes = m.encode();
        let mut sqe = AuthCmd::dhchap(bytes.len() as u32).to_sqe(fctype::AUTH_SEND, 0);
        sqe.set_sgl(SglDescriptor::in_capsule(0, bytes.len() as u32));
        self.command(sqe, &bytes).unwrap().1.status
    }

    fn auth_receive(&mut self) -> Message {
        let mut sqe = AuthCmd::dhchap(4096).to_sqe(fctype::AUTH_RECV, 0);
        sqe.set_sgl(SglDescriptor::transport(4096));
        let (data, cqe) = self.command(sqe, &[]).unwrap();
        assert_eq!(cqe.status, Status::SUCCESS);
        assert_eq!(data.len(), 4096);
        Message::decode(&data).unwrap()
    }

    /// Negotiate, Challenge, Reply with `secret`; returns what the controller answers.
    fn authenticate(&mut self, secret: &Secret) -> Message {
        let negotiate = Negotiate { t_id: 9, sc_c: 0, hashes: vec![1, 2, 3], dhgroups: vec![0] };
        assert_eq!(self.auth_send(&Message::Negotiate(negotiate)), Status::SUCCESS);
        let Message::Challenge(c) = self.auth_receive() else { panic!("no challenge") };
        assert_eq!(self.auth_send(&reply(&c, secret)), Status::SUCCESS);
        self.auth_receive()
    }
}

fn reply(c: &Challenge, secret: &Secret) -> Message {
    let response = host_response(&ResponseInput {
        hash: HashId::from_id(c.hash_id).unwrap(),
        key: &secret.transformed(HOST),
        challenge: &c.challenge,
        seqnum: c.seqnum,
        transaction: c.t_id,
        hostnqn: HOST,
        subnqn: SUB,
    });
    Message::Reply(Reply { t_id: c.t_id, response, challenge: None, seqnum: 0, dh_value: vec![] })
}

fn identify() -> Sqe {
    let mut s = Sqe::new(admin_opcode::IDENTIFY, 0);
    s.set_cdw(10, cns::CONTROLLER as u32);
    s.set_sgl(SglDescriptor::transport(4096));
    s
}

#[test]
fn commands_before_authentication_are_refused() {
    let target = target();
    let mut h = Host::new(target.clone());
    let cqe = h.connect(SUB);
    assert_eq!(cqe.status, Status::SUCCESS);
    assert_ne!(cqe.result & CONNECT_AUTHREQ_ATR, 0, "Connect asks the host to authenticate");
    let required = Status::AUTH_REQUIRED.with_dnr();
    assert_eq!(h.status(PropertySet { size8: false, offset: reg::CC, value: 0x46_0001 }.to_sqe(0)), required);
    assert_eq!(h.status(PropertyGet { size8: false, offset: reg::CSTS }.to_sqe(0)), required);
    assert_eq!(h.status(identify()), required);
    assert_eq!(h.status(Sqe::new(admin_opcode::KEEP_ALIVE, 0)), required);
    // Another security protocol than DH-HMAC-CHAP.
    let mut other = AuthCmd::dhchap(4096).to_sqe(fctype::AUTH_RECV, 0);
    other.0[43] = 0xEA;
    other.set_sgl(SglDescriptor::transport(4096));
    assert_eq!(h.status(other), Status::INVALID_FIELD.with_dnr());

    assert!(matches!(h.authenticate(&key(1)), Message::Success1(_)));
    // The refused Property Set did not run: CC is still 0; now it does.
    assert_eq!(h.command(PropertyGet { size8: false, offset: reg::CC }.to_sqe(0), &[]).unwrap().1.result, 0);
    assert_eq!(h.status(PropertySet { size8: false, offset: reg::CC, value: 0x46_0001 }.to_sqe(0)), Status::SUCCESS);
    assert_eq!(h.status(identify()), Status::SUCCESS);
}

#[test]
fn after_a_failed_authentication_nothing_is_executed() {
    let target = target();
    let mut h = Host::new(target.clone());
    assert_eq!(h.connect(SUB).status, Status::SUCCESS);
    assert_eq!(target.controller_count(), 1);
    let Message::Failure(f) = h.authenticate(&key(2)) else { panic!("expected Failure1") };
    assert!(f.from_controller);
    assert_eq!(f.explanation, nvmf_proto::auth::failure::FAILED);
    assert!(h.conn.should_close(), "the queue closes after Failure1");
    assert_eq!(target.controller_count(), 0, "the controller is gone");
    // Whatever else arrives is not answered, let alone executed.
    assert!(h.command(PropertySet { size8: false, offset: reg::CC, value: 0x46_0001 }.to_sqe(0), &[]).is_none());
}

#[test]
fn auth_send_data_may_come_by_r2t() {
    // A host sends AUTH_Send out of capsule when the message exceeds IOCCSZ (Linux on an I/O
    // queue of a target with little in-capsule data): R2T, H2CData, then the command runs.
    let mut h = Host::new(target());
    assert_eq!(h.connect(SUB).status, Status::SUCCESS);
    let negotiate = Message::Negotiate(Negotiate { t_id: 3, sc_c: 0, hashes: vec![1], dhgroups: vec![0] }).encode();
    let mut sqe = AuthCmd::dhchap(negotiate.len() as u32).to_sqe(fctype::AUTH_SEND, 0);
    sqe.set_sgl(SglDescriptor::transport(negotiate.len() as u32));
    h.cid += 1;
    sqe.set_cid(h.cid);
    h.send_pdu(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), &[]);
    let f = h.framer.next(&h.rx).unwrap().expect("an R2T");
    let PduHeader::R2T(r2t) = f.header else { panic!("expected R2T, got {:?}", f.header) };
    h.rx.drain(..f.len);
    assert_eq!((r2t.cccid, r2t.r2to, r2t.r2tl), (h.cid, 0, negotiate.len() as u32));
    let data = H2CData { cccid: h.cid, ttag: r2t.ttag, datao: 0, datal: negotiate.len() as u32, last: true };
    h.send_pdu(PduHeader::H2CData(data), &negotiate);
    let f = h.framer.next(&h.rx).unwrap().expect("a response");
    let PduHeader::CapsuleResp(r) = f.header else { panic!("expected a response, got {:?}", f.header) };
    h.rx.drain(..f.len);
    assert_eq!(r.cqe.status, Status::SUCCESS);
    let Message::Challenge(c) = h.auth_receive() else { panic!("no challenge") };
    assert_eq!(c.t_id, 3);
}

#[test]
fn the_discovery_controller_does_not_ask() {
    let mut h = Host::new(target());
    let cqe = h.connect(DISCOVERY_NQN);
    assert_eq!(cqe.status, Status::SUCCESS);
    assert_eq!(cqe.result & CONNECT_AUTHREQ_ATR, 0);
}

/// Found by blktests' nvme/043 under qemu TCG: the target's own ffdhe8192 key pair took longer
/// than KATO, and the controller expired mid-authentication as if the host had gone silent.
/// Here KATO is 5 ms and the key pair takes far longer (tens of ms natively): the controller
/// must still be there right after the challenge is sent.
#[test]
fn time_the_target_spends_on_dh_is_not_host_silence() {
    use nvmf_proto::auth::DhGroup;
    let t = target_with(DhGroup::Ffdhe8192);
    let mut h = Host::new(t.clone());
    assert_eq!(h.connect_kato(SUB, 5).status, Status::SUCCESS);
    let started = Instant::now();
    let negotiate = Negotiate { t_id: 9, sc_c: 0, hashes: vec![1], dhgroups: vec![DhGroup::Ffdhe8192.id()] };
    assert_eq!(h.auth_send(&Message::Negotiate(negotiate)), Status::SUCCESS);
    let Message::Challenge(c) = h.auth_receive() else { panic!("no challenge") };
    assert!(!c.dh_value.is_empty(), "an ffdhe8192 challenge carries the target's DH value");
    let spent = started.elapsed();
    assert!(spent > std::time::Duration::from_millis(5), "the DH work ({spent:?}) must outlast KATO for this test to mean anything");
    h.conn.tick(Instant::now());
    assert_eq!(t.controller_count(), 1, "the controller expired while the target computed ({spent:?})");
}

/// Also from nvme/043: the Linux host's own ffdhe8192 step took over KATO (5 s) in a TCG guest.
/// While a queue authenticates, the authentication deadline bounds it, not keep-alive.
#[test]
fn a_slow_host_during_authentication_is_bounded_by_the_auth_deadline_not_kato() {
    use nvmf_proto::auth::DhGroup;
    let t = target_with(DhGroup::Ffdhe2048);
    let mut h = Host::new(t.clone());
    assert_eq!(h.connect_kato(SUB, 5).status, Status::SUCCESS);
    let negotiate = Negotiate { t_id: 9, sc_c: 0, hashes: vec![1], dhgroups: vec![DhGroup::Ffdhe2048.id()] };
    assert_eq!(h.auth_send(&Message::Negotiate(negotiate)), Status::SUCCESS);
    let Message::Challenge(_) = h.auth_receive() else { panic!("no challenge") };
    // The host computes for 2 s: far past KATO, within the authentication deadline.
    h.conn.tick(Instant::now() + std::time::Duration::from_secs(2));
    assert_eq!(t.controller_count(), 1, "expired on KATO in the middle of authentication");
    assert!(!h.conn.should_close());
    // A host that never answers is still dropped, at the authentication deadline.
    h.conn.tick(Instant::now() + nvmf_target::auth::AUTH_TIMEOUT + std::time::Duration::from_secs(1));
    assert!(h.conn.should_close(), "a silent host outlived the authentication deadline");
}
