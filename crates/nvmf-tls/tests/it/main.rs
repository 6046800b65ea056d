//! nvmf-tls's integration tests, one binary (linking one test binary per file cost more CPU
//! than running them): each former tests/*.rs is a module here.

mod fuzz_regressions;
mod hostile;
mod in_place;
mod kernel_keys;
mod key_update;
mod openssl_cli;
mod session;
mod throughput;

// The fuzz corpus replay, shared with fuzz/ (its drivers sit at the crate root there too).
#[path = "../../../../fuzz/src/replay.rs"]
mod replay;
