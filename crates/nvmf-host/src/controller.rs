//! The controller as the host sees it: the admin queue set up (ICReq, Connect qid 0, CAP/VS,
//! CC.EN and CSTS.RDY), Identify, Set Features, Get Log Page, a Keep Alive thread, clean
//! shutdown, and the parameters I/O queues need to join the same controller.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvmf_proto::fabrics::{cc, csts, reg, PropertyGet, PropertySet, CNTLID_DYNAMIC};
use nvmf_proto::identify::{decode_ns_list, IdentifyController, IdentifyNamespace, IDENTIFY_LEN};
use nvmf_proto::nvme::{admin_opcode, cns, feature};
use nvmf_proto::Sqe;

use crate::connection::{ConnectOptions, Link};
use crate::error::{Error, Result};
use crate::fabrics;
pub use crate::fabrics::IoQueueParams;
use crate::queue::{QueuePair, Xfer};

/// Admin queue entries asked for in Connect (0's based SQSIZE 31), as Linux does.
const ADMIN_SQSIZE: u16 = 31;
/// Admin commands carry up to 8 KiB in the capsule, as the Linux host sends them.
const ADMIN_IN_CAPSULE: usize = 8192;
/// Largest admin data transfer per command; longer log pages are read in pieces.
const ADMIN_MAX_XFER: usize = 64 << 10;

/// Raised by the keep-alive thread when a Keep Alive fails or goes unanswered within KATO: the
/// controller is lost (connection closed or silent). Cheap to check from I/O threads, which have
/// no other way to notice a target that went silent.
#[derive(Debug, Default)]
pub struct LossSignal {
    raised: AtomicBool,
    detail: Mutex<Option<(Instant, String)>>,
}

impl LossSignal {
    pub fn raise(&self, why: String) {
        let mut d = self.detail.lock().unwrap_or_else(|e| e.into_inner());
        if d.is_none() {
            *d = Some((Instant::now(), why));
        }
        self.raised.store(true, Ordering::Release);
    }

    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }

    /// When the loss was noticed and why.
    pub fn detail(&self) -> Option<(Instant, String)> {
        self.detail.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A connected, enabled controller.
pub struct Controller {
    admin: Arc<Mutex<QueuePair>>,
    keep_alive: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
    lost: Arc<LossSignal>,
    opts: ConnectOptions,
    subnqn: String,
    cntlid: u16,
    cap: u64,
    vs: u32,
    id: IdentifyController,
}

impl Controller {
    /// Connects the admin queue to `subnqn` and enables the controller.
    pub fn connect(opts: &ConnectOptions, subnqn: &str) -> Result<Controller> {
        let admin = QueuePair::connect(opts, subnqn, 0, 1, ADMIN_MAX_XFER, ADMIN_IN_CAPSULE, ADMIN_SQSIZE, CNTLID_DYNAMIC)?;
        Controller::join(admin, opts, subnqn)
    }

    /// [`Controller::connect`] over `link` instead of a TCP connection to `opts.addr`.
    pub fn connect_over(link: Box<dyn Link>, opts: &ConnectOptions, subnqn: &str) -> Result<Controller> {
        Controller::join(QueuePair::open(link, opts, 0, 1, ADMIN_MAX_XFER, ADMIN_IN_CAPSULE)?, opts, subnqn)
    }

    /// Connects the opened admin queue and enables the controller.
    fn join(mut admin: QueuePair, opts: &ConnectOptions, subnqn: &str) -> Result<Controller> {
        let cntlid = fabrics::connect(&mut admin, opts, subnqn, CNTLID_DYNAMIC, ADMIN_SQSIZE, opts.kato_ms)?;
        let mut ctrl = Controller {
            admin: Arc::new(Mutex::new(admin)),
            keep_alive: None,
            lost: Arc::default(),
            opts: opts.clone(),
            subnqn: subnqn.to_string(),
            cntlid,
            cap: 0,
            vs: 0,
            id: IdentifyController::default(),
        };
        ctrl.cap = ctrl.property_get(reg::CAP, true)?;
        ctrl.vs = ctrl.property_get(reg::VS, false)? as u32;
        ctrl.enable()?;
        ctrl.start_keep_alive();
        ctrl.id = ctrl.identify_controller()?;
        Ok(ctrl)
    }

    fn admin(&self) -> MutexGuard<'_, QueuePair> {
        // A keep-alive thread that panicked cannot leave the queue half-updated: recover it.
        self.admin.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn execute(&self, sqe: Sqe, xfer: Xfer) -> Result<u64> {
        self.admin().execute(sqe, xfer, self.opts.timeout)
    }

    /// Runs an admin command that returns data and gives the data back.
    fn execute_read(&self, sqe: Sqe, len: usize) -> Result<Vec<u8>> {
        let mut q = self.admin();
        q.ensure_buffer(0, len);
        q.execute(sqe, Xfer::Read(len), self.opts.timeout)?;
        Ok(q.buffer(0)[..len].to_vec())
    }

    pub fn property_get(&self, offset: u32, size8: bool) -> Result<u64> {
        let v = self.execute(PropertyGet { size8, offset }.to_sqe(0), Xfer::None)?;
        Ok(if size8 { v } else { v & 0xFFFF_FFFF })
    }

    pub fn property_set(&self, offset: u32, value: u64) -> Result<()> {
        self.execute(PropertySet { size8: false, offset, value }.to_sqe(0), Xfer::None).map(|_| ())
    }

    /// CC.EN = 1 with 64/16-byte queue entries, then wait for CSTS.RDY within CAP.TO.
    fn enable(&self) -> Result<()> {
        let value = cc::EN | cc::IOSQES_64 | cc::IOCQES_16;
        self.property_set(reg::CC, value as u64)?;
        let to = Duration::from_millis(500 * ((self.cap >> 24) & 0xFF).max(1)).max(Duration::from_secs(1));
        self.wait_csts(|s| s & csts::RDY != 0, to, "CSTS.RDY after CC.EN = 1")
    }

    fn wait_csts(&self, done: impl Fn(u32) -> bool, limit: Duration, what: &str) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let s = self.property_get(reg::CSTS, false)? as u32;
            if s & csts::CFS != 0 {
                return Err(Error::Protocol(format!("controller fatal status (CSTS.CFS) while waiting for {what}")));
            }
            if done(s) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout(format!("{what} (CSTS {s:#x})")));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Keep Alive every KATO/2 from a background thread (the admin queue is shared under a lock).
    /// One unanswered within KATO (as Linux times it) or failed raises [`Controller::loss_signal`].
    fn start_keep_alive(&mut self) {
        if self.opts.kato_ms == 0 {
            return;
        }
        let kato = Duration::from_millis(self.opts.kato_ms as u64);
        let period = kato / 2;
        let admin = Arc::clone(&self.admin);
        let lost = Arc::clone(&self.lost);
        let timeout = self.opts.timeout.min(kato);
        let (stop, stopped) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("nvmf-keep-alive".into())
            .spawn(move || loop {
                match stopped.recv_timeout(period) {
                    Err(RecvTimeoutError::Timeout) => {}
                    _ => return,
                }
                let mut q = admin.lock().unwrap_or_else(|e| e.into_inner());
                if let Err(e) = q.execute(Sqe::new(admin_opcode::KEEP_ALIVE, 0), Xfer::None, timeout) {
                    tracing::warn!("Keep Alive failed, controller lost: {e}");
                    lost.raise(format!("Keep Alive: {e}"));
                    return;
                }
            })
            .expect("spawn keep-alive thread");
        self.keep_alive = Some((stop, handle));
    }

    pub fn keep_alive(&self) -> Result<()> {
        self.execute(Sqe::new(admin_opcode::KEEP_ALIVE, 0), Xfer::None).map(|_| ())
    }

    pub fn identify_controller(&self) -> Result<IdentifyController> {
        let mut sqe = Sqe::new(admin_opcode::IDENTIFY, 0);
        sqe.set_cdw(10, cns::CONTROLLER as u32);
        let b = self.execute_read(sqe, IDENTIFY_LEN)?;
        IdentifyController::decode(&b).map_err(|e| Error::decode("Identify Controller", e))
    }

    pub fn identify_namespace(&self, nsid: u32) -> Result<IdentifyNamespace> {
        let mut sqe = Sqe::new(admin_opcode::IDENTIFY, 0);
        sqe.set_nsid(nsid);
        sqe.set_cdw(10, cns::NAMESPACE as u32);
        let b = self.execute_read(sqe, IDENTIFY_LEN)?;
        let ns = IdentifyNamespace::decode(&b).map_err(|e| Error::decode("Identify Namespace", e))?;
        if ns.nsze == 0 {
            return Err(Error::Unsupported(format!("namespace {nsid} is not active on {} (NSZE 0)", self.subnqn)));
        }
        if !(9..=16).contains(&ns.lbads) {
            return Err(Error::decode("Identify Namespace", format!("LBA data size 2^{} is not supported", ns.lbads)));
        }
        Ok(ns)
    }

    /// The raw 4096-byte Identify data of `cns` for `nsid` (for printing every field, as
    /// nvme-cli does; the typed getters decode only what the host needs).
    pub fn identify_raw(&self, cns: u8, nsid: u32) -> Result<Vec<u8>> {
        let mut sqe = Sqe::new(admin_opcode::IDENTIFY, 0);
        sqe.set_nsid(nsid);
        sqe.set_cdw(10, cns as u32);
        self.execute_read(sqe, IDENTIFY_LEN)
    }

    /// Get Features `fid` with SEL `sel` (0 current, 1 default, 2 saved, 3 supported
    /// capabilities) and CDW11 `cdw11`; returns DW0 of the completion.
    pub fn get_features(&self, fid: u8, sel: u8, cdw11: u32, nsid: u32) -> Result<u32> {
        let mut sqe = Sqe::new(admin_opcode::GET_FEATURES, 0);
        sqe.set_nsid(nsid);
        sqe.set_cdw(10, (sel as u32 & 0x7) << 8 | fid as u32);
        sqe.set_cdw(11, cdw11);
        Ok(self.execute(sqe, Xfer::None)? as u32)
    }

    /// Get Features that returns data (Host Identifier: 16 bytes with CDW11 EXHID set).
    pub fn get_features_data(&self, fid: u8, cdw11: u32, len: usize) -> Result<Vec<u8>> {
        let mut sqe = Sqe::new(admin_opcode::GET_FEATURES, 0);
        sqe.set_cdw(10, fid as u32);
        sqe.set_cdw(11, cdw11);
        self.execute_read(sqe, len)
    }

    /// Set Features `fid` to `cdw11` (not saved); returns DW0 of the completion.
    pub fn set_features(&self, fid: u8, cdw11: u32) -> Result<u32> {
        let mut sqe = Sqe::new(admin_opcode::SET_FEATURES, 0);
        sqe.set_cdw(10, fid as u32);
        sqe.set_cdw(11, cdw11);
        Ok(self.execute(sqe, Xfer::None)? as u32)
    }

    /// Active namespace IDs (Identify CNS 02h from NSID 0).
    pub fn active_namespaces(&self) -> Result<Vec<u32>> {
        let mut sqe = Sqe::new(admin_opcode::IDENTIFY, 0);
        sqe.set_cdw(10, cns::ACTIVE_NS_LIST as u32);
        Ok(decode_ns_list(&self.execute_read(sqe, IDENTIFY_LEN)?))
    }

    /// Set Features Number of Queues; returns the (submission, completion) I/O queue counts granted.
    pub fn set_number_of_queues(&self, n: u16) -> Result<(u16, u16)> {
        let mut sqe = Sqe::new(admin_opcode::SET_FEATURES, 0);
        let z = n.max(1) as u32 - 1;
        sqe.set_cdw(10, feature::NUMBER_OF_QUEUES as u32);
        sqe.set_cdw(11, z | (z << 16));
        let r = self.execute(sqe, Xfer::None)? as u32;
        Ok(((r & 0xFFFF) as u16 + 1, (r >> 16) as u16 + 1))
    }

    /// Get Log Page `lid`, `len` bytes from byte `offset`, read in pieces the admin queue takes.
    pub fn get_log_page(&self, lid: u8, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let n = (len - out.len()).min(ADMIN_MAX_XFER);
            let numd = (n / 4) as u32 - 1;
            let lpo = offset + out.len() as u64;
            let mut sqe = Sqe::new(admin_opcode::GET_LOG_PAGE, 0);
            sqe.set_nsid(0xFFFF_FFFF);
            sqe.set_cdw(10, lid as u32 | ((numd & 0xFFFF) << 16));
            sqe.set_cdw(11, numd >> 16);
            sqe.set_cdw(12, lpo as u32);
            sqe.set_cdw(13, (lpo >> 32) as u32);
            out.extend_from_slice(&self.execute_read(sqe, n)?);
        }
        Ok(out)
    }

    /// Parameters for [`crate::IoQueue::connect`].
    pub fn io_queue_params(&self) -> IoQueueParams {
        IoQueueParams {
            opts: self.opts.clone(),
            subnqn: self.subnqn.clone(),
            cntlid: self.cntlid,
            in_capsule: self.id.in_capsule_data_size(),
        }
    }

    /// Raised once the keep-alive thread finds the controller gone or silent.
    pub fn loss_signal(&self) -> Arc<LossSignal> {
        Arc::clone(&self.lost)
    }

    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    pub fn subnqn(&self) -> &str {
        &self.subnqn
    }

    /// Controller Capabilities as read at connect.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// CAP.MQES + 1: the most entries an I/O queue may have.
    pub fn max_queue_entries(&self) -> u32 {
        (self.cap & 0xFFFF) as u32 + 1
    }

    /// Largest data transfer per command in bytes (MDTS in CAP.MPSMIN units), None if unlimited.
    pub fn max_transfer(&self) -> Option<u64> {
        let mpsmin = 1u64 << (12 + ((self.cap >> 48) & 0xF));
        (self.id.mdts != 0).then(|| mpsmin << self.id.mdts.min(20))
    }

    pub fn version(&self) -> u32 {
        self.vs
    }

    /// Identify Controller data read at connect.
    pub fn identity(&self) -> &IdentifyController {
        &self.id
    }

    /// Normal shutdown (CC.SHN = 01b, wait for CSTS.SHST complete), then close.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop_keep_alive();
        let cc_now = self.property_get(reg::CC, false)? as u32;
        self.property_set(reg::CC, ((cc_now & !cc::SHN_MASK) | cc::SHN_NORMAL) as u64)?;
        self.wait_csts(|s| s & csts::SHST_MASK == csts::SHST_COMPLETE, Duration::from_secs(5), "shutdown (CSTS.SHST)")
    }

    fn stop_keep_alive(&mut self) {
        if let Some((stop, handle)) = self.keep_alive.take() {
            drop(stop);
            let _ = handle.join();
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop_keep_alive();
    }
}
