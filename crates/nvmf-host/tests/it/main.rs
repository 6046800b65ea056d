//! nvmf-host's integration tests, one binary (linking one test binary per file cost more CPU
//! than running them): each former tests/*.rs is a module here, `common` shared by them.

mod against_target;
mod auth;
mod common;
mod control;
mod fake_target;
mod features;
mod fuzz_regressions;
mod intervals;
mod ktls;
mod perf_output;
mod ramp_counts;
mod reconnect;
mod tls;
mod tls_keyring;

// The fuzz drivers refer to each other through `crate::`, so they sit at the crate root.
#[allow(dead_code)]
#[path = "../../../../fuzz/src/script.rs"]
mod script;
#[path = "../../../../fuzz/src/host_pdus.rs"]
mod host_pdus;
#[path = "../../../../fuzz/src/replay.rs"]
mod replay;
