//! OpenSSL's handshake failures turned into [`TlsError`]s the caller can act on.

use super::Role;
use crate::error::TlsError;

fn reasons(e: &openssl::ssl::Error) -> String {
    match e.ssl_error() {
        Some(stack) => {
            let r: Vec<String> =
                stack.errors().iter().map(|x| x.reason().unwrap_or("unknown reason").to_string()).collect();
            if r.is_empty() {
                e.to_string()
            } else {
                r.join("; ")
            }
        }
        None => e.to_string(),
    }
}

/// What the callbacks saw, for classifying a failure.
pub(super) struct Snapshot {
    pub(super) offered: Option<String>,
    pub(super) selected: bool,
    pub(super) ours: Option<String>,
    pub(super) no_dhe_mode: bool,
}

/// Turns OpenSSL's failure into what the caller can act on.
pub(super) fn classify(role: Role, e: &openssl::ssl::Error, snap: Snapshot) -> TlsError {
    let Snapshot { offered, selected, ours, no_dhe_mode } = snap;
    let why = reasons(e);
    let has = |s: &str| why.contains(s);
    let version = has("unsupported protocol") || has("version") || has("wrong ssl version");
    match role {
        Role::Server => match offered {
            _ if version => TlsError::Unsupported(format!("the client does not speak TLS 1.3 ({why})")),
            Some(identity) if no_dhe_mode => TlsError::Unsupported(format!(
                "the client offers PSK identity '{identity}' without the psk_dhe_ke mode; PSK without (EC)DHE is refused"
            )),
            Some(identity) if has("binder does not verify") => TlsError::WrongKey { identity },
            Some(identity) if !selected => TlsError::UnknownIdentity { identity },
            Some(_) => TlsError::Protocol(why),
            None if has("record") || has("length") || has("packet") || has("unexpected message") => TlsError::Protocol(why),
            None => TlsError::NoPsk { detail: why },
        },
        Role::Client => {
            let identity = ours.unwrap_or_default();
            // OpenSSL servers answer a binder that does not verify with illegal_parameter, GnuTLS
            // (tlshd) ones with decrypt_error; both mean the server knows the identity but its key
            // differs (an unknown identity gets handshake_failure or unknown_psk_identity).
            if has("decrypt error") || has("illegal parameter") {
                TlsError::WrongKey { identity }
            } else if version {
                TlsError::Unsupported(format!("the server does not speak TLS 1.3 ({why})"))
            } else if has("certificate") {
                TlsError::Unsupported(format!("the server did not take the PSK and offered a certificate ({why})"))
            } else if has("alert") {
                TlsError::Refused { identity, detail: why }
            } else {
                TlsError::Protocol(why)
            }
        }
    }
}
