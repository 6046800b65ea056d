//! Hostile bytes to the server side of a session (see nvmf_tls::hostile for what is checked):
//! random input where a ClientHello belongs, mutated genuine ClientHellos, random records after a
//! completed handshake, and a large flood.

use nvmf_tls::hostile;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_instead_of_a_client_hello(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
        hostile::server_fresh(&data);
    }

    #[test]
    fn random_bytes_behind_a_tls_record_header(
        ty in prop_oneof![Just(0x16u8), Just(0x17), Just(0x15), Just(0x14), any::<u8>()],
        len in any::<u16>(),
        body in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        let mut data = vec![0u8, ty, 3, 3];
        data.extend_from_slice(&len.to_be_bytes());
        data.extend_from_slice(&body);
        hostile::server_fresh(&data);
    }

    #[test]
    fn mutated_client_hello(edits in proptest::collection::vec(any::<u8>(), 0..60)) {
        hostile::server_mutated_hello(&edits);
    }

    #[test]
    fn mutated_client_hello_with_a_version_0_identity(edits in proptest::collection::vec(any::<u8>(), 0..60)) {
        hostile::server_mutated_hello_v0(&edits);
    }

    #[test]
    fn random_records_after_the_handshake(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
        hostile::server_after_handshake(&data);
    }
}

#[test]
fn flood_is_not_buffered() {
    // 4 MiB of record headers announcing maximal records, in 64 KiB pieces: the session fails on
    // the first bad record and holds nothing afterwards.
    let mut data = vec![0x3f];
    while data.len() < 4 << 20 {
        data.extend_from_slice(&[0x17, 0x03, 0x03, 0x41, 0x00]);
        data.extend(std::iter::repeat_n(0xee, 0x4100));
    }
    hostile::server_fresh(&data);
    hostile::server_after_handshake(&data);
}

/// 10^6 random inputs through the three drivers (a seeded xorshift, not coverage-guided: that is
/// the libFuzzer target's job). Run by hand:
/// `cargo test --release -p nvmf-tls --test it hostile:: -- --ignored --nocapture`
#[test]
#[ignore = "long run, by hand"]
fn a_million_random_inputs() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let start = std::time::Instant::now();
    let mut buf = Vec::with_capacity(4096);
    for i in 0..1_000_000u32 {
        buf.clear();
        let len = (next() % 2048) as usize;
        buf.extend((0..len).map(|_| next() as u8));
        if i % 4 == 1 && buf.len() >= 6 {
            // Make it look like a TLS record so that it gets past the first byte.
            buf[1..4].copy_from_slice(&[[0x16, 0x17, 0x15, 0x14][(next() % 4) as usize], 3, 3]);
        }
        match i % 3 {
            0 => hostile::server_fresh(&buf),
            1 => hostile::server_mutated_hello(&buf[..buf.len().min(60)]),
            _ => hostile::server_after_handshake(&buf),
        }
    }
    println!("10^6 inputs in {:.0} s", start.elapsed().as_secs_f64());
}
