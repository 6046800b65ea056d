//! Replays the `tls_server` fuzz corpus and past findings (fuzz/corpus/tls_server,
//! fuzz/regressions/tls_server) through the fuzz driver itself (`hostile::by_first_byte`), so
//! `cargo test` keeps every input the fuzzer found interesting passing without the fuzzing
//! toolchain. docs/fuzzing.md, docs/tls.md.

use crate::replay;
use std::path::Path;
use std::time::Duration;

#[test]
fn tls_server_corpus_replays_cleanly() {
    let fuzz_dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz"));
    let n = replay::replay(fuzz_dir, "tls_server", nvmf_tls::hostile::by_first_byte, Duration::from_secs(20));
    assert!(n >= 10, "only {n} tls_server inputs found under fuzz/: the corpus is missing");
}
