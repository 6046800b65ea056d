//! The command layer of one queue, the same for every transport: Linux nvmet's request path
//! (`core.c`, with `fabrics-cmd.c`, `admin-cmd.c` and `io-cmd-*.c` behind it). It routes each
//! command to fabrics, admin or I/O handling, turns I/O plans into backend requests, keeps the
//! queue's per-opcode counters, and ends the queue on Disconnect or failed authentication.
//! I/O execution (plans to backend requests and back) is `command/execute.rs`.
//!
//! A transport (`transport/`) moves capsules, data and responses and owns the command
//! buffers; it carries out the [`Action`] each command asks for. Backend requests wait in
//! [`Commands::backend_requests`] until the reactor submits them: nothing here calls io_uring.

use crate::admin::{self, AdminContext};
use crate::auth::QueueAuth;
use crate::backend::{Backend, IoRequest};
use crate::core::{Controller, Outcome, Port, Subsystem, Target, ADMIN_IN_CAPSULE};
use crate::fabrics::{self, ConnectResult};
use crate::io::{self, IoPlan};
use crate::stats::{NsStats, QueueStats, ReactorStats};
use crate::capabilities::Capabilities;
use nvmf_proto::fabrics::{fctype, ConnectCmd, CATTR_DISABLE_SQFLOW, CONNECT_DATA_LEN};
use nvmf_proto::nvme::{admin_opcode, io_opcode, SGL_DATA_BLOCK_OFFSET};
use nvmf_proto::{Sqe, Status};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod auth;
mod execute;

/// A connection that has not finished Connect by then is dropped.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connected queue.
pub struct Queue {
    pub ctrl: Arc<Controller>,
    pub qid: u16,
    pub sqsize: u16,
    sqhd: u16,
    /// The host disabled SQ flow control (Connect CATTR bit 2): it ignores SQHD, so a successful
    /// read can end with its data instead of a response, as Linux nvmet does.
    pub sqflow_disabled: bool,
    pub stats: Arc<QueueStats>,
    /// DH-HMAC-CHAP state when the host must authenticate this queue.
    auth: Option<QueueAuth>,
}

/// What a command that needs a data buffer does once its data is in.
#[derive(Debug, Clone, Copy)]
pub enum Work {
    Io(IoPlan),
    /// Fabrics Connect whose data the transport fetches (NVMe/TCP: through R2T; the
    /// specification allows it, though Linux and SPDK hosts always send it in the capsule).
    Connect(Sqe),
    /// AUTH_Send whose message the transport fetches (a host does so when it exceeds IOCCSZ).
    AuthSend(Sqe),
}

/// What the transport does with a command.
#[derive(Debug)]
pub enum Action<'d> {
    /// Complete now with this status and DW0/DW1.
    Respond(Status, u64),
    /// Send this data to the host (already cut to the command's length), then complete
    /// successfully.
    Send(Vec<u8>),
    /// Keep the command outstanding (Asynchronous Event Request).
    Hold,
    /// The command needs a `len`-byte buffer, filled from `in_capsule`, or by the transport from
    /// the host when `work` takes host data, or by the backend (reads). Then the transport calls
    /// [`Commands::data_in`] (Connect, AUTH_Send) or [`Commands::execute`] (I/O).
    Buffer { work: Work, len: u32, in_capsule: Option<&'d [u8]> },
}

/// A backend request for the reactor to submit.
pub enum BackendRequest<'a> {
    Submit(&'a Backend, IoRequest),
    /// Done without backend work (a null read into a buffer zeroed here): report it complete.
    Done(u64),
}

/// A backend request kept until the reactor takes it: namespace index and request.
enum Queued {
    Submit(usize, IoRequest),
    Done(u64),
}

// SAFETY: a request's buffer pointer points into a command buffer of the same connection, which
// moves between threads (acceptor to reactor) together with it, never shared.
unsafe impl Send for Queued {}

/// The command layer of one connection: its queue once connected, and what its commands asked
/// of the backends.
pub struct Commands {
    target: Arc<Target>,
    port: Option<Port>,
    /// What the transport supplies (SGL types, in-capsule size): its kind's capabilities.
    caps: Capabilities,
    queue: Option<Queue>,
    /// The subsystem as this queue sees it: taken at Connect, and again when the target's
    /// subsystems changed (the control surface added or removed a namespace), so a connected
    /// host finds a new namespace after its rescan. Taken only while no backend request is
    /// queued, because those name namespaces by their index in it.
    subsys: Option<Arc<Subsystem>>,
    /// `Target::generation` when `subsys` was taken.
    subsys_generation: u64,
    /// Earlier `subsys` values, kept (and their backends open) until the backend requests
    /// submitted under them have completed.
    retired: Vec<Arc<Subsystem>>,
    /// CIDs of the Asynchronous Event Requests this (admin) queue holds.
    aers: Vec<u16>,
    /// Per-namespace counters by nsid, for the namespaces known when the queue attached to its
    /// reactor (one added later is served, and counted only in the queue's counters).
    ns_stats: Vec<(u32, Arc<NsStats>)>,
    ranges: Vec<(u64, u64)>,
    queued: Vec<Queued>,
    in_flight: usize,
    created: Instant,
    released: bool,
    /// Disconnect or failed authentication: the transport closes once the response is out.
    ending: bool,
}

impl Commands {
    pub fn new(target: Arc<Target>, port: Option<Port>, caps: Capabilities, now: Instant) -> Commands {
        Commands {
            target,
            port,
            caps,
            queue: None,
            subsys: None,
            subsys_generation: 0,
            retired: Vec::new(),
            aers: Vec::new(),
            ns_stats: Vec::new(),
            ranges: Vec::new(),
            queued: Vec::new(),
            in_flight: 0,
            created: now,
            released: false,
            ending: false,
        }
    }

    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }

    pub fn queue(&self) -> Option<&Queue> {
        self.queue.as_ref()
    }

    /// SQ ID and SQ head for a response.
    pub fn sq_ids(&self) -> (u16, u16) {
        self.queue.as_ref().map_or((0, 0), |q| (q.qid, q.sqhd))
    }

    /// Commands a transport may hold at once: SQSIZE + 1 once connected, one before.
    pub fn slot_limit(&self) -> usize {
        self.queue.as_ref().map_or(1, |q| q.sqsize as usize + 1)
    }

    /// Whether `len` bytes of in-capsule data are all of an I/O queue command's data, described
    /// at offset 0 (not a Fabrics command's, not beyond IOCCSZ): a transport may then receive
    /// them straight into the command's buffer before it hands the capsule here.
    pub fn in_capsule_is_io_data(&self, sqe: &Sqe, len: usize) -> bool {
        let sgl = sqe.sgl();
        self.queue.as_ref().is_some_and(|q| q.qid > 0)
            && sqe.opcode() != admin_opcode::FABRICS
            && len <= self.in_capsule_limit(sqe) as usize
            && (sgl.sgl_type, sgl.addr, sgl.length as usize) == (SGL_DATA_BLOCK_OFFSET, 0, len)
    }

    /// In-capsule data a command may carry: IOCCSZ's share on I/O queues; 8 KiB on the admin
    /// queue and for Fabrics commands (Connect's data), as SPDK allows.
    pub fn in_capsule_limit(&self, sqe: &Sqe) -> u32 {
        match &self.queue {
            Some(q) if q.qid > 0 && sqe.opcode() != admin_opcode::FABRICS => self.caps.in_capsule_data_size,
            _ => ADMIN_IN_CAPSULE,
        }
    }

    /// Once connected: (subsystem NQN or the discovery NQN, host NQN) for the placement policy.
    pub fn placement(&self) -> Option<(&str, &str)> {
        let q = self.queue.as_ref()?;
        Some((&q.stats.subnqn, &q.stats.hostnqn))
    }

    /// The queue moves to a reactor: its counters join the reactor's.
    pub fn attach(&mut self, reactor: &ReactorStats) {
        if let Some(q) = &self.queue {
            reactor.add_queue(q.stats.clone());
            if let Some(s) = &self.subsys {
                self.ns_stats = s.namespaces.iter().map(|n| (n.nsid, reactor.namespace(&s.nqn, n.nsid))).collect();
            }
        }
    }

    /// An asynchronous event for an AER this queue holds: (its CID, completion DW0). The
    /// transport asks on each tick and completes the AER successfully with it.
    pub fn next_event(&mut self) -> Option<(u16, u64)> {
        let q = self.queue.as_ref()?;
        if self.aers.is_empty() {
            return None;
        }
        let dw0 = q.ctrl.take_event()?;
        Some((self.aers.remove(0), dw0 as u64))
    }

    /// Takes the subsystem again if the target's subsystems changed since it was taken.
    fn refresh_subsystem(&mut self) {
        if self.in_flight == 0 {
            self.retired.clear();
        }
        let generation = self.target.generation();
        if generation == self.subsys_generation || !self.queued.is_empty() {
            return;
        }
        let Some(old) = &self.subsys else { return };
        // A removed subsystem's controllers end: keep the old value until they do.
        if let Some(now) = self.target.subsystem(&old.nqn) {
            if !Arc::ptr_eq(&now, old) {
                let old = self.subsys.replace(now);
                self.retired.extend(old);
            }
        }
        self.subsys_generation = generation;
    }

    /// True once, after the command that ends the queue (Disconnect, failed authentication).
    pub fn take_ending(&mut self) -> bool {
        std::mem::take(&mut self.ending)
    }

    /// Releases the queue and, for an admin queue, its controller.
    pub fn release(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        if let Some(q) = &self.queue {
            q.stats.connected.store(false, Relaxed);
            if q.qid == 0 {
                self.target.remove_controller(q.ctrl.cntlid);
                tracing::info!(cntlid = q.ctrl.cntlid, hostnqn = %q.ctrl.hostnqn, "controller removed");
            } else {
                q.ctrl.remove_io_queue(q.qid);
            }
        }
    }

    /// Time passes: true when the queue must end now (no Connect in time, authentication not
    /// finished in time, keep-alive timeout, controller gone).
    pub fn expired(&self, now: Instant) -> bool {
        let Some(q) = &self.queue else {
            let late = now.saturating_duration_since(self.created) > CONNECT_TIMEOUT;
            if late {
                tracing::info!("closing connection that did not connect within {CONNECT_TIMEOUT:?}");
            }
            return late;
        };
        if q.auth.as_ref().is_some_and(|a| a.expired(now)) {
            tracing::info!(cntlid = q.ctrl.cntlid, qid = q.qid, "closing queue that did not authenticate in time");
            return true;
        }
        if q.ctrl.dead.load(Relaxed) {
            return true;
        }
        // While this queue authenticates, AUTH_TIMEOUT bounds it instead of KATO: one DH step
        // of a slow host (ffdhe8192 in a TCG guest: over 5 s) is not a dead host. nvmet checks
        // keep-alive in whole KATO windows and so tolerates such a gap too (blktests nvme/043).
        if q.auth.as_ref().is_some_and(|a| !a.authenticated()) {
            return false;
        }
        if q.ctrl.keep_alive_expired(self.target.now_ns(now)) {
            tracing::warn!(
                cntlid = q.ctrl.cntlid,
                hostnqn = %q.ctrl.hostnqn,
                kato_ms = q.ctrl.kato_ms.load(Relaxed),
                "keep-alive timeout: tearing down controller"
            );
            self.target.remove_controller(q.ctrl.cntlid);
            return true;
        }
        false
    }

    // ---- routing ----

    /// A command arrived with `data` in its capsule (`data_ok`: its data digest held).
    pub fn command<'d>(&mut self, sqe: &Sqe, data: &'d [u8], data_ok: bool, now: Instant) -> Action<'d> {
        self.refresh_subsystem();
        if let Some(q) = &mut self.queue {
            q.ctrl.touch(self.target.now_ns(now));
            q.sqhd = if q.sqhd >= q.sqsize { 0 } else { q.sqhd + 1 };
            q.stats.commands.add(1);
        }
        if !data_ok {
            return Action::Respond(Status::TRANSIENT_TRANSPORT_ERROR, 0);
        }
        if sqe.opcode() == admin_opcode::FABRICS {
            return self.fabrics(sqe, data, now);
        }
        let Some(q) = &self.queue else { return Action::Respond(Status::CMD_SEQ_ERROR.with_dnr(), 0) };
        if !auth::allows(q) {
            return Action::Respond(Status::AUTH_REQUIRED.with_dnr(), 0);
        }
        if !q.ctrl.ready() {
            return Action::Respond(Status::CMD_SEQ_ERROR.with_dnr(), 0);
        }
        if q.qid == 0 {
            q.stats.admin.add(1);
            self.admin(sqe)
        } else {
            self.io(sqe, data)
        }
    }

    /// The data of an [`Action::Buffer`] for Connect or AUTH_Send is in (`failed`: it arrived
    /// damaged, and the command completes with this status).
    pub fn data_in(&mut self, work: Work, data: &[u8], failed: Option<Status>, now: Instant) -> Action<'static> {
        match (work, failed) {
            (Work::Connect(sqe), None) => {
                let (status, result) = self.connect(&sqe, data, now);
                Action::Respond(status, result)
            }
            (Work::AuthSend(sqe), _) => self.auth_send_arrived(sqe, data, failed),
            (_, Some(status)) => Action::Respond(status, 0),
            (Work::Io(_), None) => Action::Respond(Status::INTERNAL_ERROR, 0),
        }
    }

    fn fabrics<'d>(&mut self, sqe: &Sqe, data: &'d [u8], now: Instant) -> Action<'d> {
        if let Some(q) = &self.queue {
            q.stats.fabrics.add(1);
        }
        let (status, result) = match (sqe.fctype(), &self.queue) {
            (fctype::CONNECT, None) if sqe.sgl().sgl_type == self.caps.transfer_sgl => {
                let len = sqe.sgl().length;
                if !(CONNECT_DATA_LEN as u32..=ADMIN_IN_CAPSULE).contains(&len) {
                    return Action::Respond(Status::SGL_INVALID_DATA_LEN.with_dnr(), 0);
                }
                return Action::Buffer { work: Work::Connect(*sqe), len, in_capsule: None };
            }
            (fctype::CONNECT, None) => match in_capsule(sqe, data, ADMIN_IN_CAPSULE) {
                Err(status) => (status, 0),
                Ok(d) => self.connect(sqe, d, now),
            },
            (fctype::CONNECT, Some(_)) => (Status::CMD_SEQ_ERROR.with_dnr(), 0),
            (_, None) => (Status::CMD_SEQ_ERROR.with_dnr(), 0),
            (fctype::AUTH_SEND, Some(_)) if sqe.sgl().sgl_type == self.caps.transfer_sgl => {
                return self.auth_send_by_transfer(sqe)
            }
            (fctype::AUTH_SEND | fctype::AUTH_RECV, Some(_)) => return self.auth_command(sqe, data),
            (fctype::PROPERTY_GET | fctype::PROPERTY_SET, Some(q)) if !auth::allows(q) => {
                (Status::AUTH_REQUIRED.with_dnr(), 0)
            }
            (fctype::PROPERTY_GET, Some(q)) if q.qid == 0 => match fabrics::property_get(&q.ctrl, sqe) {
                Outcome::Done { status, result } => (status, result),
                _ => (Status::INTERNAL_ERROR, 0),
            },
            (fctype::PROPERTY_SET, Some(q)) if q.qid == 0 => match fabrics::property_set(&q.ctrl, sqe) {
                Outcome::Done { status, result } => (status, result),
                _ => (Status::INTERNAL_ERROR, 0),
            },
            (fctype::DISCONNECT, Some(_)) => {
                self.release();
                self.ending = true;
                (Status::SUCCESS, 0)
            }
            _ => (Status::INVALID_OPCODE.with_dnr(), 0),
        };
        Action::Respond(status, result)
    }

    /// Runs a Connect whose data is in; on success this connection becomes that queue.
    fn connect(&mut self, sqe: &Sqe, data: &[u8], now: Instant) -> (Status, u64) {
        // Read before Connect takes the subsystem: a change in between is taken at the next command.
        let generation = self.target.generation();
        match fabrics::connect(&self.target, self.port.as_ref(), sqe, data, now) {
            ConnectResult::Rejected { status, result } => (status, result),
            ConnectResult::Accepted { ctrl, qid, sqsize, hostnqn } => {
                let subnqn = ctrl.subsys.as_ref().map_or(nvmf_proto::fabrics::DISCOVERY_NQN, |s| &s.nqn);
                let stats = Arc::new(QueueStats::new(subnqn, &hostnqn, ctrl.cntlid, qid, self.caps.kind));
                stats.commands.add(1);
                stats.fabrics.add(1);
                let auth = self.queue_auth(&ctrl, &hostnqn, now);
                let result = if qid == 0 { ctrl.cntlid as u64 } else { 0 } | auth::authreq(&auth);
                let sqflow_disabled = ConnectCmd::from_sqe(sqe).cattr & CATTR_DISABLE_SQFLOW != 0;
                self.subsys = ctrl.subsys.clone();
                self.subsys_generation = generation;
                self.queue = Some(Queue { ctrl, qid, sqsize, sqhd: 1, sqflow_disabled, stats, auth });
                (Status::SUCCESS, result)
            }
        }
    }

    fn admin(&mut self, sqe: &Sqe) -> Action<'static> {
        let Some(q) = &self.queue else { return Action::Respond(Status::CMD_SEQ_ERROR.with_dnr(), 0) };
        let cx = AdminContext { target: &self.target, caps: &self.caps, ctrl: &q.ctrl, subsys: self.subsys.as_deref(), held_aers: self.aers.len() };
        match admin::execute(&cx, sqe) {
            Outcome::Done { status, result } => Action::Respond(status, result),
            // An event that waited for an AER completes this one at once.
            Outcome::Hold => match q.ctrl.take_event() {
                Some(dw0) => Action::Respond(Status::SUCCESS, dw0 as u64),
                None => {
                    self.aers.push(sqe.cid());
                    Action::Hold
                }
            },
            Outcome::Data(mut data) => {
                let sgl = sqe.sgl();
                if sgl.sgl_type != self.caps.transfer_sgl {
                    return Action::Respond(Status::SGL_INVALID_TYPE.with_dnr(), 0);
                }
                data.truncate(sgl.length as usize);
                Action::Send(data)
            }
        }
    }

    fn io<'d>(&mut self, sqe: &Sqe, data: &'d [u8]) -> Action<'d> {
        let Some(q) = &self.queue else { return Action::Respond(Status::CMD_SEQ_ERROR.with_dnr(), 0) };
        let Some(subsys) = &self.subsys else {
            return Action::Respond(Status::INVALID_OPCODE.with_dnr(), 0);
        };
        let stats = &q.stats;
        match sqe.opcode() {
            io_opcode::READ => stats.read.add(1),
            io_opcode::WRITE => stats.write.add(1),
            io_opcode::FLUSH => stats.flush.add(1),
            io_opcode::WRITE_ZEROES => stats.write_zeroes.add(1),
            io_opcode::DATASET_MANAGEMENT => stats.dsm.add(1),
            _ => {}
        }
        let plan = match io::plan(subsys, sqe) {
            Ok(p) => p,
            Err(status) => return Action::Respond(status, 0),
        };
        if let IoPlan::Read { nsid, .. } | IoPlan::Write { nsid, .. } | IoPlan::WriteZeroes { nsid, .. } | IoPlan::Dsm { nsid, .. } = plan {
            if let Some(n) = self.ns_stats(nsid) {
                n.commands.add(1);
                match plan {
                    IoPlan::Read { .. } => n.reads.add(1),
                    IoPlan::Write { .. } => n.writes.add(1),
                    _ => n.other.add(1),
                }
            }
        }
        let sgl = sqe.sgl();
        let host_len = plan.host_data_len();
        let work = Work::Io(plan);
        match plan {
            IoPlan::Read { len, .. } => {
                if sgl.sgl_type != self.caps.transfer_sgl {
                    return Action::Respond(Status::SGL_INVALID_TYPE.with_dnr(), 0);
                }
                if sgl.length != len {
                    return Action::Respond(Status::SGL_INVALID_DATA_LEN.with_dnr(), 0);
                }
                Action::Buffer { work, len, in_capsule: None }
            }
            _ if host_len > 0 => match sgl.sgl_type {
                SGL_DATA_BLOCK_OFFSET => match in_capsule(sqe, data, self.caps.in_capsule_data_size) {
                    Ok(d) if d.len() == host_len as usize => Action::Buffer { work, len: host_len, in_capsule: Some(d) },
                    Ok(_) => Action::Respond(Status::SGL_INVALID_DATA_LEN.with_dnr(), 0),
                    Err(status) => Action::Respond(status, 0),
                },
                t if t == self.caps.transfer_sgl && sgl.length == host_len => Action::Buffer { work, len: host_len, in_capsule: None },
                t if t == self.caps.transfer_sgl => Action::Respond(Status::SGL_INVALID_DATA_LEN.with_dnr(), 0),
                _ => Action::Respond(Status::SGL_INVALID_TYPE.with_dnr(), 0),
            },
            _ => Action::Buffer { work, len: 0, in_capsule: None },
        }
    }
}

impl Drop for Commands {
    fn drop(&mut self) {
        self.release();
    }
}

/// The in-capsule data an SGL data block descriptor points at.
fn in_capsule<'d>(sqe: &Sqe, data: &'d [u8], limit: u32) -> Result<&'d [u8], Status> {
    let sgl = sqe.sgl();
    if sgl.sgl_type != SGL_DATA_BLOCK_OFFSET {
        return Err(Status::SGL_INVALID_TYPE.with_dnr());
    }
    if sgl.length > limit {
        return Err(Status::SGL_INVALID_DATA_LEN.with_dnr());
    }
    let end = sgl.addr.checked_add(sgl.length as u64).filter(|e| *e <= data.len() as u64);
    match end {
        Some(end) => Ok(&data[sgl.addr as usize..end as usize]),
        None if sgl.addr >= data.len() as u64 && sgl.addr > 0 => Err(Status::SGL_INVALID_OFFSET.with_dnr()),
        None => Err(Status::SGL_INVALID_DATA_LEN.with_dnr()),
    }
}
