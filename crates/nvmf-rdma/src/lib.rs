//! Thin, safe wrappers over rdma-core for nvmflab's NVMe over RDMA transport: a listening RDMA
//! CM id and its events (the target), a resolved outgoing id on its own event channel (the
//! host, [`Connector`]), and per connection one PD, one CQ (with a completion channel whose fd a
//! poller waits on), an RC queue pair, memory registrations, posts and completions.
//!
//! The C side (`shim.c`) flattens rdma-core's structs into plain arguments, because the verbs
//! post and poll calls are static inline in `verbs.h`. Nothing here knows NVMe.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io;
use std::os::fd::RawFd;

#[repr(C)]
struct RawEventChannel {
    _p: [u8; 0],
}
#[repr(C)]
struct RawCmId {
    _p: [u8; 0],
}
#[repr(C)]
struct RawConn {
    _p: [u8; 0],
}
#[repr(C)]
struct RawMr {
    _p: [u8; 0],
}

#[repr(C)]
struct RawEvent {
    kind: c_int,
    status: c_int,
    id: *mut RawCmId,
    private_data: [u8; 64],
    private_data_len: u8,
    responder_resources: u8,
    initiator_depth: u8,
}

/// One work completion.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct WorkCompletion {
    pub wr_id: u64,
    /// `ibv_wc_status`: 0 is success.
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
    is_recv: u32,
}

impl WorkCompletion {
    pub fn is_recv(&self) -> bool {
        self.is_recv != 0
    }
    pub fn ok(&self) -> bool {
        self.status == 0
    }
    pub fn status_name(&self) -> String {
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        unsafe { CStr::from_ptr(nr_wc_status_name(self.status)).to_string_lossy().into_owned() }
    }
}

extern "C" {
    fn nr_listen(
        addr: *const c_char,
        port: *const c_char,
        backlog: c_int,
        ch: *mut *mut RawEventChannel,
        id: *mut *mut RawCmId,
        bound_port: *mut u16,
    ) -> c_int;
    fn nr_channel_fd(ch: *mut RawEventChannel) -> c_int;
    fn nr_listener_close(ch: *mut RawEventChannel, id: *mut RawCmId);
    fn nr_get_event(ch: *mut RawEventChannel, ev: *mut RawEvent) -> c_int;
    fn nr_resolve(
        addr: *const c_char,
        port: *const c_char,
        timeout_ms: c_int,
        ch: *mut *mut RawEventChannel,
        id: *mut *mut RawCmId,
        cm_status: *mut c_int,
    ) -> c_int;
    fn nr_channel_close(ch: *mut RawEventChannel);
    fn nr_conn_connect(c: *mut RawConn, data: *const c_void, len: u8) -> c_int;
    fn nr_reg_mr_remote(c: *mut RawConn, addr: *mut c_void, len: usize) -> *mut RawMr;
    fn nr_mr_rkey(mr: *mut RawMr) -> u32;
    fn nr_reject(id: *mut RawCmId, data: *const c_void, len: u8) -> c_int;
    fn nr_conn_create(id: *mut RawCmId, send_wr: u32, recv_wr: u32, out: *mut *mut RawConn) -> c_int;
    fn nr_conn_destroy(c: *mut RawConn);
    fn nr_conn_accept(c: *mut RawConn, data: *const c_void, len: u8, rr: u8, id: u8) -> c_int;
    fn nr_conn_disconnect(c: *mut RawConn) -> c_int;
    fn nr_conn_id(c: *mut RawConn) -> *mut RawCmId;
    fn nr_conn_comp_fd(c: *mut RawConn) -> c_int;
    fn nr_conn_rearm(c: *mut RawConn) -> c_int;
    fn nr_reg_mr(c: *mut RawConn, addr: *mut c_void, len: usize) -> *mut RawMr;
    fn nr_mr_lkey(mr: *mut RawMr) -> u32;
    fn nr_dereg_mr(mr: *mut RawMr) -> c_int;
    fn nr_post_recv(c: *mut RawConn, wr_id: u64, addr: *mut c_void, len: u32, lkey: u32) -> c_int;
    #[allow(clippy::too_many_arguments)]
    fn nr_post_send(
        c: *mut RawConn,
        op: c_int,
        wr_id: u64,
        signaled: c_int,
        addr: *mut c_void,
        len: u32,
        lkey: u32,
        raddr: u64,
        rkey: u32,
        inv_rkey: u32,
    ) -> c_int;
    fn nr_poll(c: *mut RawConn, out: *mut WorkCompletion, n: c_int) -> c_int;
    fn nr_event_name(kind: c_int) -> *const c_char;
    fn nr_wc_status_name(status: u32) -> *const c_char;
}

fn check(ret: c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::from_raw_os_error(-ret))
    } else {
        Ok(())
    }
}

/// An RDMA CM id in the listening state, with its non-blocking event channel.
pub struct Listener {
    ch: *mut RawEventChannel,
    id: *mut RawCmId,
    port: u16,
}

// SAFETY: the channel and id are used by one thread at a time (the owner of the Listener).
unsafe impl Send for Listener {}

/// The kind of a CM event we act on; the rest are logged and ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    ConnectRequest,
    Established,
    Disconnected,
    /// The peer rejected our connect request (its private data says why).
    Rejected,
    /// Unreachable, connect error, timewait exit, device removal...
    Other(i32),
}

// rdma_cm_event_type values (rdma_cma.h).
const EV_CONNECT_REQUEST: c_int = 4;
const EV_REJECTED: c_int = 8;
const EV_ESTABLISHED: c_int = 9;
const EV_DISCONNECTED: c_int = 10;

/// A CM event. `id` names the connection it concerns: a new one for a connect request.
pub struct Event {
    pub kind: EventKind,
    pub status: i32,
    pub id: CmId,
    pub private_data: Vec<u8>,
    pub responder_resources: u8,
    pub initiator_depth: u8,
}

impl Event {
    pub fn name(&self) -> String {
        let k = match self.kind {
            EventKind::ConnectRequest => EV_CONNECT_REQUEST,
            EventKind::Established => EV_ESTABLISHED,
            EventKind::Disconnected => EV_DISCONNECTED,
            EventKind::Rejected => EV_REJECTED,
            EventKind::Other(k) => k,
        };
        // SAFETY: rdma_event_str returns a static string for any value.
        unsafe { CStr::from_ptr(nr_event_name(k)).to_string_lossy().into_owned() }
    }
}

/// A CM id as an event names it: compare it with [`Connection::cm_id`], or, for a connect
/// request, accept it ([`Connection::create`]) or [`CmId::reject`] it. It is not owned: an id
/// of a connect request that is neither accepted nor rejected leaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmId(usize);

impl CmId {
    /// Rejects a connect request with `private_data` (at most 255 bytes) and frees the id.
    pub fn reject(self, private_data: &[u8]) -> io::Result<()> {
        let len = private_data.len().min(255) as u8;
        // SAFETY: the id came from a connect request event and is consumed here.
        check(unsafe { nr_reject(self.0 as *mut RawCmId, private_data.as_ptr().cast(), len) })
    }
}

impl Listener {
    /// Listens on `addr:port` (numeric host; port 0 picks one). Fails with ENODEV or
    /// EADDRNOTAVAIL where no RDMA device serves the address.
    pub fn bind(addr: &str, port: u16, backlog: i32) -> io::Result<Listener> {
        let a = CString::new(addr).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let p = CString::new(port.to_string()).expect("digits");
        let (mut ch, mut id, mut bound) = (std::ptr::null_mut(), std::ptr::null_mut(), 0u16);
        // SAFETY: all pointers are valid for the call; outputs are written only on success.
        check(unsafe { nr_listen(a.as_ptr(), p.as_ptr(), backlog, &mut ch, &mut id, &mut bound) })?;
        Ok(Listener { ch, id, port: bound })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The event channel's fd: readable when [`Listener::next_event`] has something.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel lives as long as self.
        unsafe { nr_channel_fd(self.ch) }
    }

    /// The next CM event of this listener or of any connection it accepted, if one waits.
    pub fn next_event(&mut self) -> io::Result<Option<Event>> {
        next_event(self.ch)
    }
}

/// The next event of channel `ch`, if one waits.
fn next_event(ch: *mut RawEventChannel) -> io::Result<Option<Event>> {
    let mut raw = RawEvent {
        kind: 0,
        status: 0,
        id: std::ptr::null_mut(),
        private_data: [0; 64],
        private_data_len: 0,
        responder_resources: 0,
        initiator_depth: 0,
    };
    // SAFETY: the caller's channel is live; raw is a valid out pointer.
    let r = unsafe { nr_get_event(ch, &mut raw) };
    check(r)?;
    if r == 0 {
        return Ok(None);
    }
    let kind = match raw.kind {
        EV_CONNECT_REQUEST => EventKind::ConnectRequest,
        EV_ESTABLISHED => EventKind::Established,
        EV_DISCONNECTED => EventKind::Disconnected,
        EV_REJECTED => EventKind::Rejected,
        k => EventKind::Other(k),
    };
    let len = (raw.private_data_len as usize).min(raw.private_data.len());
    Ok(Some(Event {
        kind,
        status: raw.status,
        id: CmId(raw.id as usize),
        private_data: raw.private_data[..len].to_vec(),
        responder_resources: raw.responder_resources,
        initiator_depth: raw.initiator_depth,
    }))
}

impl Drop for Listener {
    fn drop(&mut self) {
        // SAFETY: created by nr_listen and closed once.
        unsafe { nr_listener_close(self.ch, self.id) }
    }
}

/// The host's side of RDMA CM: an outgoing id, resolved to a route, on its own non-blocking
/// event channel. Make the [`Connection`] on [`Connector::id`], then [`Connection::connect`]
/// and wait here for ESTABLISHED or REJECTED. Drop the connection before the connector.
pub struct Connector {
    ch: *mut RawEventChannel,
    id: CmId,
}

// SAFETY: the channel is used by one thread at a time (the owner of the queue).
unsafe impl Send for Connector {}

impl Connector {
    /// Resolves `addr:port` (an address an RDMA device reaches), waiting up to `timeout_ms`
    /// for the address and again for the route. A CM error event comes back as
    /// EHOSTUNREACH with its status in the message.
    pub fn resolve(addr: &str, port: u16, timeout_ms: i32) -> io::Result<Connector> {
        let a = CString::new(addr).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let p = CString::new(port.to_string()).expect("digits");
        let (mut ch, mut id, mut status) = (std::ptr::null_mut(), std::ptr::null_mut(), 0);
        // SAFETY: all pointers are valid for the call; outputs are written only on success.
        let r = unsafe { nr_resolve(a.as_ptr(), p.as_ptr(), timeout_ms, &mut ch, &mut id, &mut status) };
        if r == -EHOSTUNREACH {
            return Err(io::Error::new(io::ErrorKind::HostUnreachable, format!("RDMA CM cannot resolve {addr}:{port} (status {status})")));
        }
        check(r)?;
        Ok(Connector { ch, id: CmId(id as usize) })
    }

    /// The resolved id, for [`Connection::create`] (which then owns it).
    pub fn id(&self) -> CmId {
        self.id
    }

    /// The event channel's fd: readable when [`Connector::next_event`] has something.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel lives as long as self.
        unsafe { nr_channel_fd(self.ch) }
    }

    /// The next CM event of this connection, if one waits.
    pub fn next_event(&mut self) -> io::Result<Option<Event>> {
        next_event(self.ch)
    }
}

/// Linux's EHOSTUNREACH: nr_resolve's answer to a CM error event.
const EHOSTUNREACH: c_int = 113;

impl Drop for Connector {
    fn drop(&mut self) {
        // SAFETY: created by nr_resolve; its id belongs to a Connection dropped before this.
        unsafe { nr_channel_close(self.ch) }
    }
}

/// What a send-queue work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    Send,
    /// SEND that also invalidates the host's remote key (NVMe over RDMA's SEND with Invalidate).
    SendInvalidate(u32),
    /// RDMA WRITE to the host's memory at (address, key).
    Write(u64, u32),
    /// RDMA READ from the host's memory at (address, key).
    Read(u64, u32),
}

/// A registered memory region (local access only: the host never touches our memory).
pub struct MemoryRegion {
    mr: *mut RawMr,
    pub lkey: u32,
    /// The key the peer names the region by (meaningful for [`Connection::register_remote`]).
    pub rkey: u32,
}

// SAFETY: a registration is plain handle data used by the thread that owns the connection.
unsafe impl Send for MemoryRegion {}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by nr_reg_mr and deregistered once.
        unsafe { nr_dereg_mr(self.mr) };
    }
}

/// One accepted (or being accepted) connection: PD, completion channel, CQ and RC QP.
/// Memory regions must be dropped before it.
pub struct Connection {
    raw: *mut RawConn,
}

// SAFETY: owned and used by one thread at a time.
unsafe impl Send for Connection {}

impl Connection {
    /// Creates the verbs resources for a connect request's id (or a [`Connector`]'s), which it then owns (on failure
    /// too: the id is destroyed, and the host sees the connection fail).
    pub fn create(id: CmId, send_wr: u32, recv_wr: u32) -> io::Result<Connection> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: id came from a connect request event; raw is a valid out pointer.
        check(unsafe { nr_conn_create(id.0 as *mut RawCmId, send_wr, recv_wr, &mut raw) })?;
        Ok(Connection { raw })
    }

    pub fn accept(&self, private_data: &[u8], responder_resources: u8, initiator_depth: u8) -> io::Result<()> {
        let len = private_data.len().min(255) as u8;
        // SAFETY: raw is live; the data is copied by rdma_accept.
        check(unsafe { nr_conn_accept(self.raw, private_data.as_ptr().cast(), len, responder_resources, initiator_depth) })
    }

    pub fn disconnect(&self) -> io::Result<()> {
        // SAFETY: raw is live.
        check(unsafe { nr_conn_disconnect(self.raw) })
    }

    pub fn cm_id(&self) -> CmId {
        // SAFETY: raw is live.
        CmId(unsafe { nr_conn_id(self.raw) } as usize)
    }

    /// The completion channel's fd: readable after a completion once [`Connection::rearm`] ran.
    pub fn completion_fd(&self) -> RawFd {
        // SAFETY: raw is live.
        unsafe { nr_conn_comp_fd(self.raw) }
    }

    /// Consumes completion events and asks for the next one; poll the CQ after this.
    pub fn rearm(&self) -> io::Result<()> {
        // SAFETY: raw is live.
        check(unsafe { nr_conn_rearm(self.raw) })
    }

    /// Registers `len` bytes at `addr` for local access.
    ///
    /// # Safety
    /// The memory must stay valid until the region is dropped.
    pub unsafe fn register(&self, addr: *mut u8, len: usize) -> io::Result<MemoryRegion> {
        let mr = nr_reg_mr(self.raw, addr.cast(), len.max(1));
        if mr.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(MemoryRegion { mr, lkey: nr_mr_lkey(mr), rkey: nr_mr_rkey(mr) })
    }

    /// Registers `len` bytes at `addr` for local access and for the peer's RDMA READ and WRITE
    /// (the host's data buffers, named in keyed SGLs by [`MemoryRegion::rkey`]).
    ///
    /// # Safety
    /// The memory must stay valid until the region is dropped.
    pub unsafe fn register_remote(&self, addr: *mut u8, len: usize) -> io::Result<MemoryRegion> {
        let mr = nr_reg_mr_remote(self.raw, addr.cast(), len.max(1));
        if mr.is_null() {
            return Err(io::Error::last_os_error());
        }
        Ok(MemoryRegion { mr, lkey: nr_mr_lkey(mr), rkey: nr_mr_rkey(mr) })
    }

    /// Connects a resolved id's queue pair (the host's side), sending `private_data` (at most
    /// 255 bytes); ESTABLISHED or REJECTED follows on the [`Connector`]'s channel.
    pub fn connect(&self, private_data: &[u8]) -> io::Result<()> {
        let len = private_data.len().min(255) as u8;
        // SAFETY: raw is live; the data is copied by rdma_connect.
        check(unsafe { nr_conn_connect(self.raw, private_data.as_ptr().cast(), len) })
    }

    /// Posts a receive buffer.
    ///
    /// # Safety
    /// `addr..addr+len` must lie in the region of `lkey` and stay valid until its completion.
    pub unsafe fn post_recv(&self, wr_id: u64, addr: *mut u8, len: u32, lkey: u32) -> io::Result<()> {
        check(nr_post_recv(self.raw, wr_id, addr.cast(), len, lkey))
    }

    /// Posts a send-queue work request on `addr..addr+len` (`len` 0: no local buffer).
    ///
    /// # Safety
    /// The local buffer must lie in the region of `lkey` and stay valid until the request (or a
    /// later signaled one on this queue) completes.
    pub unsafe fn post_send(&self, op: SendOp, wr_id: u64, signaled: bool, addr: *mut u8, len: u32, lkey: u32) -> io::Result<()> {
        let (code, raddr, rkey, inv) = match op {
            SendOp::Send => (0, 0, 0, 0),
            SendOp::SendInvalidate(k) => (1, 0, 0, k),
            SendOp::Write(a, k) => (2, a, k, 0),
            SendOp::Read(a, k) => (3, a, k, 0),
        };
        check(nr_post_send(self.raw, code, wr_id, signaled as c_int, addr.cast(), len, lkey, raddr, rkey, inv))
    }

    /// Takes up to `out.len()` (at most 32) completions; returns how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> io::Result<usize> {
        // SAFETY: out is valid for out.len() records.
        let n = unsafe { nr_poll(self.raw, out.as_mut_ptr(), out.len().min(32) as c_int) };
        check(n)?;
        Ok(n as usize)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // SAFETY: created by nr_conn_create and destroyed once.
        unsafe { nr_conn_destroy(self.raw) }
    }
}
