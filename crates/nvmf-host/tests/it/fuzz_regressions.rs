//! Replays the host's fuzz corpus and past crash/hang inputs (fuzz/corpus/host_pdus): our
//! host against a scripted hostile target on loopback, through the fuzz driver itself. No
//! fuzzing toolchain needed; docs/fuzzing.md.

use crate::{host_pdus, replay};
use std::path::Path;
use std::time::Duration;

#[test]
fn host_corpus_replays_cleanly() {
    let fuzz_dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz"));
    let n = replay::replay(fuzz_dir, "host_pdus", host_pdus::run, Duration::from_secs(30));
    assert!(n >= 4, "only {n} host_pdus inputs found under fuzz/: the corpus is missing");
}
