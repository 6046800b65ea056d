//! Admin commands: Identify, Get Log Page, Set/Get Features, Keep Alive, Asynchronous Event
//! Request, Abort. Fabrics commands live in `fabrics`, the discovery log in `discovery`.

use crate::core::{Controller, Namespace, Outcome, Target, AERL, MAX_IO_QUEUES, MDTS, MQES};
use crate::fabrics::VERSION;
use nvmf_proto::fabrics::DISCOVERY_NQN;
use nvmf_proto::identify::{
    cntrltype, encode_ns_descriptors, encode_ns_list, nidt, oncs, sgls, IdentifyController, IdentifyNamespace,
    NsDescriptor, IDENTIFY_LEN,
};
use nvmf_proto::nvme::{admin_opcode, cns, feature, log_page};
use nvmf_proto::{Sqe, Status};
use std::sync::atomic::Ordering::Relaxed;

/// Per-queue facts the admin commands need from the transport.
pub struct AdminContext<'a> {
    pub target: &'a Target,
    pub ctrl: &'a Controller,
    /// AERs this queue already holds.
    pub held_aers: usize,
}

fn invalid_field() -> Outcome {
    Outcome::status(Status::INVALID_FIELD.with_dnr())
}

pub fn execute(cx: &AdminContext, sqe: &Sqe) -> Outcome {
    let ctrl = cx.ctrl;
    match sqe.opcode() {
        admin_opcode::IDENTIFY => identify(cx, sqe),
        admin_opcode::GET_LOG_PAGE => get_log_page(cx, sqe),
        admin_opcode::SET_FEATURES => set_features(ctrl, sqe),
        admin_opcode::GET_FEATURES => get_features(ctrl, sqe),
        // Activity was already recorded when the command arrived.
        admin_opcode::KEEP_ALIVE => Outcome::success(0),
        admin_opcode::ASYNC_EVENT_REQUEST => {
            if cx.held_aers > AERL as usize {
                Outcome::status(Status::AER_LIMIT_EXCEEDED)
            } else {
                Outcome::Hold
            }
        }
        // Commands complete too fast to abort: DW0 bit 0 = 1 means "not aborted".
        admin_opcode::ABORT if !ctrl.is_discovery() => Outcome::success(1),
        _ => Outcome::status(Status::INVALID_OPCODE.with_dnr()),
    }
}

fn identify(cx: &AdminContext, sqe: &Sqe) -> Outcome {
    let ctrl = cx.ctrl;
    let cns = (sqe.cdw(10) & 0xFF) as u8;
    match (cns, &ctrl.subsys) {
        (cns::CONTROLLER, _) => Outcome::Data(identify_controller(cx.target, ctrl).encode()),
        (cns::NAMESPACE, Some(s)) => match sqe.nsid() {
            0 | u32::MAX => Outcome::status(Status::INVALID_NS.with_dnr()),
            // An inactive nsid returns a zero-filled structure (NVMe Base "Identify").
            nsid => Outcome::Data(match s.namespace(nsid) {
                Some((_, ns)) => identify_namespace(ns).encode(),
                None => vec![0; IDENTIFY_LEN],
            }),
        },
        (cns::ACTIVE_NS_LIST, Some(s)) => {
            let after = sqe.nsid();
            if after >= 0xFFFF_FFFE {
                return Outcome::status(Status::INVALID_NS.with_dnr());
            }
            let nsids: Vec<u32> = s.namespaces.iter().map(|n| n.nsid).filter(|n| *n > after).take(1024).collect();
            Outcome::Data(encode_ns_list(&nsids))
        }
        (cns::NS_DESCRIPTORS, Some(s)) => match s.namespace(sqe.nsid()) {
            Some((_, ns)) => Outcome::Data(encode_ns_descriptors(&[
                NsDescriptor { nidt: nidt::EUI64, nid: ns.eui64.to_vec() },
                NsDescriptor { nidt: nidt::NGUID, nid: ns.nguid.to_vec() },
                NsDescriptor { nidt: nidt::UUID, nid: ns.uuid.to_vec() },
                NsDescriptor { nidt: nidt::CSI, nid: vec![0] },
            ])),
            None => Outcome::status(Status::INVALID_NS.with_dnr()),
        },
        _ => invalid_field(),
    }
}

pub fn identify_controller(target: &Target, ctrl: &Controller) -> IdentifyController {
    let icds = target.settings.in_capsule_data_size;
    let (sn, mn, nn, subnqn, kind) = match &ctrl.subsys {
        Some(s) => (
            s.serial.clone(),
            s.model.clone(),
            s.namespaces.last().map_or(0, |n| n.nsid),
            s.nqn.clone(),
            cntrltype::IO,
        ),
        None => ("discovery".into(), "nvmflab discovery".into(), 0, DISCOVERY_NQN.into(), cntrltype::DISCOVERY),
    };
    let io = kind == cntrltype::IO;
    IdentifyController {
        sn,
        mn,
        fr: env!("CARGO_PKG_VERSION").into(),
        // Bit 1: the subsystem may have several controllers. Linux refuses a second controller
        // to a subsystem without it ("duplicate subnqn").
        cmic: if io { 1 << 1 } else { 0 },
        mdts: MDTS,
        cntlid: ctrl.cntlid,
        ver: VERSION,
        cntrltype: kind,
        oacs: 0,
        acl: 3,
        aerl: AERL,
        // Bit 2: extended data for Get Log Page (LPOL/LPOU offsets).
        lpa: 1 << 2,
        elpe: 0,
        kas: 1,
        sqes: if io { 0x66 } else { 0 },
        cqes: if io { 0x44 } else { 0 },
        maxcmd: MQES + 1,
        nn,
        oncs: if io { oncs::DSM | oncs::WRITE_ZEROES } else { 0 },
        vwc: io as u8,
        sgls: sgls::SUPPORTED | sgls::OFFSET,
        subnqn,
        ioccsz: if io { (64 + icds) / 16 } else { 0 },
        iorcsz: if io { 1 } else { 0 },
        icdoff: 0,
        msdbd: 1,
        ..Default::default()
    }
}

pub fn identify_namespace(ns: &Namespace) -> IdentifyNamespace {
    IdentifyNamespace {
        nsze: ns.nlb,
        ncap: ns.nlb,
        nuse: ns.nlb,
        nlbaf: 0,
        flbas: 0,
        // Deallocated blocks read as zeroes.
        dlfeat: 1,
        // Bit 0: may be attached to several controllers (every controller of the subsystem sees
        // it); Linux refuses a second path to an unshared namespace.
        nmic: 1,
        nguid: ns.nguid,
        eui64: ns.eui64,
        lbads: ns.lbads,
        ..Default::default()
    }
}

fn get_log_page(cx: &AdminContext, sqe: &Sqe) -> Outcome {
    let lid = (sqe.cdw(10) & 0xFF) as u8;
    let numd = ((sqe.cdw(11) & 0xFFFF) << 16 | sqe.cdw(10) >> 16) as u64 + 1;
    let len = numd * 4;
    let offset = (sqe.cdw(13) as u64) << 32 | sqe.cdw(12) as u64;
    if offset % 4 != 0 || len > crate::core::MAX_TRANSFER as u64 {
        return invalid_field();
    }
    let page = match (lid, cx.ctrl.is_discovery()) {
        (log_page::DISCOVERY, true) => crate::discovery::log_page(cx.target, &cx.ctrl.hostnqn),
        (log_page::ERROR_INFO, false) => vec![0; 64],
        (log_page::SMART_HEALTH, false) => {
            let mut p = vec![0; 512];
            p[3] = 100; // available spare, percent
            p[4] = 10; // available spare threshold
            p
        }
        (log_page::FIRMWARE_SLOT, false) => {
            let mut p = vec![0; 512];
            p[0] = 1; // active slot 1
            let fr = env!("CARGO_PKG_VERSION").as_bytes();
            p[8..8 + fr.len().min(8)].copy_from_slice(&fr[..fr.len().min(8)]);
            p
        }
        (log_page::CHANGED_NS_LIST, false) => vec![0; 4096],
        _ => return Outcome::status(Status::INVALID_LOG_PAGE.with_dnr()),
    };
    // The host gets exactly `len` bytes from `offset`; past the end of the page it reads zeroes.
    let mut out = vec![0u8; len as usize];
    if offset < page.len() as u64 {
        let from = &page[offset as usize..];
        let n = from.len().min(out.len());
        out[..n].copy_from_slice(&from[..n]);
    }
    Outcome::Data(out)
}

fn set_features(ctrl: &Controller, sqe: &Sqe) -> Outcome {
    if sqe.cdw(10) & (1 << 31) != 0 {
        return Outcome::status(Status::FEATURE_NOT_SAVEABLE.with_dnr());
    }
    let value = sqe.cdw(11);
    match (sqe.cdw(10) & 0xFF) as u8 {
        feature::NUMBER_OF_QUEUES if !ctrl.is_discovery() => {
            let (nsqr, ncqr) = (value & 0xFFFF, value >> 16);
            if nsqr == 0xFFFF || ncqr == 0xFFFF {
                return invalid_field();
            }
            let max = MAX_IO_QUEUES as u32 - 1;
            let granted = (ncqr.min(max) << 16) | nsqr.min(max);
            ctrl.num_queues.store(granted, Relaxed);
            Outcome::success(granted as u64)
        }
        feature::KEEP_ALIVE_TIMER => {
            ctrl.kato_ms.store(value, Relaxed);
            Outcome::success(0)
        }
        feature::ASYNC_EVENT_CONFIG => {
            ctrl.aec.store(value, Relaxed);
            Outcome::success(0)
        }
        _ => invalid_field(),
    }
}

fn get_features(ctrl: &Controller, sqe: &Sqe) -> Outcome {
    let value = match (sqe.cdw(10) & 0xFF) as u8 {
        feature::NUMBER_OF_QUEUES if !ctrl.is_discovery() => ctrl.num_queues.load(Relaxed),
        feature::KEEP_ALIVE_TIMER => ctrl.kato_ms.load(Relaxed),
        feature::ASYNC_EVENT_CONFIG => ctrl.aec.load(Relaxed),
        _ => return invalid_field(),
    };
    Outcome::success(value as u64)
}
