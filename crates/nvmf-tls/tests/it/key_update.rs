//! A peer's KeyUpdate (RFC 8446 4.6.3) is followed: our client against a plain OpenSSL server
//! with the same PSK, over in-memory pipes. OpenSSL sends the KeyUpdate, with and without
//! update_requested, and derives the keys on its side, so a wrong "traffic upd" step or a
//! missing answer shows as a record one side cannot open.

use std::ffi::c_int;
use std::io::{Read, Write};

use foreign_types::ForeignTypeRef;
use nvmf_tls::record::OVERHEAD;
use nvmf_tls::{ClientConfig, TlsHash, TlsPsk, TlsSession};
use openssl::ssl::{Ssl, SslContextBuilder, SslMethod, SslStream, SslVersion};
use openssl_sys::SSL;

extern "C" {
    // libssl (OpenSSL 1.1.1 and later); `openssl-sys` does not declare it.
    fn SSL_key_update(s: *mut SSL, updatetype: c_int) -> c_int;
}

const SSL_KEY_UPDATE_NOT_REQUESTED: c_int = 0;
const SSL_KEY_UPDATE_REQUESTED: c_int = 1;
/// The record carrying our KeyUpdate: 5 bytes of handshake message in a record.
const KEY_UPDATE_RECORD: usize = 5 + OVERHEAD;

#[derive(Default)]
struct Pipe {
    inp: std::collections::VecDeque<u8>,
    out: Vec<u8>,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.inp.is_empty() {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        self.inp.read(buf)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Our client established with an OpenSSL server that looks the PSK up with the legacy
/// server callback (TLS_AES_128_GCM_SHA256).
fn established_pair() -> (TlsSession, SslStream<Pipe>) {
    let psk = TlsPsk::from_raw("NVMe0R01 nqn.2024-01.io.h nqn.2024-01.io.s", TlsHash::Sha256, &[0x5a; 32]).unwrap();
    let key = psk.key().to_vec();
    let mut b = SslContextBuilder::new(SslMethod::tls()).unwrap();
    b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    b.set_psk_server_callback(move |_ssl, _identity, out| {
        out[..key.len()].copy_from_slice(&key);
        Ok(key.len())
    });
    let mut ssl = Ssl::new(&b.build()).unwrap();
    ssl.set_accept_state();
    let mut server = SslStream::new(ssl, Pipe::default()).unwrap();
    let mut client = TlsSession::client(&ClientConfig::new(psk).unwrap()).unwrap();
    for _ in 0..8 {
        server.get_mut().inp.extend(client.take_ciphertext());
        let done = server.do_handshake().is_ok();
        let back = std::mem::take(&mut server.get_mut().out);
        client.feed(&back).unwrap();
        if done && client.is_established() && !client.has_ciphertext() {
            break;
        }
    }
    assert!(client.is_established(), "handshake with the OpenSSL server");
    (client, server)
}

/// The server's plaintext from what the client sent: all of it must open.
fn server_reads(server: &mut SslStream<Pipe>, wire: Vec<u8>, want: usize) -> Vec<u8> {
    server.get_mut().inp.extend(wire);
    let mut got = vec![0u8; want];
    server.read_exact(&mut got).expect("the server opens the client's records");
    assert!(server.get_ref().inp.is_empty(), "nothing left unread");
    got
}

#[test]
fn a_peers_key_update_keeps_data_flowing_both_ways() {
    let (mut client, mut server) = established_pair();
    let mut round = |request: Option<c_int>, n: u8| {
        if let Some(kind) = request {
            // SAFETY: a valid, established SSL.
            assert_eq!(unsafe { SSL_key_update(server.ssl().as_ptr(), kind) }, 1);
        }
        // Server to client: the KeyUpdate goes out before this data, which the new key seals.
        let down = vec![n; 20_000];
        server.write_all(&down).unwrap();
        let wire = std::mem::take(&mut server.get_mut().out);
        assert_eq!(client.feed(&wire).unwrap(), down, "round {n}: the client opens the server's records");
        // Client to server: asked for one, our KeyUpdate goes first and the data after it is
        // sealed with our next key (the server fails to open it otherwise).
        let up = vec![n.wrapping_add(100); 5000];
        let wire = client.send(&up).unwrap();
        let answer = if request == Some(SSL_KEY_UPDATE_REQUESTED) { KEY_UPDATE_RECORD } else { 0 };
        assert_eq!(wire.len(), up.len() + OVERHEAD + answer, "round {n}: our KeyUpdate answers only a request");
        assert_eq!(server_reads(&mut server, wire, up.len()), up, "round {n}");
    };
    round(None, 0);
    round(Some(SSL_KEY_UPDATE_NOT_REQUESTED), 1);
    round(Some(SSL_KEY_UPDATE_REQUESTED), 2);
    round(None, 3);
    // Several generations in a row, both kinds.
    round(Some(SSL_KEY_UPDATE_REQUESTED), 4);
    round(Some(SSL_KEY_UPDATE_NOT_REQUESTED), 5);
    round(Some(SSL_KEY_UPDATE_REQUESTED), 6);
}

#[test]
fn a_key_update_arriving_with_data_in_one_read_is_followed() {
    // The KeyUpdate and the records after it arrive in one piece, and the answer waits for our
    // next send while more of the peer's data comes.
    let (mut client, mut server) = established_pair();
    // SAFETY: a valid, established SSL.
    assert_eq!(unsafe { SSL_key_update(server.ssl().as_ptr(), SSL_KEY_UPDATE_REQUESTED) }, 1);
    server.write_all(b"first").unwrap();
    server.write_all(b"second").unwrap();
    let wire = std::mem::take(&mut server.get_mut().out);
    assert_eq!(client.feed(&wire).unwrap(), b"firstsecond");
    server.write_all(b"third").unwrap();
    let wire = std::mem::take(&mut server.get_mut().out);
    assert_eq!(client.feed(&wire).unwrap(), b"third");
    let wire = client.send(b"reply").unwrap();
    assert_eq!(wire.len(), 5 + OVERHEAD + KEY_UPDATE_RECORD);
    assert_eq!(server_reads(&mut server, wire, 5), b"reply");
}
