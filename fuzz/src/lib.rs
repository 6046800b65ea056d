//! Fuzz drivers: each `run(input)` turns fuzz input into traffic or text for one parser or
//! state machine and checks what must hold whatever the input. The libFuzzer entry points in
//! `fuzz_targets/` call them; the regression tests in `crates/*/tests/it/fuzz_regressions.rs`
//! include the same modules (`#[path]`) to replay `fuzz/corpus/` and `fuzz/regressions/`
//! under plain `cargo test`, so no driver logic is duplicated.

pub mod replay;
pub mod script;

pub mod config_nvmetcli;
pub mod config_toml;
pub mod frame;
pub mod host_pdus;
pub mod target_conn;
pub mod target_fixture;
pub mod target_rdma;
