//! TOML config file (CONTRACTS.md section 2). Unknown keys are errors, reported with file and line.

use super::{
    parse_hex16, parse_size, BackendConfig, ConfigError, HostAuthConfig, HostMapEntry, NamespaceConfig, PortConfig,
    ReactorMode, SubsystemConfig, TargetConfig, TargetSettings,
};
use serde::Deserialize;
use ::toml::Spanned;
use std::path::{Path, PathBuf};

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    target: RawTarget,
    #[serde(default)]
    port: Vec<RawPort>,
    #[serde(default)]
    subsystem: Vec<RawSubsystem>,
    #[serde(default)]
    host_map: Vec<RawHostMap>,
    /// Per-host DH-HMAC-CHAP keys (nvmet's `hosts/<nqn>/dhchap_*`).
    #[serde(default)]
    host: Vec<RawHost>,
    /// The runtime control surface's limits (docs/control.md).
    control: Option<RawControl>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawControl {
    /// Directories whose files `add_namespace` may open.
    allow_paths: Option<Vec<PathBuf>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    nqn: String,
    dhchap_key: Option<String>,
    dhchap_ctrl_key: Option<String>,
    dhchap_hash: Option<String>,
    dhchap_dhgroup: Option<String>,
    /// TLS PSK in the interchange format (`NVMeTLSkey-1:HH:<base64>:`).
    tls_key: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    cores: Option<Vec<usize>>,
    mode: Option<Spanned<String>>,
    idle_poll_us: Option<u64>,
    in_capsule_data_size: Option<u32>,
    maxh2cdata: Option<u32>,
    so_priority: Option<u32>,
    tos: Option<u32>,
    busy_poll_us: Option<u32>,
    tcp_congestion: Option<String>,
    stats: Option<Spanned<String>>,
    control: Option<PathBuf>,
    kato_default_ms: Option<u32>,
    max_connections: Option<u32>,
    max_controllers: Option<u32>,
    buffer_memory: Option<Spanned<RawSize>>,
    stall_timeout_ms: Option<u64>,
    ram_limit_percent: Option<u32>,
    /// "auto" | "on" | "off": TLS records in the kernel (kTLS).
    ktls: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPort {
    addr: Spanned<String>,
    portid: Option<u16>,
    subsystems: Option<Vec<String>>,
    /// "none" (default), "allowed" or "required".
    tls: Option<Spanned<String>>,
    /// "tcp" (default) or "rdma".
    trtype: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSubsystem {
    nqn: String,
    serial: Option<String>,
    model: Option<String>,
    #[serde(default = "yes")]
    allow_any_host: bool,
    #[serde(default)]
    hosts: Vec<String>,
    reactor: Option<usize>,
    #[serde(default)]
    namespace: Vec<RawNamespace>,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawSize {
    Bytes(u64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNamespace {
    nsid: u32,
    backend: Spanned<String>,
    size: Option<Spanned<RawSize>>,
    path: Option<PathBuf>,
    /// The model backend's parameters, "lat=80us,par=32,bw=3GiB" (backend/model.rs).
    model: Option<String>,
    block_size: Option<u32>,
    nguid: Option<String>,
    uuid: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHostMap {
    hostnqn: String,
    reactor: usize,
}

/// Reads and parses a TOML config file.
pub fn load(path: &Path) -> Result<TargetConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    parse(&text, path)
}

/// Parses TOML text; `path` is used in error messages only.
pub fn parse(text: &str, path: &Path) -> Result<TargetConfig, ConfigError> {
    let raw: RawConfig = ::toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
        ConfigError::Syntax {
            path: path.to_path_buf(),
            line,
            column,
            message: e.message().trim().replace('\n', " "),
        }
    })?;
    let origin = path.display().to_string();
    let bad = |msg: String| ConfigError::invalid(&origin, msg);
    // A value that parsed as TOML but is not allowed: report it at its own line.
    let bad_at = |span: std::ops::Range<usize>, msg: String| {
        let (line, column) = line_col(text, span.start);
        ConfigError::Syntax { path: path.to_path_buf(), line, column, message: msg }
    };

    let mut target = TargetSettings::default();
    let t = raw.target;
    if let Some(v) = t.cores {
        target.cores = v;
    }
    if let Some(m) = t.mode {
        target.mode = ReactorMode::parse(m.get_ref()).ok_or_else(|| {
            bad_at(m.span(), format!("target.mode = {:?}: expected \"poll\" or \"event\"", m.get_ref()))
        })?;
    }
    macro_rules! take {
        ($($f:ident),*) => { $(if let Some(v) = t.$f { target.$f = v; })* };
    }
    take!(idle_poll_us, in_capsule_data_size, maxh2cdata, so_priority, tos, busy_poll_us, kato_default_ms);
    take!(max_connections, max_controllers, stall_timeout_ms, ram_limit_percent);
    if t.tcp_congestion.is_some() {
        target.tcp_congestion = t.tcp_congestion;
    }
    if let Some(s) = t.stats {
        target.stats = Some(super::parse_stats_addr(s.get_ref()).ok_or_else(|| {
            bad_at(s.span(), format!("target.stats = {:?}: expected ADDR:PORT or PORT (loopback)", s.get_ref()))
        })?);
    }
    target.control = t.control;
    target.control_allow_paths = raw.control.and_then(|c| c.allow_paths);
    if let Some(k) = t.ktls {
        target.ktls = nvmf_tls::KtlsMode::parse(k.get_ref())
            .ok_or_else(|| bad_at(k.span(), format!("target.ktls = {:?}: expected \"auto\", \"on\" or \"off\"", k.get_ref())))?;
    }
    if let Some(b) = t.buffer_memory {
        let bytes = match b.get_ref() {
            RawSize::Bytes(n) => Some(*n),
            RawSize::Text(s) => parse_size(s),
        };
        target.buffer_memory = Some(bytes.ok_or_else(|| bad_at(b.span(), "target.buffer_memory: expected a size like \"2GiB\"".into()))?);
    }

    let mut ports = Vec::new();
    let mut rdma_ports = Vec::new();
    for (i, p) in raw.port.into_iter().enumerate() {
        let rdma = match p.trtype.as_ref().map(|t| (t.get_ref().as_str(), t.span())) {
            None | Some(("tcp", _)) => false,
            Some(("rdma", _)) => true,
            Some((other, span)) => return Err(bad_at(span, format!("port[{i}].trtype = {other:?}: expected \"tcp\" or \"rdma\""))),
        };
        let addr = super::parse_listen_addr(p.addr.get_ref())
            .map_err(|e| bad_at(p.addr.span(), format!("port[{i}].addr = {e}")))?;
        let tls = match &p.tls {
            None => super::PortTls::None,
            Some(t) => super::PortTls::parse(t.get_ref()).ok_or_else(|| {
                bad_at(t.span(), format!("port[{i}].tls = {:?}: expected \"none\", \"allowed\" or \"required\"", t.get_ref()))
            })?,
        };
        let port = PortConfig { addr, portid: p.portid, subsystems: p.subsystems, tls };
        if rdma { rdma_ports.push(port) } else { ports.push(port) }
    }

    let mut subsystems = Vec::new();
    for (i, s) in raw.subsystem.into_iter().enumerate() {
        let mut namespaces = Vec::new();
        for (j, n) in s.namespace.into_iter().enumerate() {
            let at = format!("subsystem[{i}].namespace[{j}]");
            let block_size = n.block_size.unwrap_or(512);
            let size = match n.size {
                None => None,
                Some(sized) => match sized.get_ref() {
                    RawSize::Bytes(b) => Some(*b),
                    RawSize::Text(t) => Some(parse_size(t).ok_or_else(|| {
                        bad_at(sized.span(), format!("{at}.size = {t:?}: expected e.g. 1GiB, 64MiB, 4k"))
                    })?),
                },
            };
            let backend_span = n.backend.span();
            let backend_name = n.backend.into_inner();
            if n.model.is_some() && backend_name != "model" {
                return Err(bad(format!("{at}: `model` belongs to backend \"model\" only")));
            }
            let backend = match (backend_name.as_str(), size, n.path) {
                ("model", Some(size), None) => BackendConfig::Model {
                    size,
                    params: crate::backend::ModelParams::parse(n.model.as_deref().unwrap_or(""))
                        .map_err(|e| bad(format!("{at}.model: {e}")))?,
                },
                ("null", Some(size), None) => BackendConfig::Null { size },
                ("ram", Some(size), None) => BackendConfig::Ram { size },
                ("file", None, Some(path)) => BackendConfig::File { path },
                ("null" | "ram" | "model", None, _) => return Err(bad(format!("{at}: backend {backend_name:?} needs size"))),
                ("null" | "ram" | "model", _, Some(_)) => {
                    return Err(bad(format!("{at}: backend {backend_name:?} takes no path")))
                }
                ("file", _, None) => return Err(bad(format!("{at}: backend \"file\" needs path"))),
                ("file", Some(_), _) => {
                    return Err(bad(format!("{at}: backend \"file\" takes its size from the file; remove size")))
                }
                (other, _, _) => {
                    return Err(bad_at(
                        backend_span,
                        format!("{at}.backend = {other:?}: expected \"null\", \"ram\", \"model\" or \"file\""),
                    ))
                }
            };
            let hex = |v: Option<String>, name: &str| -> Result<Option<[u8; 16]>, ConfigError> {
                v.map(|s| parse_hex16(&s).ok_or_else(|| bad(format!("{at}.{name} = {s:?}: expected 32 hex digits"))))
                    .transpose()
            };
            namespaces.push(NamespaceConfig {
                nsid: n.nsid,
                backend,
                block_size,
                nguid: hex(n.nguid, "nguid")?,
                uuid: hex(n.uuid, "uuid")?,
            });
        }
        subsystems.push(SubsystemConfig {
            nqn: s.nqn,
            serial: s.serial,
            model: s.model,
            allow_any_host: s.allow_any_host,
            hosts: s.hosts,
            reactor: s.reactor,
            namespaces,
        });
    }
    let host_map = raw
        .host_map
        .into_iter()
        .map(|h| HostMapEntry { hostnqn: h.hostnqn, reactor: h.reactor })
        .collect();
    let mut hosts = Vec::new();
    let mut tls_keys = Vec::new();
    for (i, h) in raw.host.iter().enumerate() {
        let fields = super::host_auth::RawHostAuth {
            key: h.dhchap_key.as_deref(),
            ctrl_key: h.dhchap_ctrl_key.as_deref(),
            hash: h.dhchap_hash.as_deref(),
            dhgroup: h.dhchap_dhgroup.as_deref(),
        };
        hosts.extend(HostAuthConfig::from_raw(&origin, &format!("host[{i}] ({})", h.nqn), &h.nqn, fields)?);
        if let Some(k) = &h.tls_key {
            let key = nvmf_tls::ConfiguredPsk::parse(k.get_ref())
                .map_err(|e| bad_at(k.span(), format!("host[{i}] ({}).tls_key: {e}", h.nqn)))?;
            if tls_keys.iter().any(|t: &super::HostTlsKey| t.nqn == h.nqn) {
                return Err(bad_at(k.span(), format!("host[{i}] ({}).tls_key: this host has a TLS key already", h.nqn)));
            }
            tls_keys.push(super::HostTlsKey { nqn: h.nqn.clone(), key });
        }
    }
    let config = TargetConfig { target, ports, subsystems, host_map, hosts, tls_keys, rdma_ports };
    config.validate(&origin)?;
    Ok(config)
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map(|p| p + 1).unwrap_or(0) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_allow_paths() {
        let text = "[control]\nallow_paths = [\"/srv/img\", \"/data\"]\n[[port]]\naddr = \"127.0.0.1:4420\"\n";
        let t = parse(text, Path::new("a.toml")).unwrap().target;
        assert_eq!(t.control_allow_paths, Some(vec![PathBuf::from("/srv/img"), PathBuf::from("/data")]));
        assert_eq!(parse("[[port]]\naddr = \"127.0.0.1:4420\"\n", Path::new("a.toml")).unwrap().target.control_allow_paths, None);
        let e = parse("[control]\nallow_path = [\"/x\"]\n", Path::new("a.toml")).unwrap_err().to_string();
        assert!(e.contains("allow_path"), "a misspelt key is refused: {e}");
    }

    #[test]
    fn limits_keys() {
        let text = "[target]\nstats = \"9100\"\nmax_connections = 5\nmax_controllers = 2\nbuffer_memory = \"64MiB\"\nstall_timeout_ms = 0\n[[port]]\naddr = \"127.0.0.1:4420\"\n";
        let t = parse(text, Path::new("l.toml")).unwrap().target;
        assert_eq!(t.stats, Some("127.0.0.1:9100".parse().unwrap()), "a bare port is loopback");
        assert_eq!((t.max_connections, t.max_controllers, t.stall_timeout_ms), (5, 2, 0));
        assert_eq!(t.buffer_memory, Some(64 << 20));
        let e = parse("[target]\nbuffer_memory = \"lots\"\n", Path::new("l.toml")).unwrap_err().to_string();
        assert!(e.contains("l.toml:2") && e.contains("buffer_memory"), "{e}");
        assert_eq!(t.tcp_congestion, None);
        let text = "[target]\ntcp_congestion = \"bbr\"\n[[port]]\naddr = \"127.0.0.1:4420\"\n";
        let t = parse(text, Path::new("c.toml")).unwrap().target;
        assert_eq!(t.tcp_congestion.as_deref(), Some("bbr"));
    }

    const EXAMPLE: &str = r#"
[target]
cores = [0, 1]
mode = "poll"
idle_poll_us = 50
in_capsule_data_size = 16384
maxh2cdata = 131072
stats = "127.0.0.1:9100"

[[port]]
addr = "127.0.0.1:4420"

[[subsystem]]
nqn = "nqn.2024-01.io.nvmflab:a"
serial = "NVMFLAB0001"
allow_any_host = false
hosts = ["nqn.host1"]
reactor = 1

  [[subsystem.namespace]]
  nsid = 1
  backend = "ram"
  size = "1MiB"

  [[subsystem.namespace]]
  nsid = 2
  backend = "null"
  size = 1073741824
  block_size = 4096

[[host_map]]
hostnqn = "nqn.host1"
reactor = 0
"#;

    #[test]
    fn parses_the_contract_example() {
        let c = parse(EXAMPLE, Path::new("t.toml")).unwrap();
        assert_eq!(c.target.cores, vec![0, 1]);
        assert_eq!(c.target.mode, ReactorMode::Poll);
        assert_eq!(c.target.idle_poll_us, 50);
        assert_eq!(c.target.in_capsule_data_size, 16384);
        assert_eq!(c.target.stats, Some("127.0.0.1:9100".parse().unwrap()));
        assert_eq!(c.ports[0].addr, "127.0.0.1:4420".parse().unwrap());
        let s = &c.subsystems[0];
        assert!(!s.allow_any_host);
        assert_eq!(s.hosts, vec!["nqn.host1".to_string()]);
        assert_eq!(s.reactor, Some(1));
        assert_eq!(s.namespaces[0].backend, BackendConfig::Ram { size: 1 << 20 });
        assert_eq!(s.namespaces[1].backend, BackendConfig::Null { size: 1 << 30 });
        assert_eq!(s.namespaces[1].block_size, 4096);
        assert_eq!(c.host_map[0].reactor, 0);
    }

    #[test]
    fn model_namespaces_take_their_parameters_and_only_they() {
        let ns = |extra: &str| format!("[[port]]\naddr = \"127.0.0.1:4420\"\n[[subsystem]]\nnqn = \"nqn.s\"\n[[subsystem.namespace]]\nnsid = 1\n{extra}\n");
        let c = parse(&ns("backend = \"model\"\nsize = \"1MiB\"\nmodel = \"lat=5us,par=2,bw=none\""), Path::new("m.toml")).map_err(|e| e.to_string()).unwrap();
        let want = crate::backend::ModelParams { latency_ns: 5_000, parallelism: 2, bandwidth: None };
        assert_eq!(c.subsystems[0].namespaces[0].backend, BackendConfig::Model { size: 1 << 20, params: want });
        let e = parse(&ns("backend = \"ram\"\nsize = \"1MiB\"\nmodel = \"lat=5us\""), Path::new("m.toml")).unwrap_err().to_string();
        assert!(e.contains("`model` belongs to backend \"model\""), "{e}");
        let e = parse(&ns("backend = \"model\"\nsize = \"1MiB\"\nmodel = \"lat=fast\""), Path::new("m.toml")).unwrap_err().to_string();
        assert!(e.contains("namespace[0].model") && e.contains("lat=fast"), "{e}");
    }

    #[test]
    fn unknown_field_names_file_and_line() {
        let text = "[target]\ncores = [0]\nbogus = 1\n";
        let e = parse(text, Path::new("/etc/t.toml")).unwrap_err().to_string();
        assert!(e.starts_with("/etc/t.toml:3:"), "{e}");
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn wrong_type_names_line() {
        let text = "[[port]]\naddr = \"127.0.0.1:1\"\n\n[target]\nidle_poll_us = \"x\"\n";
        let e = parse(text, Path::new("a.toml")).unwrap_err().to_string();
        assert!(e.starts_with("a.toml:5:"), "{e}");
    }

    #[test]
    fn semantic_errors_name_the_field() {
        let text = "[[port]]\naddr = \"127.0.0.1:1\"\n[[subsystem]]\nnqn = \"n\"\n[[subsystem.namespace]]\nnsid = 1\nbackend = \"ram\"\n";
        let e = parse(text, Path::new("a.toml")).unwrap_err().to_string();
        assert!(e.contains("subsystem[0].namespace[0]") && e.contains("needs size"), "{e}");
        let text = "[[port]]\naddr = \"nope\"\n";
        let e = parse(text, Path::new("a.toml")).unwrap_err().to_string();
        assert!(e.starts_with("a.toml:2:") && e.contains("port[0].addr"), "{e}");
        let text = "[target]\ncores = [0]\nmode = \"sometimes\"\n";
        let e = parse(text, Path::new("a.toml")).unwrap_err().to_string();
        assert!(e.starts_with("a.toml:3:") && e.contains("target.mode"), "{e}");
        let text = "[[port]]\naddr = \"127.0.0.1:1\"\nportid = 2\n[[port]]\naddr = \"127.0.0.1:2\"\n";
        let e = parse(text, Path::new("a.toml")).unwrap_err().to_string();
        assert!(e.contains("port[1]") && e.contains("portid 2 is used twice"), "{e}");
    }

    #[test]
    fn host_entries_carry_dhchap_keys() {
        let text = r#"
[[port]]
addr = "127.0.0.1:4420"

[[host]]
nqn = "nqn.host1"
dhchap_key = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"
dhchap_ctrl_key = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:"
dhchap_hash = "sha384"
dhchap_dhgroup = "ffdhe2048"

[[host]]
nqn = "nqn.host2"
"#;
        let c = parse(text, Path::new("a.toml")).unwrap();
        assert_eq!(c.hosts.len(), 1, "a host without a key needs no authentication");
        let h = &c.hosts[0];
        assert_eq!(h.nqn, "nqn.host1");
        assert_eq!(h.dhchap_hash, nvmf_proto::auth::HashId::Sha384);
        assert_eq!(h.dhchap_dhgroup, nvmf_proto::auth::DhGroup::Ffdhe2048);
        assert!(h.dhchap_ctrl_key.is_some());
        let port = "[[port]]\naddr = \"127.0.0.1:4420\"\n";
        let e = parse(&format!("{port}[[host]]\nnqn = \"n\"\ndhchap_key = \"DHHC-1:00:AAAA:\"\n"), Path::new("a.toml")).unwrap_err();
        assert!(e.to_string().contains("host[0] (n): dhchap_key"), "{e}");
        let twice = "[[host]]\nnqn = \"n\"\ndhchap_key = \"DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:\"\n";
        let e = parse(&format!("{port}{twice}{twice}"), Path::new("a.toml")).unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
    }

    #[test]
    fn target_takes_a_ktls_mode() {
        let port = "[[port]]\naddr = \"127.0.0.1:1\"\n";
        assert_eq!(parse(port, Path::new("a.toml")).unwrap().target.ktls, nvmf_tls::KtlsMode::Auto);
        for (v, mode) in [("on", nvmf_tls::KtlsMode::On), ("off", nvmf_tls::KtlsMode::Off), ("auto", nvmf_tls::KtlsMode::Auto)] {
            let c = parse(&format!("[target]\nktls = \"{v}\"\n{port}"), Path::new("a.toml")).unwrap();
            assert_eq!(c.target.ktls, mode);
        }
        let e = parse(&format!("[target]\nktls = \"kernel\"\n{port}"), Path::new("a.toml")).unwrap_err().to_string();
        assert!(e.contains("target.ktls") && e.contains("\"auto\", \"on\" or \"off\""), "{e}");
    }

    #[test]
    fn ports_take_a_tls_mode_and_hosts_a_tls_key() {
        let key = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
        let text = format!(
            "[[port]]\naddr = \"127.0.0.1:1\"\ntls = \"required\"\n[[port]]\naddr = \"127.0.0.1:2\"\ntls = \"allowed\"\n\
             [[port]]\naddr = \"127.0.0.1:3\"\n[[host]]\nnqn = \"nqn.h\"\ntls_key = \"{key}\"\n"
        );
        let c = parse(&text, Path::new("a.toml")).unwrap();
        let modes: Vec<_> = c.ports.iter().map(|p| p.tls).collect();
        assert_eq!(modes, [super::super::PortTls::Required, super::super::PortTls::Allowed, super::super::PortTls::None]);
        assert_eq!(c.tls_keys.len(), 1);
        assert_eq!(c.tls_keys[0].nqn, "nqn.h");
        assert!(c.hosts.is_empty(), "a TLS key alone asks for no DH-HMAC-CHAP");
        let e = parse("[[port]]\naddr = \"127.0.0.1:1\"\ntls = \"maybe\"\n", Path::new("a.toml")).unwrap_err().to_string();
        assert!(e.starts_with("a.toml:3:") && e.contains("port[0].tls"), "{e}");
        let bad = "[[port]]\naddr = \"127.0.0.1:1\"\n[[host]]\nnqn = \"nqn.h\"\ntls_key = \"NVMeTLSkey-1:01:AAAA:\"\n";
        let e = parse(bad, Path::new("a.toml")).unwrap_err().to_string();
        assert!(e.contains("host[0] (nqn.h).tls_key"), "{e}");
    }

    #[test]
    fn missing_file_is_a_read_error() {
        let e = load(Path::new("/nonexistent/x.toml")).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/x.toml"), "{e}");
    }
}
