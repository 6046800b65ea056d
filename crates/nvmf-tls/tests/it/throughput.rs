//! A rough measure of the userspace record path (not a benchmark: no pinning, shared machine).
//! `cargo test --release -p nvmf-tls --test it throughput:: -- --ignored --nocapture`

use std::time::Instant;

use nvmf_tls::session::{ClientConfig, ServerConfig, TlsSession};
use nvmf_tls::{ConfiguredPsk, Derivation, PskTransform, TlsPsk};

fn pair(t: PskTransform) -> (TlsSession, TlsSession) {
    let key = ConfiguredPsk::generate(t, 32).unwrap();
    let psk = TlsPsk::derive(&key, "nqn.h", "nqn.s", Derivation::default()).unwrap();
    let sc = ServerConfig::with_keys(vec![psk.clone()]).unwrap();
    let cc = ClientConfig::new(psk).unwrap();
    let mut c = TlsSession::client(&cc).unwrap();
    let mut s = TlsSession::server(&sc).unwrap();
    for _ in 0..3 {
        s.feed(&c.take_ciphertext()).unwrap();
        c.feed(&s.take_ciphertext()).unwrap();
    }
    assert!(c.is_established() && s.is_established());
    (c, s)
}

#[test]
#[ignore = "timing report, run by hand"]
fn userspace_record_throughput() {
    const TOTAL: usize = 1 << 30;
    for t in [PskTransform::Sha256, PskTransform::Sha384] {
        for size in [4096usize, 131072] {
            let msg = vec![0xabu8; size];
            let (mut plain, mut wire) = (Vec::new(), Vec::new());

            let (mut c, mut s) = pair(t);
            let start = Instant::now();
            let mut got = 0;
            while got < TOTAL {
                wire.clear();
                c.send_into(&msg, &mut wire).unwrap();
                plain.clear();
                s.feed_into(&wire, &mut plain).unwrap();
                got += plain.len();
            }
            let both = start.elapsed().as_secs_f64();

            let (mut c, _) = pair(t);
            let start = Instant::now();
            for _ in 0..TOTAL / size {
                wire.clear();
                c.send_into(&msg, &mut wire).unwrap();
            }
            let enc = start.elapsed().as_secs_f64();
            println!(
                "{} {size:>6} B: send+feed {:.0} MB/s ({:.2} us per message), send alone {:.0} MB/s",
                s.info().unwrap().suite,
                TOTAL as f64 / both / 1e6,
                both * 1e6 / (TOTAL / size) as f64,
                TOTAL as f64 / enc / 1e6,
            );
        }
    }
}
