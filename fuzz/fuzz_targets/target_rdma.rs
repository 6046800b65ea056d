#![no_main]
//! libFuzzer entry point; the driver (and its checks) is nvmflab_fuzz::target_rdma, shared with the
//! corpus-replay regression tests.

libfuzzer_sys::fuzz_target!(|data: &[u8]| nvmflab_fuzz::target_rdma::run(data));
