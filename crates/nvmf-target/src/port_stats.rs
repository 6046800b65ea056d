//! A listening port's connection counters (TLS and plain, kTLS, NAPI ids). Their own module so
//! that core.rs (which holds them in each `Port`) and wire.rs (which counts into them) do not
//! import each other.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;

/// TLS counters of one port and its record layer, served by /stats.
#[derive(Debug, Default)]
pub struct PortTlsStats {
    /// The kernel makes this port's TLS records (kTLS); false: userspace.
    pub kernel_records: AtomicBool,
    /// TLS connections whose records the kernel took.
    pub ktls_connections: AtomicU64,
    /// TLS connections left with userspace records because their socket refused the TLS ULP
    /// (`--ktls auto` only).
    pub ktls_fallbacks: AtomicU64,
    /// Plaintext bytes of userspace records received and opened straight in a command buffer
    /// (a large payload's, `wire/landing.rs`) instead of the session's receive buffer.
    pub landed_bytes: AtomicU64,
    /// Connections that finished the TLS handshake.
    pub tls_connections: AtomicU64,
    /// Connections that started in plain NVMe/TCP (on a `none` or `allowed` port).
    pub plain_connections: AtomicU64,
    /// TLS handshakes that failed (wrong key, unknown identity, protocol errors).
    pub handshake_failures: AtomicU64,
    /// Plain connections refused by a `required` port.
    pub plain_refused: AtomicU64,
    /// Connections closed because Connect named another host or subsystem than the TLS identity.
    pub identity_mismatches: AtomicU64,
    /// Connections per NAPI id of their socket (SO_INCOMING_NAPI_ID once Connect arrived: the
    /// device queue busy polling would poll; 0 where there is none, as on loopback).
    pub napi_ids: Mutex<BTreeMap<u32, u64>>,
}
