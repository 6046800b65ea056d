//! Replays the target's fuzz corpora and past crash/hang inputs through the fuzz drivers:
//! the sans-I/O connection fed a hostile host's bytes (fuzz/corpus/target_conn), the sans-I/O
//! RDMA queue fed hostile capsules and work completions (fuzz/corpus/target_rdma), and the TOML
//! and nvmetcli config parsers. No fuzzing toolchain needed; docs/fuzzing.md.

use crate::{config_nvmetcli, config_toml, replay, target_conn, target_rdma};
use std::path::Path;
use std::time::Duration;

fn fuzz_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz"))
}

#[test]
fn connection_corpus_replays_cleanly() {
    let n = replay::replay(fuzz_dir(), "target_conn", target_conn::run, Duration::from_secs(30));
    assert!(n >= 5, "only {n} target_conn inputs found under fuzz/: the corpus is missing");
}

#[test]
fn rdma_queue_corpus_replays_cleanly() {
    let n = replay::replay(fuzz_dir(), "target_rdma", target_rdma::run, Duration::from_secs(30));
    assert!(n >= 4, "only {n} target_rdma inputs found under fuzz/: the corpus is missing");
}

#[test]
fn toml_config_corpus_replays_cleanly() {
    let n = replay::replay(fuzz_dir(), "config_toml", config_toml::run, Duration::from_secs(20));
    assert!(n >= 2, "only {n} config_toml inputs found under fuzz/");
}

#[test]
fn nvmetcli_config_corpus_replays_cleanly() {
    let n = replay::replay(fuzz_dir(), "config_nvmetcli", config_nvmetcli::run, Duration::from_secs(20));
    assert!(n >= 2, "only {n} config_nvmetcli inputs found under fuzz/");
}
