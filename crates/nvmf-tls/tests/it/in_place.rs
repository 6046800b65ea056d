//! The socket-facing calls of a session: the peer's bytes read into the session's receive buffer
//! (`recv_space`/`received`), records opened there in place (`read_plaintext`), and records
//! sealed from slices straight into a send buffer (`seal_vectored`).

use std::io::IoSlice;

use nvmf_tls::session::{ClientConfig, ServerConfig, TlsSession};
use nvmf_tls::{TlsError, TlsHash, TlsPsk};

const ID: &str = "NVMe0R01 nqn.2024-01.io.h nqn.2024-01.io.s";

/// What a socket read does: copies up to `step` bytes of `wire` into the session's space.
fn deliver(to: &mut TlsSession, wire: &[u8], step: usize) -> Result<(), TlsError> {
    for chunk in wire.chunks(step.max(1)) {
        let space = to.recv_space();
        assert!(space.len() >= chunk.len(), "room for a read");
        space[..chunk.len()].copy_from_slice(chunk);
        to.received(chunk.len())?;
    }
    Ok(())
}

fn read_all(s: &mut TlsSession) -> Result<Vec<u8>, TlsError> {
    let mut out = Vec::new();
    let mut buf = [0u8; 1000];
    loop {
        match s.read_plaintext(&mut buf)? {
            0 => return Ok(out),
            n => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// A client whose Finished has not been delivered yet, and its server.
fn almost_established(hash: TlsHash) -> (TlsSession, TlsSession) {
    let psk = TlsPsk::from_raw(ID, hash, &vec![5; hash.digest_len()]).unwrap();
    let mut c = TlsSession::client(&ClientConfig::new(psk.clone()).unwrap()).unwrap();
    let mut s = TlsSession::server(&ServerConfig::with_keys(vec![psk]).unwrap()).unwrap();
    deliver(&mut s, &c.take_ciphertext(), 4096).unwrap();
    deliver(&mut c, &s.take_ciphertext(), 4096).unwrap();
    assert!(c.is_established() && !s.is_established());
    (c, s)
}

#[test]
fn finished_and_first_records_in_one_read_give_their_plaintext() {
    for hash in [TlsHash::Sha256, TlsHash::Sha384] {
        let (mut c, mut s) = almost_established(hash);
        let (icreq, data) = ([1u8; 128], vec![2u8; 40_000]);
        // The Finished, then the ICReq and a 40 KB write as the host sends them: one send.
        let mut wire = c.take_ciphertext();
        let n = c.seal_vectored(&[IoSlice::new(&icreq), IoSlice::new(&data)], usize::MAX, &mut wire).unwrap();
        assert_eq!(n, icreq.len() + data.len());
        deliver(&mut s, &wire, wire.len()).unwrap();
        assert!(s.is_established());
        assert!(s.has_input_ready());
        assert_eq!(read_all(&mut s).unwrap(), [&icreq[..], &data[..]].concat());
        assert!(!s.has_input_ready());
        // The other way, in odd-sized reads that split records.
        let mut back = Vec::new();
        s.seal_vectored(&[IoSlice::new(&data)], usize::MAX, &mut back).unwrap();
        let mut got = Vec::new();
        for chunk in back.chunks(777) {
            deliver(&mut c, chunk, chunk.len()).unwrap();
            got.extend(read_all(&mut c).unwrap());
        }
        assert_eq!(got, data);
    }
}

#[test]
fn a_tampered_record_fails_the_session_and_tells_the_peer() {
    let (mut c, mut s) = almost_established(TlsHash::Sha256);
    let mut wire = c.take_ciphertext();
    deliver(&mut s, &wire, wire.len()).unwrap();
    wire.clear();
    c.seal_vectored(&[IoSlice::new(b"a command capsule")], usize::MAX, &mut wire).unwrap();
    let last = wire.len() - 1;
    wire[last] ^= 0x80;
    deliver(&mut s, &wire, 3).unwrap();
    let e = s.read_plaintext(&mut [0u8; 64]).unwrap_err();
    assert!(matches!(&e, TlsError::Protocol(m) if m.contains("authentication")), "{e}");
    assert_eq!(s.read_plaintext(&mut [0u8; 64]).unwrap_err(), e, "the failure stays");
    assert_eq!(s.buffered_input(), 0, "a failed session drops its input");
    // The alert it leaves tells the client why.
    let alert = s.take_ciphertext();
    assert!(!alert.is_empty());
    deliver(&mut c, &alert, alert.len()).unwrap();
    let e = c.read_plaintext(&mut [0u8; 64]).unwrap_err();
    assert!(matches!(&e, TlsError::Protocol(m) if m.contains("bad_record_mac")), "{e}");
}

#[test]
fn close_notify_ends_the_stream_after_the_data_before_it() {
    let (mut c, mut s) = almost_established(TlsHash::Sha384);
    let mut wire = c.take_ciphertext();
    c.seal_vectored(&[IoSlice::new(b"last words")], usize::MAX, &mut wire).unwrap();
    wire.extend(c.close());
    assert!(c.seal_vectored(&[IoSlice::new(b"more")], usize::MAX, &mut Vec::new()).is_err(), "closed");
    deliver(&mut s, &wire, 5).unwrap();
    assert_eq!(read_all(&mut s).unwrap(), b"last words");
    assert!(s.peer_closed());
}
