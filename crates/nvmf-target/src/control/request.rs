//! Control requests as they arrive: one JSON object, `op` naming the change. Hostile input:
//! the text is bounded, unknown ops and fields are refused by name, and every value is checked
//! before anything changes.

use crate::config::{parse_hex16, BackendConfig, NamespaceConfig, MAX_NQN_LEN};
use serde::Deserialize;
use std::path::PathBuf;

/// Longest request accepted (a request with every field is well under 2 KiB).
pub const MAX_REQUEST_LEN: usize = 64 * 1024;
/// Longest backend file path accepted.
const MAX_PATH_LEN: usize = 4096;

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Subsystems, namespaces and hosts as they are now. A struct variant, not a unit one: serde
    /// ignores unknown fields of a unit variant in an internally tagged enum.
    Show {},
    /// Sets the given DH-HMAC-CHAP fields of a host (absent: unchanged; "": cleared). A host
    /// with a key must authenticate; without one it need not.
    SetHost {
        nqn: String,
        dhchap_key: Option<String>,
        dhchap_ctrl_key: Option<String>,
        dhchap_hash: Option<String>,
        dhchap_dhgroup: Option<String>,
    },
    RemoveHost { nqn: String },
    AddSubsystem {
        nqn: String,
        #[serde(default = "yes")]
        allow_any_host: bool,
        #[serde(default)]
        hosts: Vec<String>,
        serial: Option<String>,
        model: Option<String>,
    },
    RemoveSubsystem { nqn: String },
    AllowHost { subsystem: String, host: String },
    DisallowHost { subsystem: String, host: String },
    SetAllowAnyHost { subsystem: String, allow: bool },
    /// nvmet's `attr_qid_max`: I/O queues per controller (1..=128). Ends the subsystem's
    /// controllers so their hosts reconnect and are granted the new count, as nvmet does.
    SetQidMax { subsystem: String, qid_max: u16 },
    AddNamespace(NamespaceSpec),
    RemoveNamespace { subsystem: String, nsid: u32 },
    EnableNamespace { subsystem: String, nsid: u32 },
    DisableNamespace { subsystem: String, nsid: u32 },
}

/// `add_namespace`: the fields of a `[[subsystem.namespace]]` in the TOML config (docs/config).
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NamespaceSpec {
    pub subsystem: String,
    pub nsid: u32,
    /// "file", "null" or "ram".
    pub backend: String,
    pub path: Option<PathBuf>,
    /// Bytes (null and ram).
    pub size: Option<u64>,
    pub block_size: Option<u32>,
    pub uuid: Option<String>,
    pub nguid: Option<String>,
    #[serde(default = "yes")]
    pub enabled: bool,
}

impl NamespaceSpec {
    pub fn into_config(self) -> Result<NamespaceConfig, String> {
        let at = format!("namespace {}", self.nsid);
        let backend = match (self.backend.as_str(), self.size, self.path) {
            ("null", Some(size), None) => BackendConfig::Null { size },
            ("ram", Some(size), None) => BackendConfig::Ram { size },
            ("file", None, Some(path)) => {
                if path.as_os_str().len() > MAX_PATH_LEN {
                    return Err(format!("{at}: path longer than {MAX_PATH_LEN} bytes"));
                }
                BackendConfig::File { path }
            }
            ("null" | "ram", None, _) => return Err(format!("{at}: backend {:?} needs size", self.backend)),
            ("null" | "ram", _, Some(_)) => return Err(format!("{at}: backend {:?} takes no path", self.backend)),
            ("file", _, None) => return Err(format!("{at}: backend \"file\" needs path")),
            ("file", Some(_), _) => return Err(format!("{at}: backend \"file\" takes its size from the file; remove size")),
            (other, _, _) => return Err(format!("{at}: backend {other:?}: expected \"file\", \"null\" or \"ram\"")),
        };
        let id = |v: Option<String>, name: &str| -> Result<Option<[u8; 16]>, String> {
            v.map(|s| parse_id(&s).ok_or_else(|| format!("{at}: {name} {s:?}: expected 32 hex digits, dashes allowed")))
                .transpose()
        };
        Ok(NamespaceConfig {
            nsid: self.nsid,
            backend,
            block_size: self.block_size.unwrap_or(512),
            nguid: id(self.nguid, "nguid")?,
            uuid: id(self.uuid, "uuid")?,
        })
    }
}

/// Parses one request. Errors name what is wrong (serde's message names the field or op).
pub fn parse(text: &str) -> Result<Request, String> {
    if text.len() > MAX_REQUEST_LEN {
        return Err(format!("request longer than {MAX_REQUEST_LEN} bytes"));
    }
    serde_json::from_str(text.trim()).map_err(|e| format!("bad request: {e}"))
}

/// An NQN a request introduces: 1..=223 bytes, printable ASCII without spaces.
pub fn check_nqn(field: &str, nqn: &str) -> Result<(), String> {
    if nqn.is_empty() || nqn.len() > MAX_NQN_LEN {
        return Err(format!("{field}: an NQN is 1 to {MAX_NQN_LEN} bytes, this one {}", nqn.len()));
    }
    if !nqn.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{field} {nqn:?}: an NQN is printable ASCII without spaces"));
    }
    Ok(())
}

/// A UUID or NGUID, with or without dashes (blktests and uuidgen write them with).
fn parse_id(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.trim().chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    parse_hex16(&hex)
}

pub fn format_uuid(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_by_op() {
        assert_eq!(parse(r#"{"op":"show"}"#), Ok(Request::Show {}));
        assert_eq!(
            parse(r#"{"op":"set_host","nqn":"h","dhchap_hash":"hmac(sha384)"}"#),
            Ok(Request::SetHost {
                nqn: "h".into(),
                dhchap_key: None,
                dhchap_ctrl_key: None,
                dhchap_hash: Some("hmac(sha384)".into()),
                dhchap_dhgroup: None
            })
        );
        let r = parse(r#"{"op":"add_namespace","subsystem":"s","nsid":2,"backend":"ram","size":1048576}"#).unwrap();
        let Request::AddNamespace(spec) = r else { panic!("{r:?}") };
        assert!(spec.enabled, "enabled by default");
        assert_eq!(spec.into_config().unwrap().backend, BackendConfig::Ram { size: 1 << 20 });
    }

    #[test]
    fn hostile_requests_get_specific_errors() {
        let err = |t: &str| parse(t).unwrap_err();
        assert!(err(r#"{"op":"format_disk"}"#).contains("unknown variant `format_disk`"), "{}", err(r#"{"op":"format_disk"}"#));
        assert!(err(r#"{"op":"remove_host","nqn":"h","extra":1}"#).contains("unknown field `extra`"));
        // Every op, those without fields too.
        assert!(err(r#"{"op":"show","extra":1}"#).contains("unknown field `extra`"), "{}", err(r#"{"op":"show","extra":1}"#));
        let spec = r#"{"op":"add_namespace","subsystem":"s","nsid":1,"backend":"ram","size":4096,"extra":1}"#;
        assert!(err(spec).contains("unknown field `extra`"), "{}", err(spec));
        assert!(err(r#"{"op":"remove_host"}"#).contains("missing field `nqn`"));
        assert!(err(r#"{"nqn":"h"}"#).contains("missing field `op`"));
        assert!(err(r#"{"op":"enable_namespace","subsystem":"s","nsid":-1}"#).contains("invalid value"));
        assert!(err(r#"{"op":"enable_namespace","subsystem":"s","nsid":4294967296}"#).contains("invalid value"));
        assert!(err("not json").starts_with("bad request"));
        assert!(err(&" ".repeat(MAX_REQUEST_LEN + 1)).contains("longer than"));
        assert!(err(&"[".repeat(10_000)).starts_with("bad request"), "deep nesting is refused, not a stack overflow");
    }

    #[test]
    fn namespace_specs_are_checked_field_by_field() {
        let spec = |json: &str| match parse(json).unwrap() {
            Request::AddNamespace(s) => s.into_config(),
            other => panic!("{other:?}"),
        };
        let base = r#""op":"add_namespace","subsystem":"s","nsid":1"#;
        assert!(spec(&format!(r#"{{{base},"backend":"file"}}"#)).unwrap_err().contains("needs path"));
        assert!(spec(&format!(r#"{{{base},"backend":"ram"}}"#)).unwrap_err().contains("needs size"));
        assert!(spec(&format!(r#"{{{base},"backend":"file","path":"/x","size":1}}"#)).unwrap_err().contains("remove size"));
        assert!(spec(&format!(r#"{{{base},"backend":"tape","size":1}}"#)).unwrap_err().contains("\"tape\""));
        let long = "x".repeat(MAX_PATH_LEN + 1);
        assert!(spec(&format!(r#"{{{base},"backend":"file","path":"{long}"}}"#)).unwrap_err().contains("path longer"));
        let e = spec(&format!(r#"{{{base},"backend":"ram","size":4096,"uuid":"91fdba0d-f87b"}}"#)).unwrap_err();
        assert!(e.contains("uuid") && e.contains("32 hex digits"), "{e}");
        let ok = spec(&format!(r#"{{{base},"backend":"ram","size":4096,"uuid":"91fdba0d-f87b-4c25-b80f-db7be1418b9e"}}"#));
        let uuid = ok.unwrap().uuid.unwrap();
        assert_eq!(format_uuid(&uuid), "91fdba0d-f87b-4c25-b80f-db7be1418b9e");
    }

    #[test]
    fn nqns_are_bounded_and_printable() {
        assert!(check_nqn("nqn", "nqn.2014-08.org.nvmexpress:uuid:0f01fb42").is_ok());
        assert!(check_nqn("nqn", "").is_err());
        assert!(check_nqn("nqn", &"a".repeat(MAX_NQN_LEN + 1)).unwrap_err().contains("224"));
        assert!(check_nqn("host", "a b").unwrap_err().contains("printable"));
        assert!(check_nqn("host", "a\u{e9}").is_err());
    }
}
