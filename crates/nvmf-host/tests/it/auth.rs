//! DH-HMAC-CHAP end to end: our host against our target over loopback, for every hash, the NULL
//! and ffdhe groups, bidirectional authentication, and the refusals (wrong or missing host key,
//! wrong controller key, a controller that does not authenticate).

use std::path::Path;
use std::time::{Duration, Instant};

use nvmf_host::{ConnectOptions, Controller, Error, IoQueue};
use nvmf_proto::auth::{DhGroup, HashId, Secret};

const NQN: &str = "nqn.2024-01.io.nvmflab:auth";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6b5c3b0e-auth-test-host";
const OTHER_HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:6b5c3b0e-no-key-host";
const T: Duration = Duration::from_secs(5);

fn secret(seed: u8, len: usize, transform: Option<HashId>) -> Secret {
    Secret { key: (0..len).map(|i| seed.wrapping_add(i as u8).wrapping_mul(31)).collect(), transform }
}

/// A target whose host `HOST` must authenticate with `key` (and `ctrl_key`), `hash`, `group`.
fn start_target(key: &Secret, ctrl_key: Option<&Secret>, hash: HashId, group: DhGroup) -> nvmf_target::RunningTarget {
    let ctrl_line = ctrl_key.map_or(String::new(), |k| format!("dhchap_ctrl_key = \"{}\"\n", k.encode()));
    let cfg = format!(
        r#"
[[port]]
addr = "127.0.0.1:0"

[[host]]
nqn = "{HOST}"
dhchap_key = "{key}"
{ctrl_line}dhchap_hash = "{hash}"
dhchap_dhgroup = "{group}"

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true
  [[subsystem.namespace]]
  nsid = 1
  backend = "ram"
  size = "1MiB"
"#,
        key = key.encode(),
        hash = hash.name(),
        group = group.name(),
    );
    let config = nvmf_target::config::toml::parse(&cfg, Path::new("auth.toml")).expect("config");
    nvmf_target::start(config).expect("target starts")
}

fn options(
    target: &nvmf_target::RunningTarget,
    hostnqn: &str,
    key: Option<&Secret>,
    ctrl: Option<&Secret>,
) -> ConnectOptions {
    let mut o = ConnectOptions::new(target.listen_addrs()[0].to_string(), hostnqn);
    o.dhchap_secret = key.cloned();
    o.dhchap_ctrl_secret = ctrl.cloned();
    o.kato_ms = 0;
    o.timeout = T;
    o
}

/// Connects (admin queue and one I/O queue, both authenticated), writes and reads back a block.
fn connect_and_io(opts: &ConnectOptions) -> Result<(), Error> {
    let ctrl = Controller::connect(opts, NQN)?;
    ctrl.set_number_of_queues(1)?;
    let mut q = IoQueue::connect(&ctrl.io_queue_params(), 1, 4, 4096)?;
    q.set_namespace(1, 512);
    let data: Vec<u8> = (0..512).map(|i| (i * 7) as u8).collect();
    q.write(3, &data, T)?;
    let mut back = vec![0u8; 512];
    q.read(3, &mut back, T)?;
    assert_eq!(back, data, "data read back through authenticated queues");
    drop(q);
    ctrl.shutdown()
}

#[test]
fn every_hash_with_the_null_group() {
    for (hash, key_len, transform) in [
        (HashId::Sha256, 32, None),
        (HashId::Sha384, 48, Some(HashId::Sha384)),
        (HashId::Sha512, 64, Some(HashId::Sha512)),
    ] {
        let key = secret(1, key_len, transform);
        let target = start_target(&key, None, hash, DhGroup::Null);
        connect_and_io(&options(&target, HOST, Some(&key), None)).unwrap_or_else(|e| panic!("{hash:?}: {e}"));
        target.shutdown();
    }
}

#[test]
fn ffdhe2048_bidirectional_with_io() {
    let key = secret(2, 32, Some(HashId::Sha256));
    let ctrl_key = secret(3, 32, Some(HashId::Sha256));
    let target = start_target(&key, Some(&ctrl_key), HashId::Sha256, DhGroup::Ffdhe2048);
    connect_and_io(&options(&target, HOST, Some(&key), Some(&ctrl_key))).expect("bidirectional ffdhe2048");
    target.shutdown();
}

#[test]
fn every_group_once_with_timings() {
    let key = secret(4, 48, Some(HashId::Sha384));
    let ctrl_key = secret(5, 64, None);
    for group in DhGroup::ALL {
        let target = start_target(&key, Some(&ctrl_key), HashId::Sha512, group);
        let started = Instant::now();
        let ctrl = Controller::connect(&options(&target, HOST, Some(&key), Some(&ctrl_key)), NQN)
            .unwrap_or_else(|e| panic!("{group:?}: {e}"));
        eprintln!("{}: admin queue connected and authenticated in {:?}", group.name(), started.elapsed());
        ctrl.shutdown().unwrap();
        target.shutdown();
    }
}

#[test]
fn wrong_host_key_is_refused() {
    let key = secret(6, 32, None);
    let target = start_target(&key, None, HashId::Sha256, DhGroup::Ffdhe2048);
    let wrong = secret(7, 32, None);
    let err = Controller::connect(&options(&target, HOST, Some(&wrong), None), NQN).err().expect("refused");
    assert!(matches!(err, Error::Auth(_)), "{err}");
    assert!(err.to_string().contains("controller refused authentication: authentication failed"), "{err}");
    // The right key still works afterwards: the failure closed only that connection.
    Controller::connect(&options(&target, HOST, Some(&key), None), NQN).expect("right key").shutdown().unwrap();
    target.shutdown();
}

#[test]
fn missing_host_key_is_refused_and_other_hosts_are_not_asked() {
    let key = secret(8, 32, None);
    let target = start_target(&key, None, HashId::Sha256, DhGroup::Null);
    let err = Controller::connect(&options(&target, HOST, None, None), NQN).err().expect("refused");
    assert!(matches!(err, Error::Auth(_)) && err.to_string().contains("--dhchap-secret"), "{err}");
    // A host without a configured key is not asked to authenticate (allow_any_host).
    connect_and_io(&options(&target, OTHER_HOST, None, None)).expect("host without a key");
    target.shutdown();
}

#[test]
fn wrong_controller_key_makes_the_host_refuse_the_controller() {
    let key = secret(9, 32, Some(HashId::Sha256));
    let ctrl_key = secret(10, 32, None);
    let target = start_target(&key, Some(&ctrl_key), HashId::Sha384, DhGroup::Null);
    let wrong = secret(11, 32, None);
    let err = Controller::connect(&options(&target, HOST, Some(&key), Some(&wrong)), NQN).err().expect("refused");
    assert!(err.to_string().contains("does not match --dhchap-ctrl-secret"), "{err}");
    target.shutdown();
}

#[test]
fn controller_secret_without_an_authenticating_controller_is_refused() {
    let key = secret(12, 32, None);
    let target = start_target(&key, None, HashId::Sha256, DhGroup::Null);
    // OTHER_HOST has no key on the target, so the controller does not ask to authenticate.
    let err = Controller::connect(&options(&target, OTHER_HOST, Some(&key), Some(&key)), NQN).err().expect("refused");
    assert!(err.to_string().contains("cannot prove it holds --dhchap-ctrl-secret"), "{err}");
    target.shutdown();
}

/// A peer that behaves as Linux nvmet 6.12 does with a wrong key: it takes the Reply, then tears
/// the connection down when the host asks for the answer (nvmet marks the controller failed as
/// it hands out Failure1, so the Failure1 often never reaches the host). The host must report a
/// refused key, not a lost connection (a loss would be retried by reconnecting with the same key).
#[test]
fn controller_closing_after_the_reply_is_a_refused_key() {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};

    use nvmf_proto::auth::{Challenge, Message, CONNECT_AUTHREQ_ATR, MAX_MESSAGE_LEN};
    use nvmf_proto::pdu::{encode_pdu, C2HData, CapsuleResp, IcResp};
    use nvmf_proto::{Cqe, Digests, Framer, PduHeader, Role, Status};

    struct Peer {
        s: TcpStream,
        buf: Vec<u8>,
        framer: Framer,
    }
    impl Peer {
        fn recv(&mut self) -> (PduHeader, Vec<u8>) {
            loop {
                if let Some(f) = self.framer.next(&self.buf).expect("host sent a valid PDU") {
                    let data = self.buf[f.data.clone()].to_vec();
                    self.buf.drain(..f.len);
                    return (f.header, data);
                }
                let mut chunk = [0u8; 65536];
                let n = self.s.read(&mut chunk).expect("read");
                assert!(n > 0, "host closed the connection");
                self.buf.extend_from_slice(&chunk[..n]);
            }
        }
        fn send(&mut self, hdr: PduHeader, data: &[u8]) {
            let mut out = Vec::new();
            encode_pdu(&mut out, &hdr, data, Digests::default());
            self.s.write_all(&out).expect("write");
        }
        fn respond(&mut self, cid: u16, result: u64) {
            let cqe = Cqe { result, cid, status: Status::SUCCESS, ..Default::default() };
            self.send(PduHeader::CapsuleResp(CapsuleResp { cqe }), &[]);
        }
        fn command(&mut self) -> (u16, Vec<u8>) {
            let (PduHeader::CapsuleCmd(c), data) = self.recv() else { panic!("expected a command capsule") };
            (c.sqe.cid(), data)
        }
    }

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut p = Peer { s, buf: Vec::new(), framer: Framer::new(Role::Target, 1 << 20) };
        let (PduHeader::IcReq(_), _) = p.recv() else { panic!("expected ICReq") };
        p.send(PduHeader::IcResp(IcResp { pfv: 0, cpda: 0, hdgst: false, ddgst: false, maxh2cdata: 65536 }), &[]);
        let (cid, _) = p.command(); // Connect: authentication required
        p.respond(cid, CONNECT_AUTHREQ_ATR | 1);
        let (cid, data) = p.command(); // AUTH_Send Negotiate
        let Message::Negotiate(n) = Message::decode(&data).expect("negotiate") else { panic!("expected Negotiate") };
        p.respond(cid, 0);
        let (cid, _) = p.command(); // AUTH_Receive: the Challenge
        let challenge = Message::Challenge(Challenge {
            t_id: n.t_id,
            hash_id: HashId::Sha256.id(),
            dhgroup_id: DhGroup::Null.id(),
            seqnum: 1,
            challenge: vec![0x5a; 32],
            dh_value: Vec::new(),
        })
        .encode();
        let mut challenge = challenge;
        challenge.resize(MAX_MESSAGE_LEN, 0); // zero-padded to the allocation length, as nvmet
        let len = challenge.len() as u32;
        p.send(PduHeader::C2HData(C2HData { cccid: cid, datao: 0, datal: len, last: true, success: true }), &challenge);
        let (cid, data) = p.command(); // AUTH_Send Reply
        assert!(matches!(Message::decode(&data), Ok(Message::Reply(_))), "expected Reply");
        p.respond(cid, 0);
        let _ = p.command(); // AUTH_Receive for Success1: nvmet has failed the controller
        p.s.shutdown(Shutdown::Both).unwrap();
    });
    let mut opts = ConnectOptions::new(addr.to_string(), HOST);
    opts.dhchap_secret = Some(secret(9, 32, None));
    opts.kato_ms = 0;
    opts.timeout = T;
    let err = match Controller::connect(&opts, NQN) {
        Ok(_) => panic!("connected although the controller closed the connection during authentication"),
        Err(e) => e,
    };
    assert!(peer.join().is_ok(), "the peer script failed; the host said: {err}");
    assert!(matches!(err, Error::Auth(_)), "{err:?}");
    assert!(!err.is_connection_loss(), "{err}");
    assert!(err.to_string().contains("refused authentication"), "{err}");
}
