//! Why a TLS session failed: the one error type of the session, its handshake and its records.

use openssl::error::ErrorStack;

/// Why a session failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// Both sides know the identity but hold different keys (the PSK binder did not verify; on the
    /// client, the server's alert for that).
    #[error("TLS handshake failed: wrong key for PSK identity '{identity}' (the PSK binder did not verify)")]
    WrongKey { identity: String },
    /// Server: the client offered an identity this server has no key for.
    #[error("TLS handshake failed: no key for PSK identity '{identity}'")]
    UnknownIdentity { identity: String },
    /// Server: the client offered no PSK at all (certificate-based TLS, or a bare ClientHello).
    #[error("TLS handshake failed: the client offered no PSK identity ({detail})")]
    NoPsk { detail: String },
    /// Client: the server refused the handshake for the identity we offered.
    #[error("TLS handshake failed: the server refused PSK identity '{identity}' ({detail})")]
    Refused { identity: String, detail: String },
    /// The peer wants something this profile does not allow (TLS 1.2, another suite, a certificate).
    #[error("TLS handshake failed: {0}")]
    Unsupported(String),
    /// Malformed or unexpected records or messages.
    #[error("TLS protocol error: {0}")]
    Protocol(String),
    #[error("TLS session is not established yet")]
    NotEstablished,
    #[error("TLS session is closed")]
    Closed,
    #[error("TLS setup failed: {0}")]
    Setup(String),
}

impl From<ErrorStack> for TlsError {
    fn from(e: ErrorStack) -> Self {
        TlsError::Setup(e.to_string())
    }
}

impl From<crate::record::CipherError> for TlsError {
    fn from(e: crate::record::CipherError) -> Self {
        TlsError::Setup(e.to_string())
    }
}
