//! Socket options every accepted NVMe/TCP connection gets (nodelay, priority, TOS, busy polling,
//! congestion control), set by [`nvmf_proto::sockopts`] as the host's are; the target's policy is
//! here: a refused option is a warning, not a failed connection.

use mio::net::TcpStream;
use std::os::fd::AsRawFd;

pub use nvmf_proto::sockopts::set_congestion_control;

/// Socket options applied to every accepted connection; 0 keeps the kernel's value.
#[derive(Debug, Clone)]
pub struct SocketOptions {
    pub so_priority: u32,
    pub tos: u32,
    pub busy_poll_us: u32,
    /// The listener has it already (start() refuses a name the kernel does not take), and an
    /// accepted socket inherits it; set again so that a route's own congestion control does not win.
    pub tcp_congestion: Option<String>,
}

pub fn apply_socket_options(stream: &TcpStream, opts: &SocketOptions) {
    let asked = nvmf_proto::sockopts::TcpSocketOptions {
        so_priority: Some(opts.so_priority).filter(|&v| v > 0),
        tos: Some(opts.tos).filter(|&v| v > 0),
        busy_poll_us: Some(opts.busy_poll_us).filter(|&v| v > 0),
        tcp_congestion: opts.tcp_congestion.clone(),
    };
    for refused in nvmf_proto::sockopts::apply(stream.as_raw_fd(), &asked) {
        tracing::warn!("setsockopt {refused}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
