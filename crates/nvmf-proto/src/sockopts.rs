//! The socket options of an NVMe/TCP connection (TCP_NODELAY, priority, TOS, busy polling,
//! congestion control), set here once for both sides. This module only sets and reports; what a
//! refusal means is each side's policy: nvmf-target warns and keeps the connection, nvmf-host
//! fails the connect. It is the one module of this crate that makes system calls, kept here
//! because this is the crate both sides depend on.

use std::fmt;
use std::io;
use std::os::fd::RawFd;

/// The options asked for beyond TCP_NODELAY, which is always set; None keeps the kernel's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TcpSocketOptions {
    pub so_priority: Option<u32>,
    /// IP_TOS, or IPV6_TCLASS on an IPv6 socket.
    pub tos: Option<u32>,
    pub busy_poll_us: Option<u32>,
    pub tcp_congestion: Option<String>,
}

/// An option the kernel refused, with the value asked for.
#[derive(Debug)]
pub struct Refused {
    /// The option's kernel name (`SO_PRIORITY`, `TCP_CONGESTION`, ...).
    pub option: &'static str,
    pub value: String,
    pub error: io::Error,
}

impl Refused {
    /// The congestion control was refused: a name this machine does not have or allow.
    pub fn is_congestion(&self) -> bool {
        self.option == "TCP_CONGESTION"
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={} refused: {}", self.option, self.value, self.error)
    }
}

/// Sets TCP_NODELAY and the options asked for on a TCP socket and returns those the kernel
/// refused (empty: all set). A refusal does not stop the options after it.
pub fn apply(fd: RawFd, opts: &TcpSocketOptions) -> Vec<Refused> {
    let mut refused = Vec::new();
    let mut set = |option: &'static str, level, name, value: u32| {
        if let Err(error) = set_int(fd, level, name, value) {
            refused.push(Refused { option, value: value.to_string(), error });
        }
    };
    set("TCP_NODELAY", libc::IPPROTO_TCP, libc::TCP_NODELAY, 1);
    if let Some(t) = opts.tos {
        if is_ipv6(fd) {
            set("IPV6_TCLASS", libc::IPPROTO_IPV6, libc::IPV6_TCLASS, t);
        } else {
            set("IP_TOS", libc::IPPROTO_IP, libc::IP_TOS, t);
        }
    }
    // After IP_TOS, which sets the priority from the TOS bits: the priority asked for wins.
    if let Some(p) = opts.so_priority {
        set("SO_PRIORITY", libc::SOL_SOCKET, libc::SO_PRIORITY, p);
    }
    if let Some(us) = opts.busy_poll_us {
        set("SO_BUSY_POLL", libc::SOL_SOCKET, libc::SO_BUSY_POLL, us);
    }
    if let Some(name) = &opts.tcp_congestion {
        if let Err(error) = set_congestion_control(fd, name) {
            refused.push(Refused { option: "TCP_CONGESTION", value: name.clone(), error });
        }
    }
    refused
}

/// Sets a TCP socket's congestion control by name (`TCP_CONGESTION`); the kernel refuses a
/// name it does not have or does not allow this user.
pub fn set_congestion_control(fd: RawFd, name: &str) -> io::Result<()> {
    // SAFETY: a valid fd, and a pointer to `name.len()` bytes (the kernel copies at most 16).
    let rc = unsafe {
        libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_ptr().cast(), name.len() as libc::socklen_t)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The congestion controls this machine lets every user set, space separated, for the message
/// that refuses one; empty when the kernel does not say.
pub fn allowed_congestion_controls() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_allowed_congestion_control").unwrap_or_default().trim().to_string()
}

fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: u32) -> io::Result<()> {
    let v = value as libc::c_int;
    // SAFETY: a valid fd and a pointer to an int of the size passed.
    let rc = unsafe {
        libc::setsockopt(fd, level, name, (&v as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn is_ipv6(fd: RawFd) -> bool {
    let mut domain: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a valid fd, and a buffer of `len` bytes the kernel writes at most `len` of.
    let rc = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN, (&mut domain as *mut libc::c_int).cast(), &mut len) };
    rc == 0 && domain == libc::AF_INET6
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd};

    fn int_of(fd: RawFd, level: libc::c_int, name: libc::c_int) -> i32 {
        let mut v: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: a valid fd, and a buffer of `len` bytes the kernel writes at most `len` of.
        assert_eq!(unsafe { libc::getsockopt(fd, level, name, (&mut v as *mut libc::c_int).cast(), &mut len) }, 0);
        v
    }

    fn congestion_of(fd: RawFd) -> String {
        let mut name = [0u8; 16];
        let mut len = name.len() as libc::socklen_t;
        // SAFETY: a valid fd, and a buffer of `len` bytes the kernel writes at most `len` of.
        assert_eq!(unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_mut_ptr().cast(), &mut len) }, 0);
        String::from_utf8_lossy(&name[..len as usize]).trim_end_matches('\0').to_string()
    }

    #[test]
    fn the_options_asked_for_are_set_and_a_refused_one_is_named_without_stopping_the_rest() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let fd = stream.as_raw_fd();
        // Priorities 0-6 and reno are open to every user.
        let opts = TcpSocketOptions { so_priority: Some(3), tos: Some(0x10), tcp_congestion: Some("reno".into()), ..Default::default() };
        assert!(apply(fd, &opts).is_empty());
        assert_eq!(int_of(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY), 1);
        assert_eq!(int_of(fd, libc::SOL_SOCKET, libc::SO_PRIORITY), 3);
        assert_eq!(int_of(fd, libc::IPPROTO_IP, libc::IP_TOS), 0x10);
        assert_eq!(congestion_of(fd), "reno");

        let opts = TcpSocketOptions { tcp_congestion: Some("nosuchcc".into()), so_priority: Some(5), ..Default::default() };
        let refused = apply(fd, &opts);
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(refused[0].is_congestion());
        assert!(refused[0].to_string().starts_with("TCP_CONGESTION=nosuchcc refused: "), "{}", refused[0]);
        assert_eq!(int_of(fd, libc::SOL_SOCKET, libc::SO_PRIORITY), 5);
        assert_eq!(congestion_of(fd), "reno", "a refused name leaves the socket as it was");
    }

    #[test]
    fn tos_is_the_traffic_class_on_ipv6() {
        // An unconnected IPv6 socket: the option needs the family, not an IPv6 address here.
        // SAFETY: socket(2) with constant arguments.
        let raw = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_STREAM, 0) };
        assert!(raw >= 0, "an IPv6 socket: {}", io::Error::last_os_error());
        // SAFETY: a fresh fd that nothing else owns.
        let sock = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let fd = sock.as_raw_fd();
        assert!(is_ipv6(fd));
        assert!(apply(fd, &TcpSocketOptions { tos: Some(0x20), ..Default::default() }).is_empty());
        assert_eq!(int_of(fd, libc::IPPROTO_IPV6, libc::IPV6_TCLASS), 0x20);
    }
}
