//! nvmf-target's integration tests, one binary (linking one test binary per file cost more CPU
//! than running them): each former tests/*.rs is a module here, `common` shared by them.

mod auth_gate;
mod buffer_alignment;
mod cli_errors;
mod command;
mod common;
mod connection;
mod control;
mod durability_commands;
mod fuzz_regressions;
mod ktls_choice;
mod limits;
mod loopback;
mod namespace_events;
mod payload_landing;
mod qid_max;
mod socket;

// The fuzz drivers refer to each other through `crate::`, so they sit at the crate root.
#[allow(dead_code)]
#[path = "../../../../fuzz/src/script.rs"]
mod script;
#[path = "../../../../fuzz/src/target_conn.rs"]
mod target_conn;
#[path = "../../../../fuzz/src/target_fixture.rs"]
mod target_fixture;
#[path = "../../../../fuzz/src/target_rdma.rs"]
mod target_rdma;
#[path = "../../../../fuzz/src/config_toml.rs"]
mod config_toml;
#[path = "../../../../fuzz/src/config_nvmetcli.rs"]
mod config_nvmetcli;
#[path = "../../../../fuzz/src/replay.rs"]
mod replay;
