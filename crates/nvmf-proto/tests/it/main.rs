//! nvmf-proto's integration tests, one binary (linking one test binary per file cost more CPU
//! than running them): each former tests/*.rs is a module here.

mod fuzz_regressions;
mod properties;

// The fuzz drivers refer to each other through `crate::`, so they sit at the crate root.
#[allow(dead_code)]
#[path = "../../../../fuzz/src/script.rs"]
mod script;
#[path = "../../../../fuzz/src/frame.rs"]
mod frame;
#[path = "../../../../fuzz/src/replay.rs"]
mod replay;
