//! Drivers that feed hostile bytes to the server side of a session and check what must hold
//! whatever arrives: no panic, at most one partial record buffered, a failure that stays failed
//! and drops what was buffered, an error message without control characters from the peer, and
//! never more plaintext than ciphertext. The property tests
//! (tests/it/hostile.rs) run them; a libFuzzer target in fuzz/ can call them as they are.

use std::sync::OnceLock;

use crate::derive::{Derivation, IdentityVersion, TlsPsk};
use crate::key::{ConfiguredPsk, PskTransform};
use crate::session::{ClientConfig, ServerConfig, TlsSession};

/// Most bytes a session may hold that are not yet a whole record: one TLSCiphertext
/// (5-byte header, 2^14 + 256 bytes of body).
pub const MAX_BUFFERED: usize = 5 + (1 << 14) + 256;

const HOST: &str = "nqn.2024-01.io.nvmflab:fuzz-host";
const SUB: &str = "nqn.2024-01.io.nvmflab:fuzz-sub";

struct Fixture {
    server: ServerConfig,
    client: ClientConfig,
    /// A version 0 identity derived the other way than the server's default: the server must
    /// pick the key by the binder (crate::binder), so mutated hellos reach that parser.
    client_v0_compat: ClientConfig,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let key = ConfiguredPsk::new(PskTransform::Sha256, &[0x42; 32]).expect("fixed key");
        let psk = TlsPsk::derive(&key, HOST, SUB, Derivation::default()).expect("fixed derivation");
        let v0 = Derivation { version: IdentityVersion::V0, compat: true };
        let psk_v0 = TlsPsk::derive(&key, HOST, SUB, v0).expect("fixed derivation");
        Fixture {
            server: ServerConfig::for_subsystem(SUB, vec![(HOST.to_string(), key)], false).expect("server config"),
            client: ClientConfig::new(psk).expect("client config"),
            client_v0_compat: ClientConfig::new(psk_v0).expect("client config"),
        }
    })
}

/// Feeds `chunks` to `server`, checking the invariants after each; returns the plaintext total.
fn feed_checked<'a>(server: &mut TlsSession, chunks: impl IntoIterator<Item = &'a [u8]>) -> usize {
    let mut fed = 0usize;
    let mut plain = 0usize;
    let mut failed = None;
    for chunk in chunks {
        fed += chunk.len();
        match server.feed(chunk) {
            Ok(p) => {
                assert!(failed.is_none(), "a failed session took input again");
                plain += p.len();
            }
            Err(e) => {
                if let Some(prev) = &failed {
                    assert_eq!(&e, prev, "a failed session changed its error");
                }
                assert_eq!(server.buffered_input(), 0, "a failed session kept input");
                assert!(!e.to_string().chars().any(char::is_control), "peer bytes unescaped in {e:?}");
                assert!(server.send(b"x").is_err());
                failed = Some(e);
            }
        }
        assert!(server.buffered_input() <= MAX_BUFFERED, "{} bytes buffered", server.buffered_input());
        assert!(plain <= fed, "more plaintext than ciphertext");
        // The alert or handshake messages are for the peer; drop them.
        let _ = server.take_ciphertext();
    }
    plain
}

/// Splits `data` into chunks whose sizes come from `data` itself (so a fuzzer controls them).
fn chunks(data: &[u8]) -> Vec<&[u8]> {
    let Some((&seed, rest)) = data.split_first() else { return Vec::new() };
    let step = (seed as usize % 64) * 97 + 1;
    rest.chunks(step).collect()
}

/// Hostile bytes where a ClientHello is expected.
pub fn server_fresh(data: &[u8]) {
    let mut server = TlsSession::server(&fixture().server).expect("server session");
    feed_checked(&mut server, chunks(data));
}

/// A genuine ClientHello with bytes of it replaced: `data` is pairs of (position, value).
pub fn server_mutated_hello(data: &[u8]) {
    mutated_hello(&fixture().client, data);
}

/// [`server_mutated_hello`] with a version 0 identity whose key the server finds by the binder.
pub fn server_mutated_hello_v0(data: &[u8]) {
    mutated_hello(&fixture().client_v0_compat, data);
}

fn mutated_hello(client: &ClientConfig, data: &[u8]) {
    let f = fixture();
    let mut client = TlsSession::client(client).expect("client session");
    let mut hello = client.take_ciphertext();
    for pair in data.chunks_exact(3) {
        let pos = u16::from_le_bytes([pair[0], pair[1]]) as usize;
        if pos < hello.len() {
            hello[pos] = pair[2];
        } else if pos % 7 == 0 {
            hello.truncate(pos % (hello.len() + 1));
        }
    }
    let mut server = TlsSession::server(&f.server).expect("server session");
    feed_checked(&mut server, [&hello[..]]);
}

/// A completed handshake, then hostile bytes as the client's records.
pub fn server_after_handshake(data: &[u8]) {
    let f = fixture();
    let mut client = TlsSession::client(&f.client).expect("client session");
    let mut server = TlsSession::server(&f.server).expect("server session");
    for _ in 0..4 {
        let c = client.take_ciphertext();
        server.feed(&c).expect("handshake with the fixed key");
        let s = server.take_ciphertext();
        client.feed(&s).expect("handshake with the fixed key");
    }
    assert!(server.is_established());
    // A valid record first, so that what follows lands mid-stream.
    let rec = client.send(b"ICReq").expect("established");
    assert_eq!(server.feed(&rec).expect("genuine record"), b"ICReq");
    feed_checked(&mut server, chunks(data));
}

/// The libFuzzer target `tls_server` (fuzz/fuzz_targets/tls_server.rs) and its corpus replay
/// (tests/it/fuzz_regressions.rs): the first byte picks a driver above, the rest is its input.
pub fn by_first_byte(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else { return };
    match which % 4 {
        0 => server_fresh(rest),
        1 => server_mutated_hello(rest),
        2 => server_mutated_hello_v0(rest),
        _ => server_after_handshake(rest),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn drivers_run_on_simple_inputs() {
        super::server_fresh(&[]);
        super::server_fresh(&[3, 0x16, 3, 1, 0, 4, 1, 0, 0, 0]);
        super::server_mutated_hello(&[]);
        super::server_mutated_hello(&[9, 0, 0xff]);
        super::server_mutated_hello_v0(&[]);
        super::server_mutated_hello_v0(&[200, 0, 0x41]);
        super::server_after_handshake(&[1, 0x17, 3, 3, 0, 20, 1, 2, 3]);
    }
}
