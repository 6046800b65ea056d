//! One NVMe/TCP connection: ICReq/ICResp and PDU framing over reusable send and receive
//! buffers, on a [`Link`] that moves the bytes. The link is a TCP socket (set-up and options
//! here), non-blocking once connected; callers that want to sleep use [`Connection::wait`]
//! (poll(2)), callers that spin just retry. Tests and the fuzzer give it bytes in memory
//! instead, so the queue pair's protocol machine runs without a socket.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};

use nvmf_proto::pdu::{encode_pdu, IcReq, TermReq, PFV_1_0};
use nvmf_proto::{Digests, Frame, Framer, PduHeader, Role};

use crate::error::{fes_name, Error, Result};

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
    /// Limit for connection set-up and each admin command.
    pub timeout: Duration,
    /// DH-HMAC-CHAP: the host's secret, used when the controller asks for authentication.
    pub dhchap_secret: Option<nvmf_proto::auth::Secret>,
    /// DH-HMAC-CHAP: the controller's secret; set, the host also authenticates the controller.
    pub dhchap_ctrl_secret: Option<nvmf_proto::auth::Secret>,
    /// TLS 1.3 with a PSK (`--tls`, `--tls-key`): the handshake comes before ICReq.
    pub tls: Option<crate::tls::TlsOptions>,
}

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
            timeout: Duration::from_secs(10),
            dhchap_secret: None,
            dhchap_ctrl_secret: None,
            tls: None,
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

/// The byte stream under a [`Connection`]: a TCP socket, or bytes in memory (tests, fuzzing).
pub trait Link: Send {
    /// Reads what has arrived into `buf`: how many bytes, 0 when none has yet;
    /// [`Error::Closed`] once the peer ended the stream.
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize>;
    /// Writes what the link takes now: how many bytes, 0 when it would block.
    fn send(&mut self, buf: &[u8]) -> Result<usize>;
    /// Sleeps until input may have arrived (or, with `writing`, the link may take more) or
    /// `timeout` passed.
    fn wait(&self, timeout: Duration, writing: bool) -> Result<()>;
}

/// A non-blocking TCP socket as a [`Link`].
struct TcpLink(TcpStream);

impl Link for TcpLink {
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
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

    fn wait(&self, timeout: Duration, writing: bool) -> Result<()> {
        let mut pfd = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN | if writing { libc::POLLOUT } else { 0 },
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: one valid pollfd, a valid timespec, no signal mask.
        let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(e.into());
            }
        }
        Ok(())
    }
}

/// A connected, initialized NVMe/TCP connection.
pub struct Connection {
    link: Box<dyn Link>,
    framer: Framer,
    pub digests: Digests,
    /// Largest H2CData payload the controller accepts.
    pub maxh2cdata: u32,
    rx: Vec<u8>,
    rx_start: usize,
    rx_end: usize,
    /// PDUs waiting to be written; `tx_sent` bytes of it already went out.
    pub tx: Vec<u8>,
    tx_sent: usize,
}

impl Connection {
    /// Connects, applies the socket options, runs the TLS handshake when `opts.tls` asks for
    /// it (its PSK identity names `subnqn`) and exchanges ICReq/ICResp. `max_c2h` is the
    /// largest C2HData payload this connection must accept (the largest read it will issue).
    pub fn open(opts: &ConnectOptions, subnqn: &str, max_c2h: u32) -> Result<Connection> {
        let stream = connect_tcp(&opts.addr, opts.timeout)?;
        stream.set_nodelay(true)?;
        set_socket_options(&stream, opts)?;
        stream.set_nonblocking(true)?;
        let link: Box<dyn Link> = Box::new(TcpLink(stream));
        let link = match &opts.tls {
            None => link,
            Some(tls) => {
                let psk = tls.psk(&opts.hostnqn, subnqn)?;
                Box::new(crate::tls::TlsLink::handshake(link, psk, Instant::now() + opts.timeout)?)
            }
        };
        Connection::open_on(link, opts, max_c2h)
    }

    /// Exchanges ICReq/ICResp on `link` (`opts.addr` and the socket options are not used).
    pub fn open_on(link: Box<dyn Link>, opts: &ConnectOptions, max_c2h: u32) -> Result<Connection> {
        let framer = Framer::new(Role::Host, max_c2h.max(4096));
        let rx_cap = (2 * framer.max_pdu_len()).max(256 << 10);
        let mut c = Connection {
            link,
            framer,
            digests: Digests::default(),
            maxh2cdata: 0,
            rx: vec![0; rx_cap],
            rx_start: 0,
            rx_end: 0,
            tx: Vec::with_capacity(256 << 10),
            tx_sent: 0,
        };
        c.initialize(opts)?;
        Ok(c)
    }

    fn initialize(&mut self, opts: &ConnectOptions) -> Result<()> {
        let req = IcReq { pfv: PFV_1_0, hpda: 0, hdgst: opts.hdr_digest, ddgst: opts.data_digest, maxr2t: 0 };
        encode_pdu(&mut self.tx, &PduHeader::IcReq(req), &[], Digests::default());
        let deadline = Instant::now() + opts.timeout;
        self.flush_until(deadline)?;
        let frame = self.recv_until(deadline, "ICResp")?;
        let PduHeader::IcResp(resp) = frame.header else {
            return Err(Error::Protocol(format!("expected ICResp, got {:?}", frame.header.pdu_type())));
        };
        self.consume(&frame);
        if resp.pfv != PFV_1_0 {
            return Err(Error::Protocol(format!("ICResp PFV {} is not 0 (NVMe/TCP 1.0)", resp.pfv)));
        }
        if resp.maxh2cdata < 4096 || resp.maxh2cdata % 4 != 0 {
            return Err(Error::Protocol(format!(
                "ICResp MAXH2CDATA {} is under 4096 or not a multiple of 4",
                resp.maxh2cdata
            )));
        }
        if resp.hdgst != opts.hdr_digest || resp.ddgst != opts.data_digest {
            return Err(Error::Protocol(format!(
                "digests asked header={} data={}, target answered header={} data={}",
                opts.hdr_digest, opts.data_digest, resp.hdgst, resp.ddgst
            )));
        }
        self.digests = Digests { header: resp.hdgst, data: resp.ddgst };
        self.framer.digests = self.digests;
        self.maxh2cdata = resp.maxh2cdata;
        Ok(())
    }

    /// Writes as much of the pending PDUs as the socket takes now. True when all went out.
    pub fn flush(&mut self) -> Result<bool> {
        while self.tx_sent < self.tx.len() {
            match self.link.send(&self.tx[self.tx_sent..])? {
                0 => return Ok(false),
                n => self.tx_sent += n,
            }
        }
        self.tx.clear();
        self.tx_sent = 0;
        Ok(true)
    }

    pub fn has_pending_tx(&self) -> bool {
        self.tx_sent < self.tx.len()
    }

    /// Reads what the socket has now into the receive buffer; returns the byte count (0 when
    /// nothing was ready).
    pub fn fill(&mut self) -> Result<usize> {
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
        } else if self.rx_end == self.rx.len() {
            self.rx.copy_within(self.rx_start..self.rx_end, 0);
            self.rx_end -= self.rx_start;
            self.rx_start = 0;
        }
        let n = self.link.recv(&mut self.rx[self.rx_end..])?;
        self.rx_end += n;
        Ok(n)
    }

    /// The next whole PDU in the receive buffer, if any. Its `data` range indexes
    /// [`Connection::rx_bytes`]; call [`Connection::consume`] when done with it. A framing error
    /// is answered with an H2CTermReq and returned; a C2HTermReq from the target becomes an error.
    pub fn next_frame(&mut self) -> Result<Option<Frame>> {
        let buf = &self.rx[self.rx_start..self.rx_end];
        match self.framer.next(buf) {
            Ok(None) => Ok(None),
            Ok(Some(mut f)) => {
                f.data = f.data.start + self.rx_start..f.data.end + self.rx_start;
                if let PduHeader::C2HTermReq(t) = &f.header {
                    return Err(Error::TermReq { fes: t.fes, fei: t.fei, reason: fes_name(t.fes) });
                }
                Ok(Some(f))
            }
            Err(fatal) => {
                let header = buf[..fatal.hlen.min(buf.len())].to_vec();
                self.terminate(fatal.fes, fatal.fei, header);
                Err(Error::Protocol(format!("{} in a PDU from the target (FEI {})", fes_name(fatal.fes), fatal.fei)))
            }
        }
    }

    pub fn rx_bytes(&self) -> &[u8] {
        &self.rx
    }

    pub fn consume(&mut self, frame: &Frame) {
        self.rx_start += frame.len;
    }

    /// Sends an H2CTermReq (best effort) before the caller drops the connection.
    pub fn terminate(&mut self, fes: u16, fei: u32, header: Vec<u8>) {
        self.tx.clear();
        self.tx_sent = 0;
        let t = TermReq { fes, fei, header };
        encode_pdu(&mut self.tx, &PduHeader::H2CTermReq(t), &[], Digests::default());
        let _ = self.flush_until(Instant::now() + Duration::from_millis(100));
    }

    /// Sleeps until the link is readable (or writable, while PDUs are pending) or `timeout`.
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        self.link.wait(timeout, self.has_pending_tx())
    }

    /// Flushes everything pending, sleeping as needed, until `deadline`.
    pub fn flush_until(&mut self, deadline: Instant) -> Result<()> {
        while !self.flush()? {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout("the target stopped reading from the socket".into()));
            }
            self.wait(left)?;
        }
        Ok(())
    }

    /// Receives one PDU, sleeping as needed, until `deadline`.
    pub fn recv_until(&mut self, deadline: Instant, what: &str) -> Result<Frame> {
        loop {
            if let Some(f) = self.next_frame()? {
                return Ok(f);
            }
            if self.fill()? == 0 {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::Timeout(format!("no {what} from the target")));
                }
                self.wait(left)?;
            }
        }
    }
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

fn setsockopt(stream: &TcpStream, level: libc::c_int, name: libc::c_int, v: u32) -> Result<()> {
    let v = v as libc::c_int;
    // SAFETY: a valid fd and a pointer to an int of the size passed.
    let r = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            level,
            name,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

fn set_socket_options(stream: &TcpStream, opts: &ConnectOptions) -> Result<()> {
    if let Some(p) = opts.so_priority {
        setsockopt(stream, libc::SOL_SOCKET, libc::SO_PRIORITY, p)?;
    }
    if let Some(t) = opts.tos {
        if stream.peer_addr()?.is_ipv6() {
            setsockopt(stream, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, t)?;
        } else {
            setsockopt(stream, libc::IPPROTO_IP, libc::IP_TOS, t)?;
        }
    }
    if let Some(us) = opts.busy_poll_us {
        setsockopt(stream, libc::SOL_SOCKET, libc::SO_BUSY_POLL, us)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostid_comes_from_the_uuid_in_the_hostnqn() {
        let id = hostid_for("nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555");
        assert_eq!(id[0], 0x11);
        assert_eq!(id[15], 0x55);
        let nqn = default_hostnqn();
        assert!(nqn.starts_with("nqn.2014-08.org.nvmexpress:uuid:") || std::path::Path::new("/etc/nvme/hostnqn").exists());
    }
}
