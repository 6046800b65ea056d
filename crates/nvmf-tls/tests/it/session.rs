//! Our client and our server over in-memory buffers; foreign OpenSSL peers (TLS 1.2, certificate
//! based, no PSK) driven over the same buffers.

use nvmf_tls::session::{ClientConfig, ServerConfig, TlsSession};
use nvmf_tls::{ConfiguredPsk, Derivation, IdentityVersion, PskTransform, TlsError, TlsHash, TlsPsk};
use openssl::ssl::{Ssl, SslContextBuilder, SslMethod, SslStream, SslVersion};

const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
const SUB: &str = "nqn.2024-01.io.nvmflab:sub0";

/// Moves ciphertext both ways until neither side has anything to send; returns the plaintext each
/// side received. Stops at the first error (the other side still gets the alert).
fn pump(c: &mut TlsSession, s: &mut TlsSession) -> (Result<Vec<u8>, TlsError>, Result<Vec<u8>, TlsError>) {
    let (mut to_c, mut to_s) = (Vec::new(), Vec::new());
    let (mut rc, mut rs): (Result<(), TlsError>, Result<(), TlsError>) = (Ok(()), Ok(()));
    for _ in 0..32 {
        let out_c = c.take_ciphertext();
        if !out_c.is_empty() {
            match s.feed(&out_c) {
                Ok(p) => to_s.extend(p),
                Err(e) => rs = Err(e),
            }
        }
        let out_s = s.take_ciphertext();
        if !out_s.is_empty() {
            match c.feed(&out_s) {
                Ok(p) => to_c.extend(p),
                Err(e) => rc = Err(e),
            }
        }
        if out_c.is_empty() && out_s.is_empty() {
            break;
        }
    }
    (rc.map(|_| to_c), rs.map(|_| to_s))
}

fn configured(t: PskTransform) -> ConfiguredPsk {
    ConfiguredPsk::generate(t, 32).unwrap()
}

fn server_for(key: &ConfiguredPsk) -> ServerConfig {
    ServerConfig::for_subsystem(SUB, vec![(HOST.to_string(), key.clone())], false).unwrap()
}

fn client_for(key: &ConfiguredPsk, version: IdentityVersion) -> ClientConfig {
    let psk = TlsPsk::derive(key, HOST, SUB, Derivation { version, compat: false }).unwrap();
    ClientConfig::new(psk).unwrap()
}

#[test]
fn handshake_and_data_both_suites_both_identity_versions() {
    for (t, hash) in [(PskTransform::Sha256, TlsHash::Sha256), (PskTransform::Sha384, TlsHash::Sha384)] {
        for version in [IdentityVersion::V0, IdentityVersion::V1] {
            let key = configured(t);
            let server_cfg = server_for(&key);
            let client_cfg = client_for(&key, version);
            let mut c = TlsSession::client(&client_cfg).unwrap();
            let mut s = TlsSession::server(&server_cfg).unwrap();
            assert!(c.send(b"early").is_err(), "no data before the handshake");
            let (rc, rs) = pump(&mut c, &mut s);
            rc.unwrap();
            rs.unwrap();
            assert!(c.is_established() && s.is_established(), "{t:?} {version:?}");
            let ci = c.info().unwrap();
            let si = s.info().unwrap();
            assert_eq!(ci.suite, hash.suite());
            assert_eq!(si.suite, hash.suite());
            assert_eq!(si.identity, client_cfg.psk().identity());
            assert_eq!(ci.hash, hash);

            // Data both ways, large enough for many records, delivered in odd-sized pieces.
            let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + 3) as u8).collect();
            let wire = c.send(&big).unwrap();
            let mut got = Vec::new();
            for piece in wire.chunks(1237) {
                got.extend(s.feed(piece).unwrap());
                assert!(s.buffered_input() <= 16 * 1024 + 256 + 5);
            }
            assert_eq!(got, big);
            let wire = s.send(b"pong").unwrap();
            assert_eq!(c.feed(&wire).unwrap(), b"pong");

            let bye = c.close();
            assert!(!bye.is_empty());
            assert!(s.feed(&bye).unwrap().is_empty());
            assert!(s.peer_closed());
        }
    }
}

#[test]
fn handshake_survives_byte_by_byte_delivery() {
    let key = configured(PskTransform::Sha384);
    let mut c = TlsSession::client(&client_for(&key, IdentityVersion::V1)).unwrap();
    let mut s = TlsSession::server(&server_for(&key)).unwrap();
    for _ in 0..8 {
        for b in c.take_ciphertext() {
            assert!(s.feed(&[b]).unwrap().is_empty());
        }
        for b in s.take_ciphertext() {
            assert!(c.feed(&[b]).unwrap().is_empty());
        }
    }
    assert!(c.is_established() && s.is_established());
}

#[test]
fn fixed_key_table_and_compat_keys() {
    let key = configured(PskTransform::Sha256);
    let psk = TlsPsk::derive(&key, HOST, SUB, Derivation { version: IdentityVersion::V0, compat: true }).unwrap();
    let server = ServerConfig::with_keys(vec![psk.clone()]).unwrap();
    let mut c = TlsSession::client(&ClientConfig::new(psk).unwrap()).unwrap();
    let mut s = TlsSession::server(&server).unwrap();
    let (rc, rs) = pump(&mut c, &mut s);
    rc.unwrap();
    rs.unwrap();
    assert!(s.is_established());
}

/// libnvme before 1.16 (Debian trixie's nvme-cli 2.13) derives identities and TLS PSKs the compat
/// way without being asked: the server tells a version 1 identity's derivation by its digest and
/// a version 0 one's by the ClientHello's binder, and accepts both, with either as its default.
#[test]
fn identities_of_either_derivation_are_accepted() {
    for server_compat in [false, true] {
        for client_compat in [false, true] {
            for version in [IdentityVersion::V0, IdentityVersion::V1] {
                let key = configured(PskTransform::Sha256);
                let server = ServerConfig::for_subsystem(SUB, vec![(HOST.to_string(), key.clone())], server_compat).unwrap();
                let psk = TlsPsk::derive(&key, HOST, SUB, Derivation { version, compat: client_compat }).unwrap();
                let identity = psk.identity().to_string();
                let mut c = TlsSession::client(&ClientConfig::new(psk).unwrap()).unwrap();
                let mut s = TlsSession::server(&server).unwrap();
                let (rc, rs) = pump(&mut c, &mut s);
                let case = format!("server compat {server_compat}, client compat {client_compat}, {version:?}");
                rc.unwrap_or_else(|e| panic!("{case}: {e}"));
                rs.unwrap_or_else(|e| panic!("{case}: {e}"));
                assert!(s.is_established(), "{case}");
                assert_eq!(s.info().unwrap().identity, identity, "{case}");
                // Data both ways: both sides use the same key.
                let wire = c.send(b"ping").unwrap();
                assert_eq!(s.feed(&wire).unwrap(), b"ping", "{case}");
            }
        }
    }
}

#[test]
fn a_wrong_key_fails_under_either_derivation() {
    for compat in [false, true] {
        for version in [IdentityVersion::V0, IdentityVersion::V1] {
            let right = configured(PskTransform::Sha256);
            let wrong = configured(PskTransform::Sha256);
            let psk = TlsPsk::derive(&wrong, HOST, SUB, Derivation { version, compat }).unwrap();
            let identity = psk.identity().to_string();
            let mut c = TlsSession::client(&ClientConfig::new(psk).unwrap()).unwrap();
            let mut s = TlsSession::server(&server_for(&right)).unwrap();
            let (_, rs) = pump(&mut c, &mut s);
            assert_eq!(rs.unwrap_err(), TlsError::WrongKey { identity }, "compat {compat}, {version:?}");
        }
    }
}

#[test]
fn wrong_key_fails_and_names_the_identity() {
    for version in [IdentityVersion::V0, IdentityVersion::V1] {
        let right = configured(PskTransform::Sha256);
        let wrong = configured(PskTransform::Sha256);
        let client_cfg = client_for(&wrong, version);
        let identity = client_cfg.psk().identity().to_string();
        let mut c = TlsSession::client(&client_cfg).unwrap();
        let mut s = TlsSession::server(&server_for(&right)).unwrap();
        let (rc, rs) = pump(&mut c, &mut s);
        let se = rs.unwrap_err();
        assert_eq!(se, TlsError::WrongKey { identity: identity.clone() }, "{version:?}");
        assert!(se.to_string().contains(&identity));
        let ce = rc.unwrap_err();
        assert_eq!(ce, TlsError::WrongKey { identity: identity.clone() }, "{version:?}: {ce}");
        // Sticky: the session stays failed.
        assert_eq!(s.feed(b"more").unwrap_err(), se);
        assert!(s.send(b"x").is_err());
        assert!(!s.is_established() && s.error().is_some());
        assert_eq!(s.offered_identity().as_deref(), Some(identity.as_str()));
    }
}

#[test]
fn unknown_identity_and_other_subsystem_are_refused() {
    let key = configured(PskTransform::Sha256);
    let other_sub = TlsPsk::derive(&key, HOST, "nqn.2024-01.io.nvmflab:other", Derivation::default()).unwrap();
    let other_host = TlsPsk::derive(&key, "nqn.2024-01.io.nvmflab:intruder", SUB, Derivation::default()).unwrap();
    let raw = TlsPsk::from_raw("client1", TlsHash::Sha256, &[7u8; 32]).unwrap();
    for psk in [other_sub, other_host, raw] {
        let identity = psk.identity().to_string();
        let mut c = TlsSession::client(&ClientConfig::new(psk).unwrap()).unwrap();
        let mut s = TlsSession::server(&server_for(&key)).unwrap();
        let (rc, rs) = pump(&mut c, &mut s);
        assert_eq!(rs.unwrap_err(), TlsError::UnknownIdentity { identity: identity.clone() });
        match rc.unwrap_err() {
            TlsError::Refused { identity: i, .. } => assert_eq!(i, identity),
            e => panic!("client got {e:?}"),
        }
    }
}

#[test]
fn sha384_key_against_sha256_only_expectation_is_refused() {
    // Same host, key with the other hash: the identity's hh differs, so the server has no key for it.
    let server_key = configured(PskTransform::Sha256);
    let client_key = configured(PskTransform::Sha384);
    let mut c = TlsSession::client(&client_for(&client_key, IdentityVersion::V1)).unwrap();
    let mut s = TlsSession::server(&server_for(&server_key)).unwrap();
    let (_, rs) = pump(&mut c, &mut s);
    assert!(matches!(rs.unwrap_err(), TlsError::UnknownIdentity { .. }));
}

/// Drives a plain OpenSSL client against our server over in-memory pipes; returns our server's error.
fn foreign_client_against_ours(mut builder: SslContextBuilder) -> TlsError {
    let key = configured(PskTransform::Sha256);
    let psk = TlsPsk::derive(&key, HOST, SUB, Derivation::default()).unwrap();
    let psk_key = psk.key().to_vec();
    let id = psk.identity().to_string();
    builder.set_psk_client_callback(move |_ssl, _hint, identity, out| {
        let n = id.len();
        identity[..n].copy_from_slice(id.as_bytes());
        identity[n] = 0;
        out[..psk_key.len()].copy_from_slice(&psk_key);
        Ok(psk_key.len())
    });
    let ctx = builder.build();
    let mut ssl = Ssl::new(&ctx).unwrap();
    ssl.set_connect_state();
    let mut foreign = SslStream::new(ssl, Pipe::default()).unwrap();
    let _ = foreign.do_handshake();
    let mut s = TlsSession::server(&server_for(&key)).unwrap();
    let hello = std::mem::take(&mut foreign.get_mut().out);
    assert!(!hello.is_empty());
    let err = s.feed(&hello).unwrap_err();
    assert!(!s.take_ciphertext().is_empty(), "an alert goes back to the client");
    err
}

#[derive(Default)]
struct Pipe {
    inp: std::collections::VecDeque<u8>,
    out: Vec<u8>,
}

impl std::io::Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.inp.is_empty() {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(self.inp.len());
        for (d, s) in buf.iter_mut().zip(self.inp.drain(..n)) {
            *d = s;
        }
        Ok(n)
    }
}

impl std::io::Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn tls12_client_is_refused() {
    let mut b = SslContextBuilder::new(SslMethod::tls()).unwrap();
    b.set_max_proto_version(Some(SslVersion::TLS1_2)).unwrap();
    b.set_cipher_list("PSK-AES128-GCM-SHA256:ECDHE-PSK-AES128-CBC-SHA256").unwrap();
    let e = foreign_client_against_ours(b);
    assert!(matches!(e, TlsError::Unsupported(_)), "{e:?}");
}

#[test]
fn client_without_psk_is_refused() {
    // A TLS 1.3 client expecting a certificate, offering no PSK.
    let mut b = SslContextBuilder::new(SslMethod::tls()).unwrap();
    b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    let ctx = b.build();
    let mut ssl = Ssl::new(&ctx).unwrap();
    ssl.set_connect_state();
    let mut foreign = SslStream::new(ssl, Pipe::default()).unwrap();
    let _ = foreign.do_handshake();
    let key = configured(PskTransform::Sha256);
    let mut s = TlsSession::server(&server_for(&key)).unwrap();
    let e = s.feed(&std::mem::take(&mut foreign.get_mut().out)).unwrap_err();
    assert!(matches!(e, TlsError::NoPsk { .. }), "{e:?}");
}

#[test]
fn certificate_server_is_refused_by_our_client() {
    use openssl::asn1::Asn1Time;
    use openssl::ec::{EcGroup, EcKey};
    use openssl::hash::MessageDigest;
    use openssl::nid::Nid;
    use openssl::pkey::PKey;
    use openssl::x509::{X509NameBuilder, X509};

    let ec = EcKey::generate(&EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap()).unwrap();
    let pkey = PKey::from_ec_key(ec).unwrap();
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", "not-a-psk-server").unwrap();
    let name = name.build();
    let mut cert = X509::builder().unwrap();
    cert.set_version(2).unwrap();
    cert.set_subject_name(&name).unwrap();
    cert.set_issuer_name(&name).unwrap();
    cert.set_pubkey(&pkey).unwrap();
    cert.set_not_before(&Asn1Time::days_from_now(0).unwrap()).unwrap();
    cert.set_not_after(&Asn1Time::days_from_now(1).unwrap()).unwrap();
    cert.sign(&pkey, MessageDigest::sha256()).unwrap();
    let cert = cert.build();

    let mut b = SslContextBuilder::new(SslMethod::tls()).unwrap();
    b.set_certificate(&cert).unwrap();
    b.set_private_key(&pkey).unwrap();
    let ctx = b.build();
    let mut ssl = Ssl::new(&ctx).unwrap();
    ssl.set_accept_state();
    let mut foreign = SslStream::new(ssl, Pipe::default()).unwrap();

    let key = configured(PskTransform::Sha256);
    let mut c = TlsSession::client(&client_for(&key, IdentityVersion::V1)).unwrap();
    let mut result = Ok(Vec::new());
    for _ in 0..8 {
        foreign.get_mut().inp.extend(c.take_ciphertext());
        let _ = foreign.do_handshake();
        let back = std::mem::take(&mut foreign.get_mut().out);
        if back.is_empty() {
            break;
        }
        result = c.feed(&back);
        if result.is_err() {
            break;
        }
    }
    let e = result.unwrap_err();
    assert!(matches!(e, TlsError::Unsupported(_)), "{e:?}");
    assert!(!c.is_established());
}

#[test]
fn garbage_and_plain_nvme_icreq_are_protocol_errors() {
    let key = configured(PskTransform::Sha256);
    // A plain NVMe/TCP ICReq PDU header (type 0, hlen 128) sent to a TLS port.
    let mut icreq = vec![0u8; 128];
    icreq[2] = 128;
    icreq[4] = 128;
    for input in [icreq, b"GET / HTTP/1.1\r\n\r\n".to_vec(), vec![0x16, 0x03, 0x03, 0xff, 0xff]] {
        let mut s = TlsSession::server(&server_for(&key)).unwrap();
        let e = s.feed(&input);
        assert!(e.is_err() || s.buffered_input() > 0, "{e:?}");
        if let Err(e) = e {
            assert!(matches!(e, TlsError::Protocol(_) | TlsError::Unsupported(_) | TlsError::NoPsk { .. }), "{e:?}");
        }
    }
}

/// The extensions of the first handshake message in `wire` (one TLS record): (type, body) pairs,
/// and the cipher suites (ClientHello) or the chosen suite (ServerHello).
type Extensions = Vec<(u16, Vec<u8>)>;

fn hello_extensions(wire: &[u8]) -> (u8, Vec<[u8; 2]>, Extensions) {
    let u16at = |b: &[u8], i: usize| u16::from_be_bytes([b[i], b[i + 1]]) as usize;
    assert_eq!(wire[0], 0x16, "handshake record");
    let msg = &wire[5..5 + u16at(wire, 3)];
    let kind = msg[0];
    let mut i = 4 + 2 + 32;
    i += 1 + msg[i] as usize; // legacy_session_id
    let suites: Vec<[u8; 2]> = if kind == 1 {
        let n = u16at(msg, i);
        let s = msg[i + 2..i + 2 + n].chunks(2).map(|c| [c[0], c[1]]).collect();
        i += 2 + n;
        i += 1 + msg[i] as usize; // compression methods
        s
    } else {
        let s = vec![[msg[i], msg[i + 1]]];
        i += 3; // suite, compression
        s
    };
    let end = i + 2 + u16at(msg, i);
    i += 2;
    let mut exts = Vec::new();
    while i < end {
        let (t, n) = (u16at(msg, i) as u16, u16at(msg, i + 2));
        exts.push((t, msg[i + 4..i + 4 + n].to_vec()));
        i += 4 + n;
    }
    (kind, suites, exts)
}

#[test]
fn wire_profile_psk_dhe_ke_one_suite_no_early_data_no_tickets() {
    for (t, hash) in [(PskTransform::Sha256, TlsHash::Sha256), (PskTransform::Sha384, TlsHash::Sha384)] {
        let key = configured(t);
        let mut c = TlsSession::client(&client_for(&key, IdentityVersion::V1)).unwrap();
        let mut s = TlsSession::server(&server_for(&key)).unwrap();
        let hello = c.take_ciphertext();
        let (kind, suites, exts) = hello_extensions(&hello);
        assert_eq!(kind, 1);
        assert_eq!(suites.iter().filter(|s| s[0] == 0x13).copied().collect::<Vec<_>>(), vec![hash.suite_code()]);
        let ext = |id: u16| exts.iter().find(|(t, _)| *t == id).map(|(_, b)| b.clone());
        // psk_key_exchange_modes (45): exactly [psk_dhe_ke (1)].
        assert_eq!(ext(45), Some(vec![1, 1]));
        assert!(ext(51).is_some(), "key_share offered");
        assert!(ext(42).is_none(), "no early_data");
        assert_eq!(exts.last().unwrap().0, 41, "pre_shared_key last");
        // supported_versions (43): TLS 1.3 only.
        assert_eq!(ext(43), Some(vec![2, 3, 4]));

        s.feed(&hello).unwrap();
        let flight = s.take_ciphertext();
        let (kind, suite, sexts) = hello_extensions(&flight);
        assert_eq!(kind, 2);
        assert_eq!(suite, vec![hash.suite_code()]);
        let sext = |id: u16| sexts.iter().find(|(t, _)| *t == id).map(|(_, b)| b.clone());
        assert_eq!(sext(41), Some(vec![0, 0]), "server selected PSK 0");
        assert!(sext(51).is_some(), "server key_share: (EC)DHE with the PSK");
        assert_eq!(sext(43), Some(vec![3, 4]));
        c.feed(&flight).unwrap();
        s.feed(&c.take_ciphertext()).unwrap();
        assert!(s.is_established());
        // No NewSessionTicket follows the handshake.
        assert!(s.take_ciphertext().is_empty());
    }
}

#[test]
fn psk_ke_only_client_is_refused() {
    // Our ClientHello with its psk_key_exchange_modes turned into [psk_ke (0)]: OpenSSL then
    // ignores the PSK (without SSL_OP_ALLOW_NO_DHE_KEX) and, with no certificate, fails; the error
    // says why.
    let key = configured(PskTransform::Sha256);
    let mut c = TlsSession::client(&client_for(&key, IdentityVersion::V1)).unwrap();
    let mut hello = c.take_ciphertext();
    let pat = [0x00, 0x2d, 0x00, 0x02, 0x01, 0x01];
    let at = hello.windows(6).position(|w| w == pat).expect("psk_key_exchange_modes extension");
    hello[at + 5] = 0x00;
    let mut s = TlsSession::server(&server_for(&key)).unwrap();
    let e = s.feed(&hello).unwrap_err();
    match &e {
        TlsError::Unsupported(m) => assert!(m.contains("psk_dhe_ke"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn forged_digest_with_a_guessable_key_does_not_get_in() {
    // A client that knows a host NQN offers a version 1 identity with a made-up digest and keys
    // it could guess: the server must not accept any of them.
    let key = configured(PskTransform::Sha256);
    let forged = format!("NVMe1R01 {HOST} {SUB} {}=", "A".repeat(43));
    for guess in [[0u8; 32], [0xff; 32], [0x42; 32]] {
        let psk = TlsPsk::from_raw(&forged, TlsHash::Sha256, &guess).unwrap();
        let mut c = TlsSession::client(&ClientConfig::new(psk).unwrap()).unwrap();
        let mut s = TlsSession::server(&server_for(&key)).unwrap();
        let (rc, rs) = pump(&mut c, &mut s);
        assert_eq!(rs.unwrap_err(), TlsError::WrongKey { identity: forged.clone() });
        assert!(rc.is_err() && !s.is_established());
    }
}

#[test]
fn offered_identity_with_control_characters_is_escaped_in_errors() {
    let key = configured(PskTransform::Sha256);
    let nasty = "NVMe0R01 evil\nFAKE LOG LINE\u{1b}[2J sub";
    let psk = TlsPsk::from_raw(nasty, TlsHash::Sha256, &[1; 32]).unwrap();
    let mut c = TlsSession::client(&ClientConfig::new(psk).unwrap()).unwrap();
    let mut s = TlsSession::server(&server_for(&key)).unwrap();
    let (_, rs) = pump(&mut c, &mut s);
    let e = rs.unwrap_err();
    assert_eq!(e, TlsError::UnknownIdentity { identity: "NVMe0R01 evil\\nFAKE LOG LINE\\u{1b}[2J sub".into() });
    assert!(!e.to_string().chars().any(char::is_control));
}
