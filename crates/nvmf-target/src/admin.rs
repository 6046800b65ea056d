//! Admin commands: Identify, Get Log Page, Set/Get Features, Keep Alive, Asynchronous Event
//! Request, Abort. Fabrics commands live in `fabrics`, the discovery log in `discovery`.

use crate::core::{Controller, Namespace, Outcome, Subsystem, Target, AERL, MAX_IO_QUEUES, MDTS, MQES};
use crate::fabrics::VERSION;
use crate::capabilities::{Capabilities, SGLS_KEYED_DATA_BLOCK};
use nvmf_proto::fabrics::DISCOVERY_NQN;
use nvmf_proto::identify::{
    cntrltype, encode_ns_descriptors, encode_ns_list, nidt, oncs, sgls, vwc, IdentifyController, IdentifyNamespace,
    NsDescriptor, IDENTIFY_LEN,
};
use nvmf_proto::nvme::{admin_opcode, cns, feature, io_opcode, log_page};
use nvmf_proto::{Sqe, Status};
use std::sync::atomic::Ordering::Relaxed;

/// Per-queue facts the admin commands need from the transport.
pub struct AdminContext<'a> {
    pub target: &'a Target,
    /// What the queue's transport supports (SGL types, in-capsule size).
    pub caps: &'a Capabilities,
    pub ctrl: &'a Controller,
    /// The controller's subsystem as this queue sees it now (namespaces added or removed at
    /// run time included); `None` for a discovery controller.
    pub subsys: Option<&'a Subsystem>,
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
    match (cns, cx.subsys) {
        (cns::CONTROLLER, _) => Outcome::Data(identify_controller(cx.target, cx.caps, ctrl).encode()),
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
            let nsids: Vec<u32> =
                s.namespaces.iter().filter(|n| n.enabled()).map(|n| n.nsid).filter(|n| *n > after).take(1024).collect();
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

pub fn identify_controller(target: &Target, caps: &Capabilities, ctrl: &Controller) -> IdentifyController {
    let icds = caps.in_capsule_data_size;
    // NN from the subsystem as it is now: a namespace added at run time is within it.
    let now = ctrl.subsys.as_ref().map(|s| target.subsystem(&s.nqn).unwrap_or_else(|| s.clone()));
    let (sn, mn, nn, subnqn, kind) = match &now {
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
        // Bit 8: Namespace Attribute Notices (raised when the control surface changes a
        // namespace; Linux then rescans). The only event this controller raises.
        oaes: if io { crate::core::AEN_NS_ATTR } else { 0 },
        // Bit 1: the Commands Supported and Effects page (I/O controllers, as nvmet); bit 2:
        // extended data for Get Log Page (LPOL/LPOU offsets).
        lpa: if io { 1 << 1 | 1 << 2 } else { 1 << 2 },
        elpe: 0,
        kas: 1,
        sqes: if io { 0x66 } else { 0 },
        cqes: if io { 0x44 } else { 0 },
        maxcmd: MQES + 1,
        nn,
        oncs: if io { oncs::DSM | oncs::WRITE_ZEROES } else { 0 },
        vwc: if has_volatile_cache(ctrl) { vwc::PRESENT | vwc::FLUSH_ALL_NSID } else { 0 },
        // Keyed SGLs where the transport takes them (RDMA: nvmet's NVMF_KEYED_SGLS flag).
        sgls: sgls::SUPPORTED | sgls::OFFSET | if caps.keyed_sgls { SGLS_KEYED_DATA_BLOCK } else { 0 },
        subnqn,
        ioccsz: if io { (64 + icds) / 16 } else { 0 },
        iorcsz: if io { 1 } else { 0 },
        icdoff: 0,
        msdbd: 1,
        ..Default::default()
    }
}

/// True when a namespace of the controller's subsystem can lose completed writes without a
/// Flush (a file backend); null and ram namespaces have no cache to flush.
fn has_volatile_cache(ctrl: &Controller) -> bool {
    ctrl.subsys.iter().flat_map(|s| s.namespaces.iter()).any(|n| n.backend.volatile_cache())
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
        // CDW10 bit 15, RAE: the host keeps the event masked (it reads the page again later).
        (log_page::CHANGED_NS_LIST, false) => cx.ctrl.take_changed_ns_log(sqe.cdw(10) & 1 << 15 != 0),
        (log_page::COMMANDS_SUPPORTED, false) => commands_supported_and_effects(),
        _ => return Outcome::status(Status::INVALID_LOG_PAGE.with_dnr()),
    };
    // The host gets exactly `len` bytes from `offset`; past the end of the page it reads zeroes.
    // `len` is the host's (bounded by MDTS above); without memory only this command fails.
    let mut out = Vec::new();
    if out.try_reserve_exact(len as usize).is_err() {
        tracing::warn!(len, "no memory for a Get Log Page buffer");
        return Outcome::status(Status::INTERNAL_ERROR);
    }
    out.resize(len as usize, 0);
    if offset < page.len() as u64 {
        let from = &page[offset as usize..];
        let n = from.len().min(out.len());
        out[..n].copy_from_slice(&from[..n]);
    }
    Outcome::Data(out)
}

/// Commands Supported and Effects (LID 05h): which admin and I/O opcodes this controller runs,
/// and which of them change logical block content, as `execute` above and the I/O command
/// layer dispatch them (the same table Linux nvmet reports). `nvme effects-log` reads it.
fn commands_supported_and_effects() -> Vec<u8> {
    const CSUPP: u32 = 1 << 0;
    const LBCC: u32 = 1 << 1;
    let admin = [
        admin_opcode::GET_LOG_PAGE,
        admin_opcode::IDENTIFY,
        admin_opcode::ABORT,
        admin_opcode::SET_FEATURES,
        admin_opcode::GET_FEATURES,
        admin_opcode::ASYNC_EVENT_REQUEST,
        admin_opcode::KEEP_ALIVE,
    ];
    let io = [
        (io_opcode::READ, CSUPP),
        (io_opcode::FLUSH, CSUPP),
        (io_opcode::DATASET_MANAGEMENT, CSUPP),
        (io_opcode::WRITE, CSUPP | LBCC),
        (io_opcode::WRITE_ZEROES, CSUPP | LBCC),
    ];
    let mut page = vec![0u8; 4096];
    let mut put = |index: usize, effects: u32| page[index * 4..index * 4 + 4].copy_from_slice(&effects.to_le_bytes());
    admin.iter().for_each(|&op| put(op as usize, CSUPP));
    io.iter().for_each(|&(op, effects)| put(256 + op as usize, effects));
    page
}

/// Temperature Threshold default (Kelvin): over-temperature 343 K (70 °C) for the composite
/// temperature, no under-temperature threshold. Values the host may read and change.
pub const DEFAULT_OVER_TEMP_K: u32 = 0x0157;
/// Arbitration default: AB = 7 (no burst limit), weights 0 (round robin only: CAP.AMS is 0).
pub const DEFAULT_ARBITRATION: u32 = 0x7;
/// Asynchronous events a host may enable (as Linux nvmet's NVMET_AEN_CFG_ALL): the SMART
/// critical warnings, Namespace Attribute Notices and ANA Change Notices.
pub const AEN_CFG_ALL: u32 = 0x1F | 1 << 8 | 1 << 11;
/// On a discovery controller: Discovery Log Page Change Notices only.
pub const DISC_AEN_CFG_ALL: u32 = 1 << 31;

/// Set Features. Like Linux nvmet on a fabrics (TCP) port, only Number of Queues, Keep Alive
/// Timer and Asynchronous Event Configuration change anything; Host Identifier cannot be set
/// after Connect (Command Sequence Error); everything else is Invalid Field. Nothing is saveable.
fn set_features(ctrl: &Controller, sqe: &Sqe) -> Outcome {
    if sqe.cdw(10) & (1 << 31) != 0 {
        return Outcome::status(Status::FEATURE_NOT_SAVEABLE.with_dnr());
    }
    let value = sqe.cdw(11);
    match ((sqe.cdw(10) & 0xFF) as u8, ctrl.is_discovery()) {
        (feature::NUMBER_OF_QUEUES, false) => {
            let (nsqr, ncqr) = (value & 0xFFFF, value >> 16);
            if nsqr == 0xFFFF || ncqr == 0xFFFF {
                return invalid_field();
            }
            let max = max_io_queues(ctrl) - 1;
            let granted = (ncqr.min(max) << 16) | nsqr.min(max);
            ctrl.num_queues.store(granted, Relaxed);
            Outcome::success(granted as u64)
        }
        (feature::KEEP_ALIVE_TIMER, _) => {
            // nvmet keeps whole seconds (rounded up) and answers them in DW0.
            let secs = value.div_ceil(1000);
            ctrl.kato_ms.store(secs.saturating_mul(1000), Relaxed);
            Outcome::success(secs as u64)
        }
        (feature::ASYNC_EVENT_CONFIG, disc) => {
            if value & !if disc { DISC_AEN_CFG_ALL } else { AEN_CFG_ALL } != 0 {
                return invalid_field();
            }
            ctrl.aec.store(value, Relaxed);
            Outcome::success(value as u64)
        }
        (feature::HOST_IDENTIFIER, false) => Outcome::status(Status::CMD_SEQ_ERROR.with_dnr()),
        _ => invalid_field(),
    }
}

/// I/O queues the controller may have: its subsystem's `attr_qid_max` (a change ends the
/// subsystem's controllers, so the value a controller connected with is the current one).
fn max_io_queues(ctrl: &Controller) -> u32 {
    ctrl.subsys.as_ref().map_or(MAX_IO_QUEUES, |s| s.max_qid) as u32
}

/// What a Get Features answers for one feature.
enum FeatureValue {
    /// DW0, default DW0 and whether Set Features can change it.
    Dword { current: u32, default: u32, changeable: bool },
    /// Data to the host (Host Identifier).
    Data(Vec<u8>),
}

/// Get Features with SEL: current, default, saved (= default: nothing is saveable) and
/// supported capabilities. Answers what Linux nvmet answers (Volatile Write Cache, enabled when present,
/// Number of Queues, Keep Alive Timer in ms, Async Event Configuration, the 128-bit Host
/// Identifier, refused without EXHID) and, where nvmet has no value, the specification's
/// defaults for a controller without those mechanisms: Arbitration (no burst limit), Power
/// Management (power state 0, the only one), Temperature Threshold (composite sensor only),
/// Error Recovery (TLER 0) and Write Atomicity Normal (0). Interrupt Coalescing and Interrupt
/// Vector Configuration do not apply to fabrics: Invalid Field, as nvmet. A discovery
/// controller has only Keep Alive Timer and Async Event Configuration.
fn get_features(ctrl: &Controller, sqe: &Sqe) -> Outcome {
    let sel = ((sqe.cdw(10) >> 8) & 0x7) as u8;
    let cdw11 = sqe.cdw(11);
    let value = match ((sqe.cdw(10) & 0xFF) as u8, ctrl.is_discovery()) {
        (feature::KEEP_ALIVE_TIMER, _) => {
            FeatureValue::Dword { current: ctrl.kato_ms.load(Relaxed), default: 0, changeable: true }
        }
        (feature::ASYNC_EVENT_CONFIG, _) => {
            FeatureValue::Dword { current: ctrl.aec.load(Relaxed), default: 0, changeable: true }
        }
        (_, true) => return invalid_field(),
        (feature::ARBITRATION, _) => {
            FeatureValue::Dword { current: DEFAULT_ARBITRATION, default: DEFAULT_ARBITRATION, changeable: false }
        }
        (feature::POWER_MANAGEMENT, _) => FeatureValue::Dword { current: 0, default: 0, changeable: false },
        (feature::TEMPERATURE_THRESHOLD, _) => {
            let (tmpsel, thsel) = ((cdw11 >> 16) & 0xF, (cdw11 >> 20) & 0x3);
            // Only the composite temperature (TMPSEL 0) exists; THSEL 0 over, 1 under.
            let v = match (tmpsel, thsel) {
                (0, 0) => DEFAULT_OVER_TEMP_K,
                (0, 1) => 0,
                _ => return invalid_field(),
            };
            FeatureValue::Dword { current: v, default: v, changeable: false }
        }
        (feature::ERROR_RECOVERY, _) => FeatureValue::Dword { current: 0, default: 0, changeable: false },
        // Enabled exactly when present (it cannot be turned off), as Identify VWC says.
        (feature::VOLATILE_WRITE_CACHE, _) => {
            let on = has_volatile_cache(ctrl) as u32;
            FeatureValue::Dword { current: on, default: on, changeable: false }
        }
        (feature::NUMBER_OF_QUEUES, _) => {
            let max = max_io_queues(ctrl) - 1;
            FeatureValue::Dword { current: ctrl.num_queues.load(Relaxed), default: max << 16 | max, changeable: true }
        }
        (feature::WRITE_ATOMICITY_NORMAL, _) => FeatureValue::Dword { current: 0, default: 0, changeable: false },
        (feature::HOST_IDENTIFIER, _) => {
            // 128-bit host identifiers only (EXHID, CDW11 bit 0), as nvmet.
            if cdw11 & 1 == 0 {
                return invalid_field();
            }
            FeatureValue::Data(ctrl.hostid.to_vec())
        }
        _ => return invalid_field(),
    };
    match (sel, value) {
        (feature::sel::CURRENT, FeatureValue::Dword { current, .. }) => Outcome::success(current as u64),
        (feature::sel::DEFAULT | feature::sel::SAVED, FeatureValue::Dword { default, .. }) => {
            Outcome::success(default as u64)
        }
        (feature::sel::CURRENT | feature::sel::DEFAULT | feature::sel::SAVED, FeatureValue::Data(d)) => Outcome::Data(d),
        (feature::sel::SUPPORTED_CAPABILITIES, FeatureValue::Dword { changeable, .. }) => {
            Outcome::success(if changeable { feature::capability::CHANGEABLE as u64 } else { 0 })
        }
        (feature::sel::SUPPORTED_CAPABILITIES, FeatureValue::Data(_)) => Outcome::success(0),
        _ => invalid_field(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BackendConfig, NamespaceConfig, SubsystemConfig, TargetSettings};
    use crate::core::MAX_TRANSFER;
    use std::sync::Arc;
    use std::time::Instant;

    const HOSTID: [u8; 16] = [7; 16];

    fn controller(discovery: bool) -> Arc<Controller> {
        let mut sub = SubsystemConfig::new("nqn.2024-01.io.nvmflab:features");
        sub.namespaces.push(NamespaceConfig {
            nsid: 1,
            backend: BackendConfig::Null { size: 1 << 20 },
            block_size: 512,
            nguid: None,
            uuid: None,
        });
        let t = Target::new(TargetSettings::default(), &[sub], &[]).unwrap();
        let subsys = if discovery { None } else { Some(t.subsystems()[0].clone()) };
        t.create_controller(subsys, "nqn.host", HOSTID, 5000, Instant::now()).unwrap()
    }

    fn sqe(opcode: u8, cdw10: u32, cdw11: u32) -> Sqe {
        let mut s = Sqe::new(opcode, 1);
        s.set_cdw(10, cdw10);
        s.set_cdw(11, cdw11);
        s
    }

    fn get(c: &Controller, fid: u8, sel: u8, cdw11: u32) -> Outcome {
        get_features(c, &sqe(admin_opcode::GET_FEATURES, (sel as u32) << 8 | fid as u32, cdw11))
    }

    fn set(c: &Controller, fid: u8, cdw11: u32) -> Outcome {
        set_features(c, &sqe(admin_opcode::SET_FEATURES, fid as u32, cdw11))
    }

    fn ok(v: u64) -> Outcome {
        Outcome::success(v)
    }

    #[test]
    fn arbitration_power_management_and_error_recovery_have_fixed_values() {
        let c = controller(false);
        assert_eq!(get(&c, feature::ARBITRATION, 0, 0), ok(7), "AB 7: no burst limit");
        assert_eq!(get(&c, feature::POWER_MANAGEMENT, 0, 0), ok(0), "power state 0");
        assert_eq!(get(&c, feature::ERROR_RECOVERY, 0, 0), ok(0));
        assert_eq!(get(&c, feature::WRITE_ATOMICITY_NORMAL, 0, 0), ok(0));
        for fid in [feature::ARBITRATION, feature::POWER_MANAGEMENT, feature::ERROR_RECOVERY, feature::WRITE_ATOMICITY_NORMAL] {
            assert_eq!(get(&c, fid, feature::sel::SUPPORTED_CAPABILITIES, 0), ok(0), "{fid:#x}: not changeable, not saveable");
            assert_eq!(get(&c, fid, feature::sel::DEFAULT, 0), get(&c, fid, 0, 0));
            assert_eq!(get(&c, fid, feature::sel::SAVED, 0), get(&c, fid, 0, 0));
            assert_eq!(set(&c, fid, 0), invalid_field(), "{fid:#x}: nvmet refuses Set on TCP");
        }
    }

    #[test]
    fn temperature_threshold_selects_sensor_and_threshold() {
        let c = controller(false);
        let f = feature::TEMPERATURE_THRESHOLD;
        assert_eq!(get(&c, f, 0, 0), ok(DEFAULT_OVER_TEMP_K as u64), "composite, over");
        assert_eq!(get(&c, f, 0, 1 << 20), ok(0), "composite, under");
        assert_eq!(get(&c, f, 0, 1 << 16), invalid_field(), "sensor 1 does not exist");
        assert_eq!(get(&c, f, 0, 2 << 20), invalid_field(), "THSEL 2 is reserved");
        assert_eq!(get(&c, f, feature::sel::DEFAULT, 0), ok(DEFAULT_OVER_TEMP_K as u64));
    }

    /// A controller of a subsystem with one namespace on `backend`.
    fn controller_on(backend: BackendConfig) -> (Target, Arc<Controller>) {
        let mut sub = SubsystemConfig::new("nqn.2024-01.io.nvmflab:vwc");
        sub.namespaces.push(NamespaceConfig { nsid: 1, backend, block_size: 512, nguid: None, uuid: None });
        let t = Target::new(TargetSettings::default(), &[sub], &[]).unwrap();
        let c = t.create_controller(Some(t.subsystems()[0].clone()), "nqn.host", HOSTID, 0, Instant::now()).unwrap();
        (t, c)
    }

    /// The capabilities of an NVMe/TCP queue under default settings.
    const TCP: Capabilities = Capabilities {
        kind: crate::capabilities::TransportKind::Tcp,
        trtype: nvmf_proto::discovery::TRTYPE_TCP,
        transfer_sgl: nvmf_proto::nvme::SGL_TRANSPORT_DATA_BLOCK,
        keyed_sgls: false,
        in_capsule_data_size: 8192,
        secure_channel: true,
        tsas: [0; 3],
    };

    #[test]
    fn identify_controller_sgl_support_and_ioccsz_come_from_the_transport() {
        use crate::capabilities::TransportKind;
        let (t, c) = controller_on(BackendConfig::Ram { size: 1 << 20 });
        let settings = TargetSettings { in_capsule_data_size: 4096, ..TargetSettings::default() };
        let tcp = identify_controller(&t, &TransportKind::Tcp.capabilities(&settings), &c);
        assert_eq!(tcp.sgls, sgls::SUPPORTED | sgls::OFFSET, "TCP: no keyed SGLs");
        assert_eq!(tcp.ioccsz, (64 + 4096) / 16);
        let rdma = identify_controller(&t, &TransportKind::Rdma.capabilities(&settings), &c);
        assert_eq!(rdma.sgls, sgls::SUPPORTED | sgls::OFFSET | SGLS_KEYED_DATA_BLOCK, "RDMA: keyed SGL data blocks");
        assert_eq!(rdma.encode()[536], 0x05, "SGLS byte 536: bits 0 and 2");
        assert_eq!(TransportKind::Tcp.capabilities(&TargetSettings::default()), TCP);
    }

    #[test]
    fn volatile_write_cache_is_reported_only_where_a_flush_matters() {
        let (t, c) = controller_on(BackendConfig::Ram { size: 1 << 20 });
        assert_eq!(identify_controller(&t, &TCP, &c).vwc, 0, "ram: nothing to flush to");
        assert_eq!(get(&c, feature::VOLATILE_WRITE_CACHE, 0, 0), ok(0));
        let (t, c) = controller_on(BackendConfig::Null { size: 1 << 20 });
        assert_eq!(identify_controller(&t, &TCP, &c).vwc, 0, "null stores nothing");

        let dir = std::env::temp_dir().join(format!("nvmf-target-vwc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("disk.img");
        std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
        let (t, c) = controller_on(BackendConfig::File { path });
        let id = identify_controller(&t, &TCP, &c);
        assert_eq!(id.vwc & vwc::PRESENT, vwc::PRESENT, "a file has the page cache or the device's cache");
        assert_eq!(id.vwc & vwc::FLUSH_ALL_NSID, vwc::FLUSH_ALL_NSID, "broadcast Flush supported");
        assert_eq!(get(&c, feature::VOLATILE_WRITE_CACHE, 0, 0), ok(1));
        assert_eq!(set(&c, feature::VOLATILE_WRITE_CACHE, 0), invalid_field(), "as nvmet: cannot be turned off");
        drop((t, c));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn number_of_queues_keep_alive_and_async_events_round_trip() {
        let c = controller(false);
        assert_eq!(get(&c, feature::NUMBER_OF_QUEUES, 0, 0), ok(0x007F_007F));
        assert_eq!(set(&c, feature::NUMBER_OF_QUEUES, 0x0001_0003), ok(0x0001_0003));
        assert_eq!(get(&c, feature::NUMBER_OF_QUEUES, 0, 0), ok(0x0001_0003));
        assert_eq!(get(&c, feature::NUMBER_OF_QUEUES, feature::sel::DEFAULT, 0), ok(0x007F_007F));
        assert_eq!(get(&c, feature::NUMBER_OF_QUEUES, feature::sel::SUPPORTED_CAPABILITIES, 0), ok(4));
        assert_eq!(set(&c, feature::NUMBER_OF_QUEUES, 0xFFFF), invalid_field());

        assert_eq!(get(&c, feature::KEEP_ALIVE_TIMER, 0, 0), ok(5000));
        assert_eq!(set(&c, feature::KEEP_ALIVE_TIMER, 1500), ok(2), "whole seconds, rounded up, in DW0");
        assert_eq!(get(&c, feature::KEEP_ALIVE_TIMER, 0, 0), ok(2000));

        assert_eq!(set(&c, feature::ASYNC_EVENT_CONFIG, 1 << 8), ok(1 << 8));
        assert_eq!(get(&c, feature::ASYNC_EVENT_CONFIG, 0, 0), ok(1 << 8));
        assert_eq!(set(&c, feature::ASYNC_EVENT_CONFIG, 1 << 9), invalid_field(), "an event we never raise");

        let mut save = sqe(admin_opcode::SET_FEATURES, 1 << 31 | feature::KEEP_ALIVE_TIMER as u32, 1000);
        save.set_cdw(11, 1000);
        assert_eq!(set_features(&c, &save), Outcome::status(Status::FEATURE_NOT_SAVEABLE.with_dnr()));
    }

    #[test]
    fn host_identifier_needs_exhid_and_cannot_be_set() {
        let c = controller(false);
        assert_eq!(get(&c, feature::HOST_IDENTIFIER, 0, 1), Outcome::Data(HOSTID.to_vec()));
        assert_eq!(get(&c, feature::HOST_IDENTIFIER, 0, 0), invalid_field(), "64-bit host identifiers are not supported");
        assert_eq!(set(&c, feature::HOST_IDENTIFIER, 1), Outcome::status(Status::CMD_SEQ_ERROR.with_dnr()));
    }

    fn log_page(c: &Controller, lid: u8, numd: u64, offset: u64) -> Outcome {
        let t = Target::new(TargetSettings::default(), &[], &[]).unwrap();
        let cx = AdminContext { target: &t, caps: &TCP, ctrl: c, subsys: c.subsys.as_deref(), held_aers: 0 };
        let mut s = sqe(admin_opcode::GET_LOG_PAGE, (((numd - 1) & 0xFFFF) << 16) as u32 | lid as u32, ((numd - 1) >> 16) as u32);
        s.set_cdw(12, offset as u32);
        s.set_cdw(13, (offset >> 32) as u32);
        get_log_page(&cx, &s)
    }

    #[test]
    fn commands_supported_and_effects_lists_exactly_the_admin_commands_executed() {
        let c = controller(false);
        let Outcome::Data(page) = log_page(&c, log_page::COMMANDS_SUPPORTED, 1024, 0) else { panic!("no page") };
        let entry = |i: usize| u32::from_le_bytes(page[i * 4..i * 4 + 4].try_into().unwrap());
        let t = Target::new(TargetSettings::default(), &[], &[]).unwrap();
        let cx = AdminContext { target: &t, caps: &TCP, ctrl: &c, subsys: c.subsys.as_deref(), held_aers: 0 };
        for op in 0..=255u8 {
            // Fabrics commands (7Fh) are routed before admin execution and are not in the page.
            if op == admin_opcode::FABRICS {
                continue;
            }
            let refused = execute(&cx, &sqe(op, 0, 0)) == Outcome::status(Status::INVALID_OPCODE.with_dnr());
            assert_eq!(entry(op as usize) & 1 == 1, !refused, "admin opcode {op:#04x}");
        }
        assert_eq!(entry(256 + io_opcode::WRITE as usize), 0b11, "write: supported, changes block content");
        assert_eq!(entry(256 + io_opcode::READ as usize), 0b01);
        assert_eq!(entry(256 + 0x7E), 0, "an unknown I/O opcode");
        let discovery = controller(true);
        assert_eq!(
            log_page(&discovery, log_page::COMMANDS_SUPPORTED, 1024, 0),
            Outcome::status(Status::INVALID_LOG_PAGE.with_dnr()),
            "not on a discovery controller"
        );
    }

    #[test]
    fn get_log_page_sizes_from_the_host_are_bounded() {
        let c = controller(false);
        // NUMD at its maximum asks for 16 GiB: refused before anything is allocated.
        assert_eq!(log_page(&c, log_page::SMART_HEALTH, 1 << 32, 0), invalid_field());
        assert_eq!(log_page(&c, log_page::SMART_HEALTH, (MAX_TRANSFER as u64 / 4) + 1, 0), invalid_field(), "just over MDTS");
        match log_page(&c, log_page::SMART_HEALTH, MAX_TRANSFER as u64 / 4, u64::MAX - 3) {
            Outcome::Data(d) => assert!(d.len() == MAX_TRANSFER as usize && d.iter().all(|b| *b == 0), "past the end: zeroes"),
            other => panic!("{other:?}"),
        }
        match log_page(&c, log_page::SMART_HEALTH, 128, 0) {
            Outcome::Data(d) => assert_eq!((d.len(), d[3]), (512, 100), "512 bytes, available spare 100%"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn pcie_only_unknown_and_reserved_selects_are_invalid_field() {
        let c = controller(false);
        for fid in [feature::INTERRUPT_COALESCING, feature::INTERRUPT_VECTOR_CONFIG, feature::TIMESTAMP, 0x03, 0x7F, 0xFF] {
            assert_eq!(get(&c, fid, 0, 0), invalid_field(), "{fid:#x}");
            assert_eq!(set(&c, fid, 0), invalid_field(), "{fid:#x}");
        }
        assert_eq!(get(&c, feature::ARBITRATION, 4, 0), invalid_field(), "SEL 4 is reserved");
    }

    #[test]
    fn a_discovery_controller_has_only_keep_alive_and_async_events() {
        let c = controller(true);
        assert_eq!(get(&c, feature::KEEP_ALIVE_TIMER, 0, 0), ok(5000));
        assert_eq!(set(&c, feature::ASYNC_EVENT_CONFIG, 1 << 31), ok(1 << 31));
        assert_eq!(set(&c, feature::ASYNC_EVENT_CONFIG, 1 << 8), invalid_field());
        for fid in [feature::ARBITRATION, feature::NUMBER_OF_QUEUES, feature::VOLATILE_WRITE_CACHE] {
            assert_eq!(get(&c, fid, 0, 0), invalid_field(), "{fid:#x}");
        }
    }
}
