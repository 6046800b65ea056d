//! Linux `nvmetcli save` JSON. Device paths become file backends; TCP and RDMA ports are used
//! (RDMA ones need the `rdma` build), others (loop, fc) are skipped with a warning.

use super::{parse_hex16, BackendConfig, ConfigError, NamespaceConfig, PortConfig, SubsystemConfig, TargetConfig};
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Deserialize)]
struct Saved {
    #[serde(default)]
    hosts: Vec<Host>,
    #[serde(default)]
    ports: Vec<Port>,
    #[serde(default)]
    subsystems: Vec<Subsystem>,
}

/// `nvmetcli save` groups a host's `dhchap_*` attributes as `"dhchap": {"key": ...}`; flat
/// `dhchap_key` fields (configfs names) are taken too.
#[derive(Deserialize)]
struct Host {
    nqn: String,
    #[serde(default)]
    dhchap: HashMap<String, serde_json::Value>,
    #[serde(flatten)]
    flat: HashMap<String, serde_json::Value>,
}

impl Host {
    fn attr(&self, name: &str) -> Option<&str> {
        self.dhchap.get(name).or_else(|| self.flat.get(&format!("dhchap_{name}"))).and_then(|v| v.as_str())
    }
}

#[derive(Deserialize)]
struct Port {
    addr: Addr,
    #[serde(default)]
    portid: serde_json::Value,
    #[serde(default)]
    param: HashMap<String, serde_json::Value>,
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
    /// "not specified" | "required" | "not required" (nvmet's addr_treq).
    #[serde(default)]
    treq: String,
    /// "none" | "tls1.3" (nvmet's addr_tsas).
    #[serde(default)]
    tsas: String,
}

/// nvmet's addr_tsas and addr_treq as a port's TLS mode: TLS 1.3 is required unless treq says
/// "not required" (nvmet makes "required" the default when tsas is tls1.3).
fn port_tls(a: &Addr) -> Result<super::PortTls, String> {
    match a.tsas.trim() {
        "" | "none" => Ok(super::PortTls::None),
        "tls1.3" => Ok(if a.treq.trim() == "not required" { super::PortTls::Allowed } else { super::PortTls::Required }),
        other => Err(format!("addr_tsas {other:?}: expected none or tls1.3")),
    }
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

/// A number nvmetcli wrote as a string ("4420") or as a number.
fn number(v: &serde_json::Value) -> Option<i64> {
    match v {
        serde_json::Value::Number(n) => n.as_i64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
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
    let mut inline_data_size = None;
    for p in saved.ports {
        let rdma = p.addr.trtype.eq_ignore_ascii_case("rdma");
        if !rdma && !p.addr.trtype.eq_ignore_ascii_case("tcp") {
            tracing::warn!(portid = %p.portid, trtype = %p.addr.trtype, "{origin}: skipping a port that is neither TCP nor RDMA");
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
        let portid = match number(&p.portid) {
            Some(id) => Some(u16::try_from(id).map_err(|_| ConfigError::invalid(&origin, format!("port {}: portid out of range", p.portid)))?),
            None => None,
        };
        // nvmet's inline_data_size is per port; ours is one for the target (-1 = nvmet's default).
        if let Some(size) = p.param.get("inline_data_size").and_then(number).filter(|s| *s >= 0) {
            let size = u32::try_from(size)
                .map_err(|_| ConfigError::invalid(&origin, format!("port {}: inline_data_size {size} out of range", p.portid)))?;
            match inline_data_size {
                Some(other) if other != size => {
                    return Err(ConfigError::invalid(
                        &origin,
                        format!("ports ask for inline_data_size {other} and {size}: this target has one in-capsule data size for all ports"),
                    ))
                }
                _ => inline_data_size = Some(size),
            }
        }
        if rdma {
            // An RDMA port's addr_tsas names RDMA's QP and CM types, not a secure channel.
            config.rdma_ports.push(PortConfig { addr, portid, subsystems: Some(p.subsystems), tls: Default::default() });
            continue;
        }
        let tls = port_tls(&p.addr).map_err(|e| ConfigError::invalid(&origin, format!("port {}: {e}", p.portid)))?;
        config.ports.push(PortConfig { addr, portid, subsystems: Some(p.subsystems), tls });
    }
    if let Some(size) = inline_data_size {
        config.target.in_capsule_data_size = size;
    }
    for (i, h) in saved.hosts.iter().enumerate() {
        let fields = super::host_auth::RawHostAuth {
            key: h.attr("key"),
            ctrl_key: h.attr("ctrl_key"),
            hash: h.attr("hash"),
            dhgroup: h.attr("dhgroup"),
        };
        let at = format!("hosts[{i}] ({})", h.nqn);
        config.hosts.extend(super::HostAuthConfig::from_raw(&origin, &at, &h.nqn, fields)?);
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
     "param": {"inline_data_size": "16384"}, "portid": 3, "referrals": [], "subsystems": ["nqn.2024-01.test:a"]},
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
    fn addr_tsas_and_addr_treq_set_the_port_tls() {
        let with = |addr_extra: &str| {
            let t = SAVED.replace(r#""treq": "not specified","#, addr_extra);
            parse(&t, Path::new("s.json")).map(|c| c.ports[0].tls)
        };
        use super::super::PortTls;
        assert_eq!(with(r#""treq": "not specified","#).unwrap(), PortTls::None);
        assert_eq!(with(r#""treq": "not specified", "tsas": "tls1.3","#).unwrap(), PortTls::Required);
        assert_eq!(with(r#""treq": "required", "tsas": "tls1.3","#).unwrap(), PortTls::Required);
        assert_eq!(with(r#""treq": "not required", "tsas": "tls1.3","#).unwrap(), PortTls::Allowed);
        assert_eq!(with(r#""treq": "not specified", "tsas": "none","#).unwrap(), PortTls::None);
        let e = with(r#""tsas": "tls1.2","#).unwrap_err().to_string();
        assert!(e.contains("addr_tsas"), "{e}");
    }

    #[test]
    fn rdma_ports_become_rdma_ports() {
        let loop_port = r#"{"adrfam": "", "traddr": "", "trsvcid": "", "trtype": "loop"}, "portid": 2"#;
        let rdma_port = r#"{"adrfam": "ipv4", "traddr": "10.0.0.1", "trsvcid": "4421", "trtype": "rdma", "tsas": "connected"}, "portid": 2"#;
        let c = parse(&SAVED.replace(loop_port, rdma_port), Path::new("s.json")).unwrap();
        assert_eq!(c.ports.len(), 1);
        assert_eq!(c.rdma_ports.len(), 1);
        assert_eq!((c.rdma_ports[0].addr, c.rdma_ports[0].portid), ("10.0.0.1:4421".parse().unwrap(), Some(2)));
    }

    #[test]
    fn parses_nvmetcli_save() {
        let c = parse(SAVED, Path::new("s.json")).unwrap();
        assert_eq!(c.ports.len(), 1, "loop port skipped");
        assert_eq!(c.ports[0].addr, "127.0.0.1:4420".parse().unwrap());
        assert_eq!(c.ports[0].subsystems.as_deref(), Some(&["nqn.2024-01.test:a".to_string()][..]));
        assert_eq!(c.ports[0].portid, Some(3), "nvmet's portid kept for the discovery log");
        assert_eq!(c.target.in_capsule_data_size, 16384, "the port's inline_data_size");
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
    fn ports_with_different_inline_data_sizes_are_refused_by_name() {
        let two = SAVED.replace(
            r#"{"adrfam": "", "traddr": "", "trsvcid": "", "trtype": "loop"}, "portid": 2,"#,
            r#"{"adrfam": "ipv4", "traddr": "127.0.0.1", "trsvcid": "4421", "trtype": "tcp"}, "param": {"inline_data_size": "0"}, "portid": 2,"#,
        );
        let e = parse(&two, Path::new("s.json")).unwrap_err().to_string();
        assert!(e.contains("inline_data_size 16384 and 0"), "{e}");
    }

    #[test]
    fn host_dhchap_attributes_become_keys() {
        let key = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
        let grouped = SAVED.replace(
            r#"{"nqn": "nqn.host1"}"#,
            &format!(r#"{{"nqn": "nqn.host1", "dhchap": {{"key": "{key}", "ctrl_key": "", "hash": "hmac(sha384)", "dhgroup": "ffdhe2048"}}}}"#),
        );
        let c = parse(&grouped, Path::new("s.json")).unwrap();
        assert_eq!(c.hosts.len(), 1);
        assert_eq!(c.hosts[0].dhchap_hash, nvmf_proto::auth::HashId::Sha384);
        assert_eq!(c.hosts[0].dhchap_dhgroup, nvmf_proto::auth::DhGroup::Ffdhe2048);
        assert_eq!(c.hosts[0].dhchap_ctrl_key, None, "nvmetcli saves an unset key as \"\"");
        let flat = SAVED.replace(
            r#"{"nqn": "nqn.host1"}"#,
            &format!(r#"{{"nqn": "nqn.host1", "dhchap_key": "{key}", "dhchap_ctrl_key": "{key}"}}"#),
        );
        let c = parse(&flat, Path::new("s.json")).unwrap();
        assert!(c.hosts[0].dhchap_ctrl_key.is_some());
        assert!(parse(SAVED, Path::new("s.json")).unwrap().hosts.is_empty());
        let bad = SAVED.replace(r#"{"nqn": "nqn.host1"}"#, r#"{"nqn": "nqn.host1", "dhchap": {"key": "DHHC-1:09:x:"}}"#);
        let e = parse(&bad, Path::new("s.json")).unwrap_err().to_string();
        assert!(e.contains("hosts[0] (nqn.host1): dhchap_key"), "{e}");
    }

    #[test]
    fn syntax_error_has_line() {
        let e = parse("{\n \"ports\": [\n  oops\n]}", Path::new("s.json")).unwrap_err().to_string();
        assert!(e.starts_with("s.json:3:"), "{e}");
    }
}
