//! What the target's fuzz drivers share (`target_conn`: the NVMe/TCP connection; `target_rdma`:
//! the NVMe/RDMA queue): the per-thread backend engine, a fresh target per input with one
//! subsystem (a RAM and a null namespace), the well-formed Connect and CC.EN a bystander and a
//! fuzzed queue start with, and the hostile command capsules both feed the target.

use crate::script::{pattern, Script};
use nvmf_proto::fabrics::{cc, fctype, reg, ConnectCmd, ConnectData, PropertyGet, PropertySet};
use nvmf_proto::nvme::{admin_opcode, io_opcode, SglDescriptor};
use nvmf_proto::Sqe;
use nvmf_target::backend::IoEngine;
use nvmf_target::config::{BackendConfig, NamespaceConfig, PortConfig, SubsystemConfig, TargetConfig};
use nvmf_target::core::Target;
use std::cell::RefCell;
use std::sync::Arc;

pub const SUBNQN: &str = "nqn.2024-01.io.nvmflab:fuzz";
pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0f0f0f0f-0000-4000-8000-000000000001";
/// Steps per input: bounds the time one input can take.
pub const MAX_STEPS: usize = 64;

thread_local! {
    // One io_uring for the whole run: making one per input would dominate the time.
    static ENGINE: RefCell<IoEngine> = RefCell::new(IoEngine::new(64));
}

/// Runs `f` with this thread's backend engine.
pub fn with_engine(f: impl FnOnce(&mut IoEngine)) {
    ENGINE.with(|e| f(&mut e.borrow_mut()));
}

/// A fresh target per input (controllers and namespaces carry no state between inputs), its
/// configuration adjusted by `tune`.
pub fn target(tune: impl FnOnce(&mut TargetConfig)) -> Arc<Target> {
    let mut c = TargetConfig::empty();
    // A listen address the configuration requires; nothing binds it here.
    c.ports.push(PortConfig { addr: "127.0.0.1:4420".parse().expect("addr"), portid: None, subsystems: None, tls: Default::default() });
    let mut s = SubsystemConfig::new(SUBNQN);
    for (nsid, backend, block_size) in
        [(1, BackendConfig::Ram { size: 64 << 10 }, 512), (2, BackendConfig::Null { size: 1 << 30 }, 4096)]
    {
        s.namespaces.push(NamespaceConfig { nsid, backend, block_size, nguid: None, uuid: None });
    }
    c.subsystems.push(s);
    tune(&mut c);
    c.validate("fuzz").expect("fuzz target config is valid");
    Arc::new(Target::new(c.target.clone(), &c.subsystems, &c.ports).expect("ram and null backends open"))
}

/// A well-formed Connect of queue `qid` to controller `cntlid` (CID 1) and its in-capsule data.
pub fn connect_capsule(qid: u16, cntlid: u16, sqsize: u16) -> (Sqe, Vec<u8>) {
    let mut sqe = ConnectCmd { recfmt: 0, qid, sqsize, cattr: 0, kato: 0 }.to_sqe(1);
    sqe.set_sgl(SglDescriptor::in_capsule(0, 1024));
    let data = ConnectData { hostid: [7; 16], cntlid, subnqn: SUBNQN.into(), hostnqn: HOSTNQN.into() }.encode();
    (sqe, data)
}

/// Property Set CC.EN = 1 (CID 2).
pub fn enable_sqe() -> Sqe {
    let value = (cc::EN | cc::IOSQES_64 | cc::IOCQES_16) as u64;
    PropertySet { size8: false, offset: reg::CC, value }.to_sqe(2)
}

pub fn payload(n: usize, seed: u16) -> Vec<u8> {
    (0..n).map(|i| pattern(seed, i)).collect()
}

/// A command capsule: mostly well-formed commands of every kind the target handles, with
/// lengths, namespaces and SGLs that are right or wrong in the ways hosts get them wrong.
pub fn capsule(s: &mut Script) -> (Sqe, Vec<u8>) {
    const IO: [u8; 6] = [io_opcode::READ, io_opcode::WRITE, io_opcode::FLUSH, io_opcode::WRITE_ZEROES, io_opcode::DATASET_MANAGEMENT, 0x55];
    const ADMIN: [u8; 7] = [
        admin_opcode::IDENTIFY,
        admin_opcode::GET_LOG_PAGE,
        admin_opcode::SET_FEATURES,
        admin_opcode::GET_FEATURES,
        admin_opcode::KEEP_ALIVE,
        admin_opcode::ASYNC_EVENT_REQUEST,
        admin_opcode::ABORT,
    ];
    let cid = s.pick(8) as u16;
    let kind = s.u8();
    let mut sqe = match kind % 4 {
        0 | 1 => Sqe::new(IO[s.pick(IO.len())], cid),
        2 => Sqe::new(ADMIN[s.pick(ADMIN.len())], cid),
        _ => fabrics(s, cid),
    };
    if kind % 4 != 3 {
        sqe.set_nsid([1, 2, 0, 0xFFFF_FFFF, 3][s.pick(5)]);
        sqe.set_slba(s.u16() as u64);
        sqe.set_nlb((s.u8() & 0x3F) as u16);
        if s.bool() {
            // CDW10..CDW15 raw: CNS, log page ids and offsets, feature ids, DSM ranges.
            for n in 10..16 {
                sqe.set_cdw(n, s.u32());
            }
        }
    }
    // SGL: in-capsule with data, or transport (R2T for writes, C2HData for reads).
    let len = match s.pick(4) {
        0 => 0,
        1 => 512 * (1 + s.pick(8)),
        2 => (s.u8() as usize) << 4,
        _ => s.u16() as usize % 9000,
    };
    let in_capsule = s.bool();
    let data = if in_capsule {
        sqe.set_sgl(SglDescriptor::in_capsule(if s.u8() == 0xFF { 8 } else { 0 }, len as u32));
        payload(len, cid)
    } else {
        sqe.set_sgl(SglDescriptor::transport(len as u32));
        Vec::new()
    };
    (sqe, data)
}

fn fabrics(s: &mut Script, cid: u16) -> Sqe {
    match s.pick(4) {
        0 => PropertyGet { size8: s.bool(), offset: [reg::CAP, reg::VS, reg::CC, reg::CSTS, 0x30][s.pick(5)] }.to_sqe(cid),
        1 => PropertySet { size8: s.bool(), offset: [reg::CC, reg::CSTS, reg::NSSR][s.pick(3)], value: s.u32() as u64 }
            .to_sqe(cid),
        2 => nvmf_proto::fabrics::disconnect_sqe(cid),
        _ => {
            let mut sqe = ConnectCmd { recfmt: s.u16() & 1, qid: s.pick(3) as u16, sqsize: s.u16() % 40, cattr: s.u8(), kato: 0 }
                .to_sqe(cid);
            sqe.set_fctype([fctype::CONNECT, fctype::CONNECT, fctype::AUTH_SEND, 0x7E][s.pick(4)]);
            sqe
        }
    }
}
