//! Starts the target in-process on port 0 and talks to it over real sockets.

use nvmf_proto::fabrics::{reg, ConnectCmd, ConnectData, PropertySet, CNTLID_DYNAMIC};
use nvmf_proto::nvme::{admin_opcode, io_opcode, SglDescriptor};
use nvmf_proto::pdu::{encode_pdu, fes, CapsuleCmd, IcReq};
use nvmf_proto::{Cqe, Digests, Framer, PduHeader, Role, Sqe, Status};
use nvmf_target::config::{BackendConfig, NamespaceConfig, PortConfig, SubsystemConfig, TargetConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const SUB: &str = "nqn.2024-01.io.nvmflab:sock";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:sock-host";

fn config() -> TargetConfig {
    let mut c = TargetConfig::empty();
    c.target.cores = vec![0, 0];
    c.target.stats = Some("127.0.0.1:0".parse().unwrap());
    c.ports.push(PortConfig { addr: "127.0.0.1:0".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() });
    let mut s = SubsystemConfig::new(SUB);
    s.namespaces.push(NamespaceConfig {
        nsid: 1,
        backend: BackendConfig::Ram { size: 4 << 20 },
        block_size: 512,
        nguid: None,
        uuid: None,
    });
    c.subsystems.push(s);
    c
}

struct Client {
    s: TcpStream,
    framer: Framer,
    rx: Vec<u8>,
    cid: u16,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Client { s, framer: Framer::new(Role::Host, 1 << 20), rx: Vec::new(), cid: 0 }
    }

    fn send(&mut self, hdr: PduHeader, data: &[u8]) {
        let mut b = Vec::new();
        encode_pdu(&mut b, &hdr, data, Digests::default());
        self.s.write_all(&b).unwrap();
    }

    /// Next PDU, or None if the target closed the connection.
    fn recv(&mut self) -> Option<(PduHeader, Vec<u8>)> {
        loop {
            if let Some(f) = self.framer.next(&self.rx).unwrap() {
                let data = self.rx[f.data.clone()].to_vec();
                self.rx.drain(..f.len);
                return Some((f.header, data));
            }
            let mut buf = [0u8; 65536];
            match self.s.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => self.rx.extend_from_slice(&buf[..n]),
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    fn command(&mut self, mut sqe: Sqe, data: &[u8]) -> (Vec<u8>, Cqe) {
        self.cid += 1;
        sqe.set_cid(self.cid);
        self.send(PduHeader::CapsuleCmd(CapsuleCmd { sqe }), data);
        let mut read = Vec::new();
        loop {
            match self.recv().expect("response") {
                (PduHeader::C2HData(_), d) => read.extend_from_slice(&d),
                (PduHeader::CapsuleResp(r), _) => return (read, r.cqe),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn handshake(&mut self, qid: u16, cntlid: u16) -> Cqe {
        self.send(PduHeader::IcReq(IcReq { pfv: 0, hpda: 0, hdgst: false, ddgst: false, maxr2t: 0 }), &[]);
        assert!(matches!(self.recv(), Some((PduHeader::IcResp(_), _))));
        let mut sqe = ConnectCmd { recfmt: 0, qid, sqsize: 31, cattr: 0, kato: 0 }.to_sqe(0);
        sqe.set_sgl(SglDescriptor::in_capsule(0, 1024));
        let d = ConnectData { hostid: [1; 16], cntlid, subnqn: SUB.into(), hostnqn: HOST.into() };
        self.command(sqe, &d.encode()).1
    }
}

#[test]
fn garbage_on_one_connection_does_not_disturb_another() {
    let t = nvmf_target::start(config()).unwrap();
    let addr = t.listen_addrs()[0];
    assert_ne!(addr.port(), 0, "real port reported");

    let mut bad = Client::connect(addr);
    bad.s.write_all(&[0xEE; 64]).unwrap();
    match bad.recv() {
        Some((PduHeader::C2HTermReq(tr), _)) => assert_eq!(tr.fes, fes::INVALID_PDU_HDR),
        other => panic!("expected TermReq, got {other:?}"),
    }
    assert!(bad.recv().is_none(), "connection closed after TermReq");

    let mut admin = Client::connect(addr);
    let cqe = admin.handshake(0, CNTLID_DYNAMIC);
    assert_eq!(cqe.status, Status::SUCCESS);
    let cntlid = cqe.result as u16;
    let cqe = admin.command(PropertySet { size8: false, offset: reg::CC, value: 0x46_0001 }.to_sqe(0), &[]).1;
    assert_eq!(cqe.status, Status::SUCCESS);
    let mut id = Sqe::new(admin_opcode::IDENTIFY, 0);
    id.set_cdw(10, 1);
    id.set_sgl(SglDescriptor::transport(4096));
    let (data, cqe) = admin.command(id, &[]);
    assert_eq!(cqe.status, Status::SUCCESS);
    assert_eq!(data.len(), 4096);

    let mut io = Client::connect(addr);
    assert_eq!(io.handshake(1, cntlid).status, Status::SUCCESS);
    let payload: Vec<u8> = (0..4096u32).map(|i| i as u8 ^ 0x5A).collect();
    let mut w = Sqe::new(io_opcode::WRITE, 0);
    w.set_nsid(1);
    w.set_nlb(7);
    w.set_sgl(SglDescriptor::in_capsule(0, 4096));
    assert_eq!(io.command(w, &payload).1.status, Status::SUCCESS);
    let mut r = Sqe::new(io_opcode::READ, 0);
    r.set_nsid(1);
    r.set_nlb(7);
    r.set_sgl(SglDescriptor::transport(4096));
    let (back, cqe) = io.command(r, &[]);
    assert_eq!(cqe.status, Status::SUCCESS);
    assert_eq!(back, payload);

    // The stats endpoint saw the I/O queue's read and write.
    let mut http = TcpStream::connect(t.stats_addr().unwrap()).unwrap();
    http.write_all(b"GET /stats HTTP/1.0\r\n\r\n").unwrap();
    let mut resp = String::new();
    http.read_to_string(&mut resp).unwrap();
    let body = &resp[resp.find("\r\n\r\n").unwrap() + 4..];
    let j: serde_json::Value = serde_json::from_str(body).unwrap();
    let queues: Vec<_> = j["reactors"].as_array().unwrap().iter().flat_map(|r| r["queues"].as_array().unwrap().clone()).collect();
    let q1 = queues.iter().find(|q| q["qid"] == 1).expect("I/O queue listed");
    assert_eq!(q1["by_opcode"]["write"], 1);
    assert_eq!(q1["by_opcode"]["read"], 1);
    assert_eq!(q1["bytes_read"], 4096);
    // Every connection that got as far as Connect is counted under its socket's NAPI id: on
    // loopback there is no device queue, so id 0 (the bad one above never sent Connect).
    let napi = j["ports"][0]["napi_ids"].as_object().expect("napi_ids listed");
    assert_eq!(napi.get("0").and_then(|n| n.as_u64()), Some(2), "{napi:?}");
    t.shutdown();
}

#[test]
fn port_in_use_names_the_address() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut c = config();
    c.target.stats = None;
    c.ports[0].addr = holder.local_addr().unwrap();
    let e = nvmf_target::start(c).err().expect("bind fails");
    assert!(e.to_string().contains(&holder.local_addr().unwrap().to_string()), "{e}");
    assert!(!e.is_config_error());
}
