//! nvmf-e2e's tests, one binary (linking one test binary per file cost more CPU than running
//! them): each former tests/*.rs is a module here.

mod abuse;
mod durability;
mod loopback;
mod reconnect;
mod tempdir;
