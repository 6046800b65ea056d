//! The keys `take_kernel_keys` hands to kTLS, checked without a kernel that has it: records made
//! with them (AES-GCM by hand, sequence numbers from 0) are what the other side's session
//! decrypts, and records that session makes decrypt with them (its records are our own since
//! issue 40, made with the same keys; tests/it/openssl_cli.rs checks them against OpenSSL's). That is what a kTLS side
//! talking to a userspace side depends on. The handshake reads stop at the last handshake
//! record (`RecordBoundary`), leaving the first application record whole for the kernel.

use nvmf_tls::boundary::RecordBoundary;
use nvmf_tls::ktls::TrafficKeys;
use nvmf_tls::session::{ClientConfig, ServerConfig, TlsSession};
use nvmf_tls::{ConfiguredPsk, Derivation, IdentityVersion, PskTransform, TlsError, TlsHash, TlsPsk};
use openssl::symm::{decrypt_aead, encrypt_aead, Cipher};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const SUB: &str = "nqn.2024-01.io.nvmflab:sub0";
const APPLICATION_DATA: u8 = 23;

fn pair(t: PskTransform) -> (TlsSession, TlsSession) {
    let key = ConfiguredPsk::generate(t, 0).unwrap();
    let server = ServerConfig::for_subsystem(SUB, vec![(HOST.to_string(), key.clone())], false).unwrap();
    let psk = TlsPsk::derive(&key, HOST, SUB, Derivation { version: IdentityVersion::V1, compat: false }).unwrap();
    let client = ClientConfig::new(psk).unwrap();
    (TlsSession::client(&client).unwrap(), TlsSession::server(&server).unwrap())
}

fn cipher(k: &TrafficKeys) -> Cipher {
    match k.hash() {
        TlsHash::Sha256 => Cipher::aes_128_gcm(),
        TlsHash::Sha384 => Cipher::aes_256_gcm(),
    }
}

fn nonce(k: &TrafficKeys, seq: u64) -> Vec<u8> {
    let mut n = k.iv().to_vec();
    for (b, s) in n[4..].iter_mut().zip(seq.to_be_bytes()) {
        *b ^= s;
    }
    n
}

/// One TLS 1.3 application record as the kernel would make it at sequence `seq`.
fn seal(k: &TrafficKeys, seq: u64, plaintext: &[u8]) -> Vec<u8> {
    let inner = [plaintext, &[APPLICATION_DATA]].concat();
    let len = (inner.len() + 16) as u16;
    let header = [APPLICATION_DATA, 3, 3, (len >> 8) as u8, len as u8];
    let mut tag = [0u8; 16];
    let body = encrypt_aead(cipher(k), k.key(), Some(&nonce(k, seq)), &header, &inner, &mut tag).unwrap();
    [&header[..], &body, &tag].concat()
}

/// Decrypts one record as the kernel would at sequence `seq`: (content type, plaintext).
fn open(k: &TrafficKeys, seq: u64, record: &[u8]) -> (u8, Vec<u8>) {
    let (header, rest) = record.split_at(5);
    let len = u16::from_be_bytes([header[3], header[4]]) as usize;
    assert_eq!(rest.len(), len, "exactly one record");
    let (body, tag) = rest.split_at(len - 16);
    let mut inner = decrypt_aead(cipher(k), k.key(), Some(&nonce(k, seq)), header, body, tag).expect("authenticates");
    while inner.last() == Some(&0) {
        inner.pop();
    }
    let t = inner.pop().unwrap();
    (t, inner)
}

/// Feeds `stream` to `s` in reads that stop at record ends, until the handshake is done; returns
/// what was not read.
fn feed_to_handshake_end<'a>(s: &mut TlsSession, stream: &'a [u8]) -> &'a [u8] {
    let mut b = RecordBoundary::new();
    let mut pos = 0;
    while !s.is_established() && pos < stream.len() {
        let n = b.want().min(stream.len() - pos);
        b.advance(&stream[pos..pos + n]);
        let plain = s.feed(&stream[pos..pos + n]).unwrap();
        assert!(plain.is_empty(), "no application data before the end of the handshake");
        pos += n;
    }
    assert!(b.at_boundary());
    &stream[pos..]
}

#[test]
fn kernel_side_client_talks_to_userspace_server_both_suites() {
    for t in [PskTransform::Sha256, PskTransform::Sha384] {
        let (mut c, mut s) = pair(t);
        s.feed(&c.take_ciphertext()).unwrap();
        let flight = s.take_ciphertext();
        assert!(feed_to_handshake_end(&mut c, &flight).is_empty());
        let finished = c.take_ciphertext();
        let keys = c.take_kernel_keys().expect("keys after the handshake");
        assert!(c.send(b"x").is_err() && c.is_kernel(), "the session makes no records any more");
        assert_eq!(keys.tx.hash(), c.info().unwrap().hash);
        s.feed(&finished).unwrap();
        assert!(s.is_established());
        // Ours (kernel side) -> theirs: sequence 0, 1, 2.
        for (seq, msg) in [(0u64, &b"ICReq"[..]), (1, b"capsule"), (2, &[0x5a; 9000])] {
            assert_eq!(s.feed(&seal(&keys.tx, seq, msg)).unwrap(), msg, "{t:?} record {seq}");
        }
        // Theirs -> ours.
        for (seq, msg) in [(0u64, &b"ICResp"[..]), (1, b"response")] {
            let record = s.send(msg).unwrap();
            assert_eq!(open(&keys.rx, seq, &record), (APPLICATION_DATA, msg.to_vec()), "{t:?} record {seq}");
        }
    }
}

#[test]
fn kernel_side_server_leaves_the_first_application_record_unread() {
    for t in [PskTransform::Sha256, PskTransform::Sha384] {
        let (mut c, mut s) = pair(t);
        s.feed(&c.take_ciphertext()).unwrap();
        c.feed(&s.take_ciphertext()).unwrap();
        assert!(c.is_established());
        // The client's Finished and its first record arrive together, as they do on a socket.
        let mut stream = c.take_ciphertext();
        stream.extend(c.send(b"ICReq from a userspace client").unwrap());
        let rest = feed_to_handshake_end(&mut s, &stream);
        assert!(s.is_established());
        let keys = s.take_kernel_keys().expect("nothing after the handshake was consumed");
        assert_eq!(open(&keys.rx, 0, rest), (APPLICATION_DATA, b"ICReq from a userspace client".to_vec()));
        assert_eq!(c.feed(&seal(&keys.tx, 0, b"ICResp")).unwrap(), b"ICResp");
    }
}

#[test]
fn keys_are_refused_when_records_already_went_through_userspace() {
    let (mut c, mut s) = pair(PskTransform::Sha256);
    assert!(matches!(c.take_kernel_keys(), Err(TlsError::NotEstablished)));
    s.feed(&c.take_ciphertext()).unwrap();
    c.feed(&s.take_ciphertext()).unwrap();
    // The Finished is not sent yet.
    let e = c.take_kernel_keys().unwrap_err();
    assert!(e.to_string().contains("not sent"), "{e}");
    s.feed(&c.take_ciphertext()).unwrap();
    s.send(b"data").unwrap();
    let e = s.take_kernel_keys().unwrap_err();
    assert!(e.to_string().contains("userspace"), "{e}");
    // Bytes past the handshake read by a reader that did not stop at the record end.
    let (mut c, mut s) = pair(PskTransform::Sha256);
    s.feed(&c.take_ciphertext()).unwrap();
    let mut flight = s.take_ciphertext();
    flight.extend(&[APPLICATION_DATA, 3, 3]);
    c.feed(&flight).unwrap();
    assert!(c.is_established());
    let e = c.take_kernel_keys().unwrap_err();
    assert!(e.to_string().contains("read already"), "{e}");
}
