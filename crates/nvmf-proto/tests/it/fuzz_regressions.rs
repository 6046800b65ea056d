//! Replays the PDU framer's fuzz corpus and past crash inputs (fuzz/corpus/frame,
//! fuzz/regressions/frame) through the fuzz driver itself, so `cargo test` keeps every input
//! the fuzzer found interesting passing without the fuzzing toolchain. docs/fuzzing.md.

use crate::{frame, replay};
use std::path::Path;
use std::time::Duration;

fn fuzz_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz"))
}

#[test]
fn frame_corpus_replays_cleanly() {
    let n = replay::replay(fuzz_dir(), "frame", frame::run, Duration::from_secs(20));
    assert!(n >= 4, "only {n} frame inputs found under fuzz/: the corpus is missing");
}
