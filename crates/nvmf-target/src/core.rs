//! Subsystems, namespaces and controllers: the state shared by every connection. Mutexes here
//! are taken at Connect and teardown only; the data path reads immutable subsystem data and
//! single atomics (keep-alive time stamp, controller status).

use crate::backend::{Backend, BackendError, MemoryBudget};
use crate::config::{HostAuthConfig, NamespaceConfig, PortConfig, SubsystemConfig, TargetSettings};
use nvmf_proto::fabrics::{cc, csts};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

/// CAP.MQES (0's based): the largest queue a host may create.
pub const MQES: u16 = 1023;
/// I/O queues per controller (Number of Queues feature grants at most this many).
pub const MAX_IO_QUEUES: u16 = 128;
/// Admin queues take in-capsule data up to 8 KiB (Linux sends up to that).
pub const ADMIN_IN_CAPSULE: u32 = 8192;
/// AERL (0's based): four Asynchronous Event Requests may be outstanding.
pub const AERL: u8 = 3;
/// MDTS as a power of two of 4 KiB pages: 2 MiB per command.
pub const MDTS: u8 = 9;
pub const MAX_TRANSFER: u32 = 4096 << MDTS;

pub struct Namespace {
    pub nsid: u32,
    pub block_size: u32,
    /// log2(block_size), the LBADS of LBA format 0.
    pub lbads: u8,
    /// Capacity in blocks (NSZE).
    pub nlb: u64,
    pub nguid: [u8; 16],
    pub uuid: [u8; 16],
    pub eui64: [u8; 8],
    pub backend: Backend,
    /// Cleared by the control surface (disable, remove): the nsid then reads as inactive to
    /// every controller at once, those connected before the change included.
    enabled: AtomicBool,
}

impl Namespace {
    /// Opens the backend and derives the identifiers (stable for a given NQN and nsid).
    pub fn open(nqn: &str, n: &NamespaceConfig) -> Result<Namespace, BackendError> {
        let backend = Backend::open(&n.backend, n.block_size)?;
        let nsid = n.nsid.to_le_bytes();
        let h1 = fnv1a(&[nqn.as_bytes(), &nsid, b"nguid"]);
        let h2 = fnv1a(&[nqn.as_bytes(), &nsid, b"nguid2"]);
        let mut nguid = [0u8; 16];
        nguid[..8].copy_from_slice(&h1.to_be_bytes());
        nguid[8..].copy_from_slice(&h2.to_be_bytes());
        let nguid = n.nguid.unwrap_or(nguid);
        let mut uuid = [0u8; 16];
        uuid[..8].copy_from_slice(&fnv1a(&[nqn.as_bytes(), &nsid, b"uuid"]).to_be_bytes());
        uuid[8..].copy_from_slice(&fnv1a(&[nqn.as_bytes(), &nsid, b"uuid2"]).to_be_bytes());
        // RFC 4122 version 4 / variant bits, so tools print it as a proper UUID.
        uuid[6] = (uuid[6] & 0x0f) | 0x40;
        uuid[8] = (uuid[8] & 0x3f) | 0x80;
        let uuid = n.uuid.unwrap_or(uuid);
        let eui64 = fnv1a(&[&nguid, b"eui64"]).to_be_bytes();
        Ok(Namespace {
            nsid: n.nsid,
            block_size: n.block_size,
            lbads: n.block_size.trailing_zeros() as u8,
            nlb: backend.size() / n.block_size as u64,
            nguid,
            uuid,
            eui64,
            backend,
            enabled: AtomicBool::new(true),
        })
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Relaxed)
    }

    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Relaxed);
    }
}

pub struct Subsystem {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    pub reactor: Option<usize>,
    /// I/O queues a controller may have (nvmet's `attr_qid_max`): Number of Queues grants at most
    /// this many and Connect refuses a higher QID. Set at run time only (control surface).
    pub max_qid: u16,
    /// Sorted by nsid. Fixed for this value: a change through the control surface makes a new
    /// `Subsystem` (connected controllers keep theirs; see `Namespace::enabled`).
    pub namespaces: Vec<Arc<Namespace>>,
}

impl Subsystem {
    /// Opens every namespace of `s`.
    pub fn open(s: &SubsystemConfig) -> Result<Subsystem, BackendError> {
        let mut namespaces = Vec::new();
        for n in &s.namespaces {
            namespaces.push(Arc::new(Namespace::open(&s.nqn, n)?));
        }
        namespaces.sort_by_key(|n| n.nsid);
        let serial = s.serial.clone().unwrap_or_else(|| format!("{:016x}", fnv1a(&[s.nqn.as_bytes()])));
        Ok(Subsystem {
            nqn: s.nqn.clone(),
            serial,
            model: s.model.clone().unwrap_or_else(|| "nvmflab".into()),
            allow_any_host: s.allow_any_host,
            hosts: s.hosts.clone(),
            reactor: s.reactor,
            max_qid: MAX_IO_QUEUES,
            namespaces,
        })
    }

    /// A copy with other host settings and namespaces (the namespaces' backends are shared).
    pub fn changed(&self, allow_any_host: bool, hosts: Vec<String>, mut namespaces: Vec<Arc<Namespace>>) -> Subsystem {
        namespaces.sort_by_key(|n| n.nsid);
        Subsystem {
            nqn: self.nqn.clone(),
            serial: self.serial.clone(),
            model: self.model.clone(),
            allow_any_host,
            hosts,
            reactor: self.reactor,
            max_qid: self.max_qid,
            namespaces,
        }
    }

    /// A copy that grants at most `max_qid` I/O queues (1..=MAX_IO_QUEUES).
    pub fn with_max_qid(&self, max_qid: u16) -> Subsystem {
        Subsystem { max_qid, ..self.changed(self.allow_any_host, self.hosts.clone(), self.namespaces.clone()) }
    }

    /// An active (enabled) namespace and its index in `namespaces`.
    pub fn namespace(&self, nsid: u32) -> Option<(usize, &Arc<Namespace>)> {
        let i = self.namespaces.binary_search_by_key(&nsid, |n| n.nsid).ok()?;
        Some((i, &self.namespaces[i])).filter(|(_, n)| n.enabled())
    }

    pub fn allows(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.hosts.iter().any(|h| h == hostnqn)
    }
}

/// A listening port as the discovery log reports it (the real address after binding).
#[derive(Debug, Clone)]
pub struct Port {
    pub portid: u16,
    pub addr: SocketAddr,
    pub subsystems: Option<Vec<String>>,
    pub tls: crate::config::PortTls,
    pub tls_stats: Arc<crate::port_stats::PortTlsStats>,
    /// The transport that serves the port: its capabilities go to every queue accepted on it
    /// and to the port's discovery entries.
    pub transport: crate::capabilities::TransportKind,
}

impl Port {
    pub fn exports(&self, nqn: &str) -> bool {
        self.subsystems.as_ref().is_none_or(|s| s.iter().any(|n| n == nqn))
    }
}

pub struct Controller {
    pub cntlid: u16,
    /// `None` for a discovery controller.
    pub subsys: Option<Arc<Subsystem>>,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub kato_ms: AtomicU32,
    pub cc: AtomicU32,
    pub csts: AtomicU32,
    /// Async Event Configuration feature value.
    pub aec: AtomicU32,
    /// Granted I/O queues, 0's based, NCQA << 16 | NSQA.
    pub num_queues: AtomicU32,
    /// Nanoseconds since the target epoch of the last command on any of its queues
    /// (traffic-based keep-alive, as Linux nvmet does).
    pub last_activity_ns: AtomicU64,
    /// Set when the admin queue goes away or keep-alive expires: its I/O queues close.
    pub dead: AtomicBool,
    io_queues: Mutex<Vec<u16>>,
    /// Asynchronous events waiting for an AER, and the Changed Namespace List.
    events: Mutex<Events>,
    /// True while `events` has an event to report: the transport's tick checks this atomic,
    /// not the mutex.
    event_ready: AtomicBool,
}

/// Async Event Configuration (Set Features 0Bh) bit 8: Namespace Attribute Notices.
pub const AEN_NS_ATTR: u32 = 1 << 8;
/// Completion DW0 of the Namespace Attribute Changed event: type 2 (Notice), information 00h,
/// log page 04h (NVMe Base, "Asynchronous Event Request command").
pub const AEN_NS_CHANGED_DW0: u32 = (0x04 << 16) | 0x2;
/// The Changed Namespace List holds up to 1024 NSIDs; one more and it reads as FFFFFFFFh alone.
pub const CHANGED_NS_MAX: usize = 1024;

/// One controller's asynchronous event state (Linux nvmet: `async_events`, `aen_masked`,
/// `changed_ns_list`).
#[derive(Default)]
struct Events {
    /// Completion DW0 of each event not yet given to an AER, oldest first.
    pending: std::collections::VecDeque<u32>,
    /// AEN configuration bits whose event was raised and whose log page the host has not yet
    /// read: the same kind of event is not raised again until it does (NVMe Base: an event
    /// type is masked until the host reads the associated log page).
    masked: u32,
    /// NSIDs changed since the host last read log page 04h; `None` once over 1024.
    changed_ns: Option<Vec<u32>>,
}

impl Events {
    fn new() -> Events {
        Events { changed_ns: Some(Vec::new()), ..Default::default() }
    }
}

impl Controller {
    pub fn is_discovery(&self) -> bool {
        self.subsys.is_none()
    }

    pub fn ready(&self) -> bool {
        self.csts.load(Relaxed) & csts::RDY != 0
    }

    /// Applies a write of CC: EN drives CSTS.RDY, SHN drives CSTS.SHST.
    pub fn set_cc(&self, new: u32) {
        let old = self.cc.swap(new, Relaxed);
        let mut status = self.csts.load(Relaxed);
        if new & cc::EN != 0 && old & cc::EN == 0 {
            let sizes_ok = (new >> 16) & 0xF == 6 && (new >> 20) & 0xF == 4;
            if sizes_ok || self.is_discovery() {
                status |= csts::RDY;
            } else {
                status |= csts::CFS;
            }
        } else if new & cc::EN == 0 && old & cc::EN != 0 {
            status &= !(csts::RDY | csts::CFS);
        }
        if new & cc::SHN_MASK != 0 {
            if old & cc::SHN_MASK == 0 {
                self.sync_namespaces();
            }
            status = (status & !csts::SHST_MASK) | csts::SHST_COMPLETE;
        } else {
            status &= !csts::SHST_MASK;
        }
        self.csts.store(status, Relaxed);
    }

    /// Makes the subsystem's data durable before reporting shutdown complete. Synchronous: a
    /// shutdown is rare and the host waits for SHST anyway, so blocking this queue's reactor
    /// for one fdatasync per file namespace is acceptable.
    fn sync_namespaces(&self) {
        for ns in self.subsys.iter().flat_map(|s| s.namespaces.iter()) {
            if let Err(errno) = ns.backend.sync() {
                tracing::error!(nsid = ns.nsid, errno, cntlid = self.cntlid, "flush at shutdown failed");
            }
        }
    }

    pub fn touch(&self, now_ns: u64) {
        // Skip the store when the value is fresh enough: fewer cache-line writes shared by
        // reactors serving the same controller.
        if now_ns.saturating_sub(self.last_activity_ns.load(Relaxed)) > 1_000_000 {
            self.last_activity_ns.store(now_ns, Relaxed);
        }
    }

    /// True once the host has been silent for longer than KATO (0 = no timeout).
    pub fn keep_alive_expired(&self, now_ns: u64) -> bool {
        let kato = self.kato_ms.load(Relaxed) as u64;
        kato != 0 && now_ns.saturating_sub(self.last_activity_ns.load(Relaxed)) > kato * 1_000_000
    }

    /// Registers I/O queue `qid`; false if it already exists.
    pub fn add_io_queue(&self, qid: u16) -> bool {
        let mut q = self.io_queues.lock().unwrap_or_else(|e| e.into_inner());
        if q.contains(&qid) {
            return false;
        }
        q.push(qid);
        true
    }

    pub fn remove_io_queue(&self, qid: u16) {
        self.io_queues.lock().unwrap_or_else(|e| e.into_inner()).retain(|q| *q != qid);
    }

    fn events(&self) -> std::sync::MutexGuard<'_, Events> {
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Namespace `nsid` of this controller's subsystem was added, removed, enabled or disabled:
    /// it joins the Changed Namespace List, and a Namespace Attribute Changed event is raised
    /// if the host enabled it and the same event is not already outstanding.
    pub fn namespace_changed(&self, nsid: u32) {
        let mut ev = self.events();
        if let Some(list) = &mut ev.changed_ns {
            if !list.contains(&nsid) {
                if list.len() == CHANGED_NS_MAX {
                    ev.changed_ns = None;
                } else {
                    list.push(nsid);
                }
            }
        }
        if self.aec.load(Relaxed) & AEN_NS_ATTR == 0 || ev.masked & AEN_NS_ATTR != 0 {
            return;
        }
        ev.masked |= AEN_NS_ATTR;
        ev.pending.push_back(AEN_NS_CHANGED_DW0);
        self.event_ready.store(true, Relaxed);
    }

    /// The oldest event not yet reported, for an outstanding AER.
    pub fn take_event(&self) -> Option<u32> {
        if !self.event_ready.load(Relaxed) {
            return None;
        }
        let mut ev = self.events();
        let dw0 = ev.pending.pop_front();
        self.event_ready.store(!ev.pending.is_empty(), Relaxed);
        dw0
    }

    /// Log page 04h (4096 bytes): the changed NSIDs, or FFFFFFFFh alone after an overflow. Reading
    /// it clears the list; unless `retain` (RAE), it also unmasks the event, as nvmet does.
    pub fn take_changed_ns_log(&self, retain: bool) -> Vec<u8> {
        let mut ev = self.events();
        let mut page = vec![0u8; CHANGED_NS_MAX * 4];
        let list = ev.changed_ns.replace(Vec::new()).unwrap_or_else(|| vec![u32::MAX]);
        for (slot, nsid) in page.chunks_exact_mut(4).zip(&list) {
            slot.copy_from_slice(&nsid.to_le_bytes());
        }
        if !retain {
            ev.masked &= !AEN_NS_ATTR;
        }
        page
    }
}

pub struct Target {
    pub settings: TargetSettings,
    /// Replaced as a whole by the control surface; read at Connect and for the discovery log.
    subsystems: RwLock<Vec<Arc<Subsystem>>>,
    /// The discovery log's GENCTR: 1 at start, one up with each subsystem change.
    generation: AtomicU64,
    pub ports: Vec<Port>,
    /// Time zero for the nanosecond stamps in controllers.
    pub epoch: Instant,
    /// Command data buffers of every connection together (`settings.buffer_memory`).
    pub buffers: Arc<MemoryBudget>,
    /// Memory alignment of command data buffers: the strictest any namespace's backend needs,
    /// and at least a cache line.
    pub buffer_align: usize,
    /// TCP connections open now, in the acceptor or a reactor (`settings.max_connections`).
    pub connections: AtomicUsize,
    controllers: Mutex<HashMap<u16, Arc<Controller>>>,
    next_cntlid: Mutex<u16>,
    /// DH-HMAC-CHAP keys by host NQN (see [`Target::with_host_auth`]); read when a queue
    /// authenticates, so a change applies from the next (re-)authentication on.
    host_auth: RwLock<HashMap<String, Arc<HostAuthConfig>>>,
}

/// Buffers are aligned at least this far, so data copies start on a cache line.
const CACHE_LINE: usize = 64;

/// Deterministic 64-bit FNV-1a, used to derive stable namespace identifiers.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Target {
    /// Opens every backend. `ports` carry the bound addresses.
    pub fn new(settings: TargetSettings, subsystems: &[SubsystemConfig], ports: &[PortConfig]) -> Result<Target, BackendError> {
        let mut subs = Vec::new();
        for s in subsystems {
            subs.push(Arc::new(Subsystem::open(s)?));
        }
        let ports = ports
            .iter()
            .enumerate()
            .map(|(i, p)| Port { portid: p.portid.unwrap_or(i as u16 + 1), addr: p.addr, subsystems: p.subsystems.clone(), tls: p.tls, tls_stats: Default::default(), transport: crate::capabilities::TransportKind::Tcp })
            .collect();
        let buffer_memory = usize::try_from(settings.buffer_memory_bytes()).unwrap_or(usize::MAX);
        let buffer_align = subs
            .iter()
            .flat_map(|s| s.namespaces.iter())
            .map(|n| n.backend.buffer_align())
            .fold(CACHE_LINE, usize::max);
        Ok(Target {
            settings,
            subsystems: RwLock::new(subs),
            generation: AtomicU64::new(1),
            ports,
            epoch: Instant::now(),
            buffers: Arc::new(MemoryBudget::new(buffer_memory)),
            buffer_align,
            connections: AtomicUsize::new(0),
            controllers: Mutex::new(HashMap::new()),
            next_cntlid: Mutex::new(1),
            host_auth: RwLock::new(HashMap::new()),
        })
    }

    /// Hosts listed here must authenticate (DH-HMAC-CHAP) every queue they connect.
    pub fn with_host_auth(self, hosts: &[HostAuthConfig]) -> Self {
        *self.host_auth.write().unwrap_or_else(|e| e.into_inner()) =
            hosts.iter().map(|h| (h.nqn.clone(), Arc::new(h.clone()))).collect();
        self
    }

    /// The DH-HMAC-CHAP settings of `hostnqn`, if it must authenticate.
    pub fn host_auth(&self, hostnqn: &str) -> Option<Arc<HostAuthConfig>> {
        self.host_auth.read().unwrap_or_else(|e| e.into_inner()).get(hostnqn).cloned()
    }

    /// Sets (Some) or removes (None) the DH-HMAC-CHAP settings of `hostnqn`.
    pub fn set_host_auth(&self, hostnqn: &str, auth: Option<HostAuthConfig>) {
        let mut map = self.host_auth.write().unwrap_or_else(|e| e.into_inner());
        match auth {
            Some(a) => map.insert(hostnqn.to_string(), Arc::new(a)),
            None => map.remove(hostnqn),
        };
    }

    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.subsystems.read().unwrap_or_else(|e| e.into_inner()).iter().find(|s| s.nqn == nqn).cloned()
    }

    /// The subsystems as they are now.
    pub fn subsystems(&self) -> Vec<Arc<Subsystem>> {
        self.subsystems.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Adds `s`, or replaces the subsystem of the same NQN. Controllers already connected keep
    /// the value they connected with.
    pub fn put_subsystem(&self, s: Arc<Subsystem>) {
        let mut subs = self.subsystems.write().unwrap_or_else(|e| e.into_inner());
        match subs.iter_mut().find(|x| x.nqn == s.nqn) {
            Some(x) => *x = s,
            None => subs.push(s),
        }
        self.generation.fetch_add(1, Relaxed);
    }

    /// The discovery log's generation counter.
    pub fn generation(&self) -> u64 {
        self.generation.load(Relaxed)
    }

    /// Removes a subsystem: its namespaces go inactive and its controllers end (their queues
    /// close), as nvmet does when a subsystem is deleted. False if there was none.
    pub fn remove_subsystem(&self, nqn: &str) -> bool {
        let removed = {
            let mut subs = self.subsystems.write().unwrap_or_else(|e| e.into_inner());
            let before = subs.len();
            let (gone, kept): (Vec<_>, Vec<_>) = subs.drain(..).partition(|s| s.nqn == nqn);
            *subs = kept;
            for s in &gone {
                s.namespaces.iter().for_each(|n| n.set_enabled(false));
            }
            self.generation.fetch_add(1, Relaxed);
            before != subs.len()
        };
        self.end_controllers(nqn);
        removed
    }

    pub fn now_ns(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Creates a controller with a fresh cntlid (1..=0xFFEF, wrapping, skipping live ones);
    /// `None` when `settings.max_controllers` exist already or no cntlid is free (the host is
    /// answered Connect Controller Busy).
    pub fn create_controller(
        &self,
        subsys: Option<Arc<Subsystem>>,
        hostnqn: &str,
        hostid: [u8; 16],
        kato_ms: u32,
        now: Instant,
    ) -> Option<Arc<Controller>> {
        let mut ctrls = self.controllers.lock().unwrap_or_else(|e| e.into_inner());
        if ctrls.len() >= self.settings.max_controllers as usize {
            tracing::warn!(max = self.settings.max_controllers, %hostnqn, "controller limit reached; refusing Connect");
            return None;
        }
        let mut next = self.next_cntlid.lock().unwrap_or_else(|e| e.into_inner());
        // 0's based, as the Number of Queues feature reports it.
        let max_qid = subsys.as_ref().map_or(MAX_IO_QUEUES, |s| s.max_qid) as u32 - 1;
        for _ in 0..0xFFEF {
            let cntlid = *next;
            *next = if *next >= 0xFFEF { 1 } else { *next + 1 };
            if ctrls.contains_key(&cntlid) {
                continue;
            }
            let ctrl = Arc::new(Controller {
                cntlid,
                subsys,
                hostnqn: hostnqn.into(),
                hostid,
                kato_ms: AtomicU32::new(kato_ms),
                cc: AtomicU32::new(0),
                csts: AtomicU32::new(0),
                aec: AtomicU32::new(0),
                num_queues: AtomicU32::new((max_qid << 16) | max_qid),
                last_activity_ns: AtomicU64::new(self.now_ns(now)),
                dead: AtomicBool::new(false),
                io_queues: Mutex::new(Vec::new()),
                events: Mutex::new(Events::new()),
                event_ready: AtomicBool::new(false),
            });
            ctrls.insert(cntlid, ctrl.clone());
            return Some(ctrl);
        }
        None
    }

    pub fn find_controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        self.controllers.lock().unwrap_or_else(|e| e.into_inner()).get(&cntlid).cloned()
    }

    /// Ends a controller (its admin queue closed or keep-alive expired).
    pub fn remove_controller(&self, cntlid: u16) {
        if let Some(c) = self.controllers.lock().unwrap_or_else(|e| e.into_inner()).remove(&cntlid) {
            c.dead.store(true, Relaxed);
        }
    }

    /// Namespace `nsid` of subsystem `nqn` changed (added, removed, enabled, disabled): every
    /// controller of that subsystem is told (Namespace Attribute Changed, log page 04h).
    pub fn namespace_changed(&self, nqn: &str, nsid: u32) {
        let ctrls: Vec<Arc<Controller>> = self
            .controllers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|c| c.subsys.as_ref().is_some_and(|s| s.nqn == nqn))
            .cloned()
            .collect();
        ctrls.iter().for_each(|c| c.namespace_changed(nsid));
    }

    /// Ends every controller of subsystem `nqn` (their queues close; hosts reconnect), as nvmet
    /// does when `attr_qid_max` changes.
    pub fn end_controllers(&self, nqn: &str) -> usize {
        let ctrls: Vec<u16> = self
            .controllers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|c| c.subsys.as_ref().is_some_and(|s| s.nqn == nqn))
            .map(|c| c.cntlid)
            .collect();
        ctrls.iter().for_each(|c| self.remove_controller(*c));
        ctrls.len()
    }

    pub fn controller_count(&self) -> usize {
        self.controllers.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// What a command handler decided. The transport turns it into PDUs.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// Complete now with this status and DW0/DW1.
    Done { status: nvmf_proto::Status, result: u64 },
    /// Send this data to the host (C2HData), then complete successfully.
    Data(Vec<u8>),
    /// Asynchronous Event Request: keep it outstanding.
    Hold,
}

impl Outcome {
    pub fn status(status: nvmf_proto::Status) -> Outcome {
        Outcome::Done { status, result: 0 }
    }

    pub fn success(result: u64) -> Outcome {
        Outcome::Done { status: nvmf_proto::Status::SUCCESS, result }
    }
}
