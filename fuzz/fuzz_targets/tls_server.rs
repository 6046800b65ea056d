#![no_main]
//! libFuzzer entry point for the TLS-wrapped receive path of a server session (nvmf-tls):
//! `nvmf_tls::hostile::by_first_byte`, shared with the corpus replay in
//! crates/nvmf-tls/tests/it/fuzz_regressions.rs. The first byte picks a driver of
//! `nvmf_tls::hostile` (shared with its property tests, which say what each checks: no panic, at
//! most one partial record buffered, a failure stays failed and drops its input, no control
//! characters from the peer in errors, never more plaintext than ciphertext), the rest is its
//! input:
//!
//! 0. raw bytes where a ClientHello belongs (record layer, handshake parser, the ClientHello
//!    capture and PSK identity parsing);
//! 1. a genuine ClientHello (version 1 identity) with bytes replaced;
//! 2. the same with a version 0 identity derived the other way than the server's default, so the
//!    server picks the key by the binder (nvmf_tls::binder parses the mutated hello);
//! 3. a completed handshake, then hostile records (decryption, alerts, close_notify).

libfuzzer_sys::fuzz_target!(|data: &[u8]| nvmf_tls::hostile::by_first_byte(data));
