//! Socket options every accepted NVMe/TCP connection gets (priority, TOS, busy polling,
//! congestion control); a refused option is a warning, not a failed connection.

use mio::net::TcpStream;
use std::os::fd::AsRawFd;

/// Socket options applied to every accepted connection.
#[derive(Debug, Clone)]
pub struct SocketOptions {
    pub so_priority: u32,
    pub tos: u32,
    pub busy_poll_us: u32,
    pub tcp_congestion: Option<String>,
}

/// Sets a TCP socket's congestion control by name (`TCP_CONGESTION`).
pub fn set_congestion_control(fd: i32, name: &str) -> std::io::Result<()> {
    // SAFETY: a valid fd, and a pointer to `name.len()` bytes (the kernel copies at most 16).
    let rc = unsafe { libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_ptr().cast(), name.len() as u32) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn setsockopt(fd: i32, level: i32, name: i32, value: i32, what: &str) {
    // SAFETY: passes a valid pointer to an int of the given length.
    let rc = unsafe {
        libc::setsockopt(fd, level, name, &value as *const i32 as *const libc::c_void, std::mem::size_of::<i32>() as u32)
    };
    if rc != 0 {
        tracing::warn!("setsockopt {what}={value} refused: {}", std::io::Error::last_os_error());
    }
}

pub fn apply_socket_options(stream: &TcpStream, opts: &SocketOptions) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!("TCP_NODELAY refused: {e}");
    }
    let fd = stream.as_raw_fd();
    if opts.so_priority > 0 {
        setsockopt(fd, libc::SOL_SOCKET, libc::SO_PRIORITY, opts.so_priority as i32, "SO_PRIORITY");
    }
    if opts.tos > 0 {
        match stream.local_addr() {
            Ok(a) if a.is_ipv6() => setsockopt(fd, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, opts.tos as i32, "IPV6_TCLASS"),
            _ => setsockopt(fd, libc::IPPROTO_IP, libc::IP_TOS, opts.tos as i32, "IP_TOS"),
        }
    }
    if opts.busy_poll_us > 0 {
        setsockopt(fd, libc::SOL_SOCKET, libc::SO_BUSY_POLL, opts.busy_poll_us as i32, "SO_BUSY_POLL");
    }
    // The listener has it already (start() refuses a name the kernel does not take), and an
    // accepted socket inherits it; set again so that a route's own congestion control does not win.
    if let Some(name) = &opts.tcp_congestion {
        if let Err(e) = set_congestion_control(fd, name) {
            tracing::warn!("TCP_CONGESTION={name} refused: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn accepted_sockets_get_the_congestion_control_asked_for() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let stream = TcpStream::from_std(listener.accept().unwrap().0);
        let opts = SocketOptions { so_priority: 0, tos: 0, busy_poll_us: 0, tcp_congestion: Some("reno".into()) };
        apply_socket_options(&stream, &opts);
        let mut name = [0u8; 16];
        let mut len = name.len() as libc::socklen_t;
        // SAFETY: a valid fd, and a buffer of `len` bytes the kernel writes at most `len` of.
        let r = unsafe {
            libc::getsockopt(stream.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_CONGESTION, name.as_mut_ptr().cast(), &mut len)
        };
        assert_eq!(r, 0);
        // reno is built into every kernel and always allowed.
        assert_eq!(String::from_utf8_lossy(&name[..len as usize]).trim_end_matches('\0'), "reno");
        assert!(set_congestion_control(stream.as_raw_fd(), "nosuchcc").is_err());
    }
}
