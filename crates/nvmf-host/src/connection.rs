//! What a connection needs below the protocol: the options of a connection, and the [`Link`]
//! that moves its bytes. The link is a TCP socket (set-up and options here), non-blocking once
//! connected, with TLS on top when asked for; [`Link::wait`] sleeps in poll(2) for callers that
//! want to sleep, callers that spin just retry. Tests and the fuzzer give bytes in memory
//! instead; the protocol itself is [`crate::machine::QueueMachine`], which knows no link.

use std::io::{ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How to reach a controller and what to ask of it; shared by the admin and I/O queues.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// `host:port`.
    pub addr: String,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub hdr_digest: bool,
    pub data_digest: bool,
    /// Keep Alive Timeout asked for in Connect, ms (0 = none).
    pub kato_ms: u32,
    pub so_priority: Option<u32>,
    pub tos: Option<u32>,
    pub busy_poll_us: Option<u32>,
    /// TCP congestion control of every socket (`TCP_CONGESTION`, e.g. "cubic"); None: the
    /// system's (`net.ipv4.tcp_congestion_control`). It governs how this side sends data: a
    /// pacing one (bbr) paces 128 KiB writes with a timer per burst.
    pub tcp_congestion: Option<String>,
    /// Ask in Connect for SQ flow control to be disabled (CATTR bit 2, nvme-cli's
    /// `--disable-sqflow`). The host never reads SQHD, so this costs it nothing, and a controller
    /// that grants it may end a read with a C2HData SUCCESS flag instead of a CapsuleResp.
    pub disable_sqflow: bool,
    /// Limit for connection set-up and each admin command.
    pub timeout: Duration,
    /// DH-HMAC-CHAP: the host's secret, used when the controller asks for authentication.
    pub dhchap_secret: Option<nvmf_proto::auth::Secret>,
    /// DH-HMAC-CHAP: the controller's secret; set, the host also authenticates the controller.
    pub dhchap_ctrl_secret: Option<nvmf_proto::auth::Secret>,
    /// TLS 1.3 with a PSK (`--tls`, `--tls-key`): the handshake comes before ICReq.
    pub tls: Option<crate::tls::TlsOptions>,
    /// NVMe/TCP, or NVMe over RDMA (with the `rdma` cargo feature).
    pub transport: Transport,
}

/// The NVMe-oF transport a queue pair runs on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Transport {
    #[default]
    Tcp,
    /// RDMA CM and verbs (RoCE, iWARP, InfiniBand, Soft-RoCE); `addr` is an address an RDMA
    /// device reaches.
    Rdma,
}

/// Why an RDMA queue cannot be opened by a build without the `rdma` feature.
pub const NO_RDMA: &str = "this build has no NVMe over RDMA: rebuild with cargo build --release -p nvmf-host --features rdma, \
     which needs rdma-core's librdmacm-dev and libibverbs-dev";

impl ConnectOptions {
    pub fn new(addr: impl Into<String>, hostnqn: impl Into<String>) -> Self {
        let hostnqn = hostnqn.into();
        ConnectOptions {
            addr: addr.into(),
            hostid: hostid_for(&hostnqn),
            hostnqn,
            hdr_digest: false,
            data_digest: false,
            kato_ms: 5000,
            so_priority: None,
            tos: None,
            busy_poll_us: None,
            tcp_congestion: None,
            disable_sqflow: false,
            timeout: Duration::from_secs(10),
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
            tls: None,
            transport: Transport::Tcp,
        }
    }
}

/// The default host NQN, as nvme-cli finds it: /etc/nvme/hostnqn, else one built from a fresh
/// random UUID (`nqn.2014-08.org.nvmexpress:uuid:<uuid>`).
pub fn default_hostnqn() -> String {
    if let Ok(s) = std::fs::read_to_string("/etc/nvme/hostnqn") {
        let s = s.trim();
        if !s.is_empty() {
            return s.to_string();
        }
    }
    let mut b: [u8; 16] = std::array::from_fn(|_| fastrand::u8(..));
    b[6] = (b[6] & 0x0F) | 0x40;
    b[8] = (b[8] & 0x3F) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "nqn.2014-08.org.nvmexpress:uuid:{}-{}-{}-{}-{}",
        &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32]
    )
}

/// Host ID: the UUID of a `...:uuid:<uuid>` host NQN (as nvme-cli pairs them), else random.
pub fn hostid_for(hostnqn: &str) -> [u8; 16] {
    let parsed = hostnqn.rsplit_once(":uuid:").and_then(|(_, u)| {
        let hex: String = u.chars().filter(|c| *c != '-').collect();
        (hex.len() == 32 && hex.is_ascii())
            .then(|| (0..16).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()).collect::<Option<Vec<u8>>>())
            .flatten()
    });
    match parsed {
        Some(v) => v.try_into().expect("16 bytes"),
        None => std::array::from_fn(|_| fastrand::u8(..)),
    }
}

// The trait lives in its own module so that tls.rs, which implements it, need not import this one.
pub use crate::link::Link;

/// A non-blocking TCP socket as a [`Link`].
struct TcpLink(TcpStream);

impl Link for TcpLink {
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        if buf.is_empty() {
            return Ok(0); // a read of nothing returns 0, which is not the end of the stream
        }
        loop {
            match self.0.read(buf) {
                Ok(0) => return Err(Error::Closed),
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(0),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn send(&mut self, buf: &[u8]) -> Result<usize> {
        loop {
            match self.0.write(buf) {
                Ok(0) => return Err(Error::Closed),
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(0),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn recv_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> Result<usize> {
        if bufs.iter().all(|b| b.is_empty()) {
            return Ok(0); // a read of nothing returns 0, which is not the end of the stream
        }
        loop {
            match self.0.read_vectored(bufs) {
                Ok(0) => return Err(Error::Closed),
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(0),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn send_vectored(&mut self, bufs: &[IoSlice<'_>]) -> Result<usize> {
        if bufs.iter().all(|b| b.is_empty()) {
            return Ok(0);
        }
        loop {
            match self.0.write_vectored(bufs) {
                Ok(0) => return Err(Error::Closed),
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(0),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    fn wait(&self, timeout: Duration, writing: bool) -> Result<()> {
        self.poll_for(libc::POLLIN | if writing { libc::POLLOUT } else { 0 }, timeout).map(drop)
    }

    fn readable_now(&self) -> Result<bool> {
        self.poll_for(libc::POLLIN, Duration::ZERO)
    }
}

impl TcpLink {
    /// ppoll(2) on the socket for `events`, up to `timeout`: whether any came (a signal
    /// counts as yes: the caller then tries the socket and finds out).
    fn poll_for(&self, events: libc::c_short, timeout: Duration) -> Result<bool> {
        let mut pfd = libc::pollfd { fd: self.0.as_raw_fd(), events, revents: 0 };
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: one valid pollfd, a valid timespec, no signal mask.
        match unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) } {
            r if r < 0 => match std::io::Error::last_os_error() {
                e if e.kind() == ErrorKind::Interrupted => Ok(true),
                e => Err(e.into()),
            },
            r => Ok(r > 0),
        }
    }
}

/// Connects to `opts.addr`, applies the socket options, and runs the TLS handshake when
/// `opts.tls` asks for it (its PSK identity names `subnqn`): the link a queue pair runs on.
/// With [`crate::TlsOptions::fallback`] a refused handshake is tried again on a new connection
/// with the next identity and derivation, as the kernel's host finds whichever its keyring holds.
pub fn open_link(opts: &ConnectOptions, subnqn: &str) -> Result<Box<dyn Link>> {
    let Some(tls) = &opts.tls else { return Ok(tcp_link(opts)?.0) };
    let candidates = tls.candidates();
    let mut refused = Vec::new();
    for how in &candidates {
        let psk = tls.psk_with(&opts.hostnqn, subnqn, *how)?;
        let identity = psk.identity().to_string();
        let (link, fd) = tcp_link(opts)?;
        // `fd` stays valid: the TLS link owns the TCP link that owns the socket.
        match crate::tls::TlsLink::handshake_with(link, psk, Instant::now() + opts.timeout, Some((fd, tls.ktls))) {
            Ok(l) => {
                tls.settle(*how, &identity, refused.len());
                return Ok(Box::new(l));
            }
            Err(e) if candidates.len() > 1 && crate::tls::is_refusal(&e) => {
                tracing::debug!("TLS: {} refused: {e}", crate::tls::describe(*how));
                refused.push(format!("{} ('{identity}')", crate::tls::describe(*how)));
            }
            Err(e) => return Err(e),
        }
    }
    Err(Error::Auth(format!(
        "TLS handshake refused for every identity and derivation a kernel keyring may hold: {}; \
         the target holds another key for this host and subsystem, or its port does not take TLS",
        refused.join(", ")
    )))
}

/// A TCP connection to `opts.addr` with the socket options applied, and its descriptor.
fn tcp_link(opts: &ConnectOptions) -> Result<(Box<dyn Link>, std::os::fd::RawFd)> {
    let stream = connect_tcp(&opts.addr, opts.timeout)?;
    set_socket_options(&stream, opts)?;
    stream.set_nonblocking(true)?;
    let fd = stream.as_raw_fd();
    Ok((Box::new(TcpLink(stream)), fd))
}

fn connect_tcp(addr: &str, timeout: Duration) -> Result<TcpStream> {
    let err = |source| Error::Connect { addr: addr.to_string(), source };
    let addrs = addr.to_socket_addrs().map_err(err)?;
    let mut last = std::io::Error::new(ErrorKind::NotFound, "no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(err(last))
}

/// Sets TCP_NODELAY and the options asked for ([`nvmf_proto::sockopts`], as the target does);
/// the host's policy: the first refused option fails the connect.
fn set_socket_options(stream: &TcpStream, opts: &ConnectOptions) -> Result<()> {
    let asked = nvmf_proto::sockopts::TcpSocketOptions {
        so_priority: opts.so_priority,
        tos: opts.tos,
        busy_poll_us: opts.busy_poll_us,
        tcp_congestion: opts.tcp_congestion.clone(),
    };
    match nvmf_proto::sockopts::apply(stream.as_raw_fd(), &asked).into_iter().next() {
        None => Ok(()),
        Some(r) if r.is_congestion() => Err(congestion_refused(&r.value, r.error)),
        Some(r) => Err(std::io::Error::new(r.error.kind(), r.to_string()).into()),
    }
}

/// A congestion control the kernel does not offer (or does not allow this user), named with
/// the ones it allows.
fn congestion_refused(name: &str, e: std::io::Error) -> Error {
    Error::Unsupported(format!(
        "TCP congestion control {name:?} refused ({e}); this machine allows: {}",
        nvmf_proto::sockopts::allowed_congestion_controls()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn congestion_of(stream: &TcpStream) -> String {
        let mut name = [0u8; 16];
        let mut len = name.len() as libc::socklen_t;
        // SAFETY: a valid fd, and a buffer of `len` bytes the kernel writes at most `len` of.
        let r = unsafe {
            libc::getsockopt(stream.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_mut_ptr().cast(), &mut len)
        };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
        String::from_utf8_lossy(&name[..len as usize]).trim_end_matches('\0').to_string()
    }

    #[test]
    fn the_congestion_control_asked_for_is_set_and_an_unknown_one_refused_with_what_is_allowed() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let mut opts = ConnectOptions::new("unused", "nqn.2014-08.org.nvmexpress:uuid:test");
        // reno is built into every kernel and always allowed.
        opts.tcp_congestion = Some("reno".into());
        set_socket_options(&stream, &opts).unwrap();
        assert_eq!(congestion_of(&stream), "reno");
        opts.tcp_congestion = Some("nosuchcc".into());
        let e = set_socket_options(&stream, &opts).unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("\"nosuchcc\" refused") && e.contains("reno"), "{e}");
        assert_eq!(congestion_of(&stream), "reno", "a refused name leaves the socket as it was");
    }

    #[test]
    fn hostid_comes_from_the_uuid_in_the_hostnqn() {
        let id = hostid_for("nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555");
        assert_eq!(id[0], 0x11);
        assert_eq!(id[15], 0x55);
        let nqn = default_hostnqn();
        assert!(nqn.starts_with("nqn.2014-08.org.nvmexpress:uuid:") || std::path::Path::new("/etc/nvme/hostnqn").exists());
    }

    #[test]
    fn a_tcp_link_says_whether_input_waits_without_taking_it() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        stream.set_nonblocking(true).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        let mut link = TcpLink(stream);
        assert!(!link.readable_now().unwrap(), "nothing sent yet");
        peer.write_all(b"pdu").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !link.readable_now().unwrap() {
            assert!(std::time::Instant::now() < deadline, "sent bytes never showed as readable");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(link.readable_now().unwrap(), "asking again takes nothing");
        let mut buf = [0u8; 8];
        assert_eq!(link.recv(&mut buf).unwrap(), 3);
        assert!(!link.readable_now().unwrap(), "all read");
    }
}
