//! Linux `nvmetcli save` JSON. Device paths become file backends; only TCP ports are used
//! (others are skipped with a warning, since this target speaks TCP only).

use super::{parse_hex16, BackendConfig, ConfigError, NamespaceConfig, PortConfig, SubsystemConfig, TargetConfig};
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Deserialize)]
struct Saved {
    #[serde(default)]
    ports: Vec<Port>,
    #[serde(default)]
    subsystems: Vec<Subsystem>,
}

#[derive(Deserialize)]
struct Port {
    addr: Addr,
    #[serde(default)]
    portid: serde_json::Value,
    #[serde(default)]
    subsystems: Vec<String>,
}

#[derive(Deserialize)]
struct Addr {
    #[serde(default)]
    adrfam: String,
    #[serde(default)]
    traddr: String,
    #[serde(default)]
    trsvcid: String,
    #[serde(default)]
    trtype: String,
}

#[derive(Deserialize)]
struct Subsystem {
    nqn: String,
    #[serde(default)]
    attr: HashMap<String, serde_json::Value>,
    #[serde(default)]
    allowed_hosts: Vec<String>,
    #[serde(default)]
    namespaces: Vec<Namespace>,
}

#[derive(Deserialize)]
struct Namespace {
    nsid: u32,
    #[serde(default = "enabled")]
    enable: serde_json::Value,
    device: Device,
}

fn enabled() -> serde_json::Value {
    serde_json::Value::from(1)
}

#[derive(Deserialize)]
struct Device {
    path: PathBuf,
    #[serde(default)]
    nguid: Option<String>,
    #[serde(default)]
    uuid: Option<String>,
}

/// nvmetcli writes attributes as strings ("1") but older saves have numbers.
fn truthy(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Bool(b) => *b,
        serde_json::Value::Number(n) => n.as_u64() != Some(0),
        serde_json::Value::String(s) => s.trim() == "1" || s.trim().eq_ignore_ascii_case("true"),
        _ => false,
    }
}

pub fn load(path: &Path) -> Result<TargetConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    parse(&text, path)
}

pub fn parse(text: &str, path: &Path) -> Result<TargetConfig, ConfigError> {
    let saved: Saved = serde_json::from_str(text).map_err(|e| ConfigError::Syntax {
        path: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let origin = path.display().to_string();
    let mut config = TargetConfig::empty();
    for p in saved.ports {
        if !p.addr.trtype.eq_ignore_ascii_case("tcp") {
            tracing::warn!(portid = %p.portid, trtype = %p.addr.trtype, "{origin}: skipping non-TCP port");
            continue;
        }
        let text = if p.addr.adrfam == "ipv6" && !p.addr.traddr.starts_with('[') {
            format!("[{}]:{}", p.addr.traddr, p.addr.trsvcid)
        } else {
            format!("{}:{}", p.addr.traddr, p.addr.trsvcid)
        };
        let addr: SocketAddr = text.parse().map_err(|_| {
            ConfigError::invalid(&origin, format!("port {}: bad traddr/trsvcid {text:?}", p.portid))
        })?;
        config.ports.push(PortConfig { addr, subsystems: Some(p.subsystems) });
    }
    for s in saved.subsystems {
        let attr_str = |k: &str| s.attr.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let mut sub = SubsystemConfig::new(s.nqn.clone());
        sub.allow_any_host = s.attr.get("allow_any_host").map(truthy).unwrap_or(false);
        sub.hosts = s.allowed_hosts;
        sub.serial = attr_str("serial");
        sub.model = attr_str("model");
        for n in s.namespaces {
            if !truthy(&n.enable) {
                continue;
            }
            // nvmetcli writes all-zero ids when none was set; treat them as "generate one".
            let id = |v: Option<String>| v.as_deref().and_then(parse_hex16).filter(|b| b.iter().any(|x| *x != 0));
            sub.namespaces.push(NamespaceConfig {
                nsid: n.nsid,
                backend: BackendConfig::File { path: n.device.path },
                block_size: 512,
                nguid: id(n.device.nguid),
                uuid: id(n.device.uuid),
            });
        }
        config.subsystems.push(sub);
    }
    config.validate(&origin)?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVED: &str = r#"{
  "hosts": [{"nqn": "nqn.host1"}],
  "ports": [
    {"addr": {"adrfam": "ipv4", "traddr": "127.0.0.1", "treq": "not specified", "trsvcid": "4420", "trtype": "tcp"},
     "portid": 1, "referrals": [], "subsystems": ["nqn.2024-01.test:a"]},
    {"addr": {"adrfam": "", "traddr": "", "trsvcid": "", "trtype": "loop"}, "portid": 2, "subsystems": []}
  ],
  "subsystems": [
    {"allowed_hosts": ["nqn.host1"],
     "attr": {"allow_any_host": "0", "serial": "abc123", "version": "1.3"},
     "namespaces": [
       {"device": {"nguid": "00000000-0000-0000-0000-000000000000", "path": "/dev/loop0",
                   "uuid": "ef90689c-6c46-d44c-89c1-4067801309a8"}, "enable": 1, "nsid": 1},
       {"device": {"path": "/tmp/off.img"}, "enable": 0, "nsid": 2}
     ],
     "nqn": "nqn.2024-01.test:a"}
  ]
}"#;

    #[test]
    fn parses_nvmetcli_save() {
        let c = parse(SAVED, Path::new("s.json")).unwrap();
        assert_eq!(c.ports.len(), 1, "loop port skipped");
        assert_eq!(c.ports[0].addr, "127.0.0.1:4420".parse().unwrap());
        assert_eq!(c.ports[0].subsystems.as_deref(), Some(&["nqn.2024-01.test:a".to_string()][..]));
        let s = &c.subsystems[0];
        assert!(!s.allow_any_host);
        assert_eq!(s.hosts, vec!["nqn.host1"]);
        assert_eq!(s.serial.as_deref(), Some("abc123"));
        assert_eq!(s.namespaces.len(), 1, "disabled namespace skipped");
        assert_eq!(s.namespaces[0].backend, BackendConfig::File { path: "/dev/loop0".into() });
        assert_eq!(s.namespaces[0].nguid, None);
        assert_eq!(s.namespaces[0].uuid.unwrap()[0], 0xef);
    }

    #[test]
    fn syntax_error_has_line() {
        let e = parse("{\n \"ports\": [\n  oops\n]}", Path::new("s.json")).unwrap_err().to_string();
        assert!(e.starts_with("s.json:3:"), "{e}");
    }
}
