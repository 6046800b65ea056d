//! Interop with the `openssl` command line (`s_server`, `s_client`) over loopback TCP, in bounded
//! time. Skipped (with a line saying so) where no `openssl` binary is on PATH.
//!
//! `s_server`/`s_client -psk` build their TLS 1.3 PSK session with TLS_AES_128_GCM_SHA256 only, so
//! these runs cover the SHA-256 suite; the SHA-384 suite is covered between our own client and
//! server (tests/it/session.rs).

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nvmf_tls::session::{ClientConfig, ServerConfig, TlsSession};
use nvmf_tls::{ConfiguredPsk, Derivation, PskTransform, TlsError, TlsPsk};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100";
const SUB: &str = "nqn.2024-01.io.nvmflab:interop";
const LIMIT: Duration = Duration::from_secs(20);

fn have_openssl() -> bool {
    let ok = Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: no `openssl` command on PATH");
    }
    ok
}

/// Kills the child when the test ends, however it ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn psk() -> TlsPsk {
    let key = ConfiguredPsk::generate(PskTransform::Sha256, 32).unwrap();
    TlsPsk::derive(&key, HOST, SUB, Derivation::default()).unwrap()
}

/// Runs `sess` over `sock` until `done` says so, the session fails, the peer closes, or LIMIT.
fn drive(
    sess: &mut TlsSession,
    sock: &mut TcpStream,
    mut done: impl FnMut(&mut TlsSession, &[u8], &mut TcpStream) -> bool,
) -> Result<Vec<u8>, TlsError> {
    sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let start = Instant::now();
    let mut plain = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let out = sess.take_ciphertext();
        if !out.is_empty() {
            let _ = sock.write_all(&out);
        }
        if done(sess, &plain, sock) {
            return Ok(plain);
        }
        assert!(start.elapsed() < LIMIT, "interop run took longer than {LIMIT:?}");
        match sock.read(&mut buf) {
            Ok(0) => return Ok(plain),
            Ok(n) => match sess.feed(&buf[..n]) {
                Ok(p) => plain.extend(p),
                Err(e) => {
                    let _ = sock.write_all(&sess.take_ciphertext());
                    return Err(e);
                }
            },
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Ok(plain),
        }
    }
}

fn s_client(port: u16, identity: &str, key: &[u8], extra: &[&str]) -> Reaped {
    let child = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}"), "-quiet"])
        .args(["-psk_identity", identity, "-psk", &hex(key)])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn openssl s_client");
    Reaped(child)
}

/// Our server accepts one connection from `openssl s_client`; returns its result and the client.
fn our_server_vs_s_client(server_psk: TlsPsk, client_key: &[u8], extra: &[&str]) -> (Result<Vec<u8>, TlsError>, Reaped) {
    let identity = server_psk.identity().to_string();
    let cfg = ServerConfig::with_keys(vec![server_psk]).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut client = s_client(port, &identity, client_key, extra);
    client.0.stdin.as_mut().unwrap().write_all(b"ping from s_client\n").unwrap();
    listener.set_nonblocking(true).unwrap();
    let start = Instant::now();
    let mut sock = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(start.elapsed() < LIMIT, "s_client did not connect");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("accept: {e}"),
        }
    };
    sock.set_nonblocking(false).unwrap();
    let mut s = TlsSession::server(&cfg).unwrap();
    let mut replied = false;
    let r = drive(&mut s, &mut sock, |sess, plain, sock| {
        if !replied && plain.ends_with(b"\n") {
            let out = sess.send(b"pong from nvmf-tls\n").unwrap();
            sock.write_all(&out).unwrap();
            sock.write_all(&sess.close()).unwrap();
            replied = true;
            return true;
        }
        false
    });
    if r.is_ok() {
        let info = s.info().expect("established");
        assert_eq!(info.suite, "TLS_AES_128_GCM_SHA256");
        assert_eq!(info.identity, identity);
    }
    (r, client)
}

#[test]
fn our_server_with_openssl_s_client() {
    if !have_openssl() {
        return;
    }
    let p = psk();
    let key = p.key().to_vec();
    let (r, mut client) = our_server_vs_s_client(p, &key, &["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"]);
    assert_eq!(r.unwrap(), b"ping from s_client\n");
    let mut out = String::new();
    client.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(out.contains("pong from nvmf-tls"), "s_client printed {out:?}");
}

#[test]
fn our_server_refuses_openssl_s_client_with_wrong_key() {
    if !have_openssl() {
        return;
    }
    let p = psk();
    let identity = p.identity().to_string();
    let (r, _client) = our_server_vs_s_client(p, &[0x5a; 32], &["-tls1_3"]);
    assert_eq!(r.unwrap_err(), TlsError::WrongKey { identity });
}

#[test]
fn our_server_refuses_openssl_s_client_tls12() {
    if !have_openssl() {
        return;
    }
    let p = psk();
    let key = p.key().to_vec();
    let (r, _client) = our_server_vs_s_client(p, &key, &["-tls1_2"]);
    assert!(matches!(r, Err(TlsError::Unsupported(_))), "{r:?}");
}

/// `openssl s_server -rev` (echoes each line reversed) with a PSK; our client talks to it.
fn our_client_vs_s_server(server_key: &[u8], client_psk: TlsPsk) -> (Result<Vec<u8>, TlsError>, Reaped) {
    let mut server = Reaped(
        Command::new("openssl")
            .args(["s_server", "-accept", "127.0.0.1:0", "-nocert", "-tls1_3", "-naccept", "1", "-rev"])
            .args(["-psk_identity", client_psk.identity(), "-psk", &hex(server_key)])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn openssl s_server"),
    );
    // "ACCEPT 127.0.0.1:<port>" tells where it listens.
    let mut lines = BufReader::new(server.0.stdout.take().unwrap()).lines();
    let port: u16 = loop {
        let line = lines.next().expect("s_server exited before ACCEPT").unwrap();
        if let Some(addr) = line.strip_prefix("ACCEPT ") {
            break addr.rsplit(':').next().unwrap().parse().unwrap();
        }
    };
    let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let cfg = ClientConfig::new(client_psk).unwrap();
    let mut c = TlsSession::client(&cfg).unwrap();
    let mut sent = false;
    let r = drive(&mut c, &mut sock, |sess, plain, sock| {
        if sess.is_established() && !sent {
            sock.write_all(&sess.send(b"hello from nvmf-tls\n").unwrap()).unwrap();
            sent = true;
        }
        plain.ends_with(b"\n")
    });
    (r, server)
}

#[test]
fn our_client_with_openssl_s_server() {
    if !have_openssl() {
        return;
    }
    let p = psk();
    let key = p.key().to_vec();
    let (r, _server) = our_client_vs_s_server(&key, p);
    let got = String::from_utf8(r.unwrap()).unwrap();
    assert!(got.contains("slt-fmvn morf olleh"), "s_server sent {got:?}");
}

#[test]
fn our_client_against_openssl_s_server_with_wrong_key() {
    if !have_openssl() {
        return;
    }
    let p = psk();
    let identity = p.identity().to_string();
    let (r, _server) = our_client_vs_s_server(&[0xa5; 32], p);
    assert_eq!(r.unwrap_err(), TlsError::WrongKey { identity });
}
