//! The parsed target configuration, whatever its source (TOML file, nvmetcli JSON, command line).
//!
//! Every source produces a [`TargetConfig`]; [`TargetConfig::validate`] then checks the rules that
//! no single source can check alone (unique NQNs and nsids, reactor indexes in range, sizes).

pub mod cli;
pub mod host_auth;
pub mod nvmetcli;
pub mod toml;

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

pub use host_auth::HostAuthConfig;
// Owned by backend/ and units.rs, which import nothing from config/ (no import circle).
pub use crate::backend::BackendConfig;
pub use crate::units::parse_size;

/// NQNs are at most 223 bytes (NVMe Base 4.5 "NVMe Qualified Names").
pub const MAX_NQN_LEN: usize = 223;
/// Largest in-capsule data size we advertise; keeps per-command buffers bounded.
pub const MAX_IN_CAPSULE_DATA_SIZE: u32 = 1 << 20;
pub const DEFAULT_NQN: &str = "nqn.2024-01.io.nvmflab:default";
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

#[derive(Debug, Clone, PartialEq)]
pub struct TargetConfig {
    pub target: TargetSettings,
    pub ports: Vec<PortConfig>,
    pub subsystems: Vec<SubsystemConfig>,
    pub host_map: Vec<HostMapEntry>,
    /// DH-HMAC-CHAP keys of the hosts that must authenticate.
    pub hosts: Vec<HostAuthConfig>,
    /// TLS PSKs (configured, interchange format) of the hosts that may use TLS.
    pub tls_keys: Vec<HostTlsKey>,
    /// NVMe over RDMA ports (`--listen rdma:ADDR:PORT`, `[[port]] trtype = "rdma"`); served
    /// only by a build with the `rdma` feature. Their PORTIDs follow the TCP ports'.
    pub rdma_ports: Vec<PortConfig>,
}

/// TLS on a port (nvmet's `addr_treq` with `addr_tsas` = tls1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PortTls {
    /// Plain NVMe/TCP only (a ClientHello is refused as a bad ICReq).
    #[default]
    None,
    /// TLS 1.3 or plain: the first byte tells (0x16: a TLS handshake record; 0x00: ICReq).
    Allowed,
    /// TLS 1.3 only: a plain ICReq is refused (the connection is closed and logged).
    Required,
}

impl PortTls {
    pub fn parse(s: &str) -> Option<PortTls> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "off" | "no" => Some(PortTls::None),
            "allowed" | "allow" | "not required" => Some(PortTls::Allowed),
            "required" | "require" | "on" => Some(PortTls::Required),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PortTls::None => "none",
            PortTls::Allowed => "allowed",
            PortTls::Required => "required",
        }
    }
}

/// A host's configured TLS PSK: the TLS PSK for an identity naming this host is derived from it.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTlsKey {
    pub nqn: String,
    pub key: nvmf_tls::ConfiguredPsk,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReactorMode {
    /// Busy loop: never sleeps in the kernel.
    Poll,
    /// Sleeps in epoll when idle (after `idle_poll_us` of polling).
    Event,
}

impl ReactorMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReactorMode::Poll => "poll",
            ReactorMode::Event => "event",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "poll" => Some(ReactorMode::Poll),
            "event" => Some(ReactorMode::Event),
            _ => None,
        }
    }
}

impl fmt::Display for ReactorMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TargetSettings {
    /// One reactor thread per entry, pinned to that core.
    pub cores: Vec<usize>,
    pub mode: ReactorMode,
    pub idle_poll_us: u64,
    pub in_capsule_data_size: u32,
    pub maxh2cdata: u32,
    pub so_priority: u32,
    pub tos: u32,
    pub busy_poll_us: u32,
    /// TCP congestion control of every connection (`TCP_CONGESTION`, e.g. "cubic"); None: the
    /// system's. It governs how the target sends read data.
    pub tcp_congestion: Option<String>,
    pub stats: Option<SocketAddr>,
    /// Unix socket of the runtime control surface (control.rs, docs/control.md); none: off.
    pub control: Option<PathBuf>,
    /// Directories whose files (and devices) `add_namespace` may open (`[control] allow_paths`,
    /// `--control-allow-path`); `None`: the directories of the configured file namespaces.
    pub control_allow_paths: Option<Vec<PathBuf>>,
    /// KATO used when a host connects with kato = 0 is *not* overridden; this only applies to
    /// hosts that ask for the default (Linux always sends its own value).
    pub kato_default_ms: u32,
    /// TCP connections open at once (every queue is one); the one beyond is closed at accept.
    pub max_connections: u32,
    /// Controllers at once; a Connect beyond gets Connect Controller Busy.
    pub max_controllers: u32,
    /// Bytes of command data buffers and queued output (beyond 64 KiB a connection) all
    /// connections together may hold; `None`: a quarter of the machine's memory
    /// ([`default_buffer_memory`]).
    pub buffer_memory: Option<u64>,
    /// A connection that stops mid-PDU, leaves an R2T unanswered or stops reading our PDUs for
    /// this long is dropped (0 = never).
    pub stall_timeout_ms: u64,
    /// RAM namespaces together may take at most this percentage of the memory available at
    /// start (MemAvailable): the RAM backend fills its pages at start, and a namespace beyond
    /// memory would abort the process instead of failing as a config error.
    pub ram_limit_percent: u32,
    /// TLS records in the kernel (kTLS): auto (where the kernel has it), on (or fail), off.
    pub ktls: nvmf_tls::KtlsMode,
}

impl TargetSettings {
    /// The process-wide buffer cap in bytes.
    pub fn buffer_memory_bytes(&self) -> u64 {
        self.buffer_memory.unwrap_or_else(default_buffer_memory)
    }
}

/// A quarter of MemTotal (at least 256 MiB), or 4 GiB when /proc/meminfo cannot be read.
pub fn default_buffer_memory() -> u64 {
    meminfo_bytes("MemTotal:").map_or(4 << 30, |t| (t / 4).max(256 << 20))
}

/// The cores this process may run on (its affinity mask), `None` where it cannot be read.
fn allowed_cores() -> Option<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data that sched_getaffinity fills; CPU_ISSET stays in its bounds.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let ok = libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0;
        ok.then(|| (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect())
    }
}

/// One `/proc/meminfo` field (e.g. "MemAvailable:") in bytes; `None` where it cannot be read.
fn meminfo_bytes(field: &str) -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = m.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Parses a listen address `IP:PORT` (`[v6]:PORT` for IPv6), saying what is wrong: a host name
/// (not resolved: say which address to bind), a port out of range, or a missing port.
pub fn parse_listen_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("{s:?}: expected IP:PORT, e.g. 127.0.0.1:4420 or [::1]:4420 (the port is missing)"));
    };
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?}: port {port:?} is not a number (expected IP:PORT, e.g. 127.0.0.1:4420)"));
    }
    if port.parse::<u16>().is_err() {
        return Err(format!("{s:?}: port {port} is out of range (0-65535)"));
    }
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<std::net::IpAddr>().is_ok() {
        return Err(format!("{s:?}: an IPv6 address needs brackets, e.g. [::1]:{port}"));
    }
    Err(format!("{s:?}: {host:?} is not an IP address; host names are not resolved, give the address to bind (e.g. 127.0.0.1:{port})"))
}

/// The RAM namespaces' total against `ram_limit_percent` of the available memory.
fn check_ram_namespaces(total: u64, available: u64, percent: u32) -> Result<(), String> {
    let limit = (available as u128 * percent as u128 / 100) as u64;
    if total > limit {
        return Err(format!(
            "RAM namespaces need {} but {percent} % of the available memory is {} (MemAvailable {}); \
             use smaller ram: namespaces, a null: or file: backend, or raise target.ram_limit_percent / --ram-limit-percent",
            human_bytes(total),
            human_bytes(limit),
            human_bytes(available)
        ));
    }
    Ok(())
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

impl Default for TargetSettings {
    fn default() -> Self {
        TargetSettings {
            cores: vec![0],
            mode: ReactorMode::Event,
            idle_poll_us: 0,
            in_capsule_data_size: 8192,
            maxh2cdata: 131072,
            so_priority: 0,
            tos: 0,
            busy_poll_us: 0,
            tcp_congestion: None,
            stats: None,
            control: None,
            control_allow_paths: None,
            kato_default_ms: 120_000,
            max_connections: 4096,
            max_controllers: 1024,
            buffer_memory: None,
            stall_timeout_ms: 10_000,
            ram_limit_percent: 90,
            ktls: nvmf_tls::KtlsMode::Auto,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PortConfig {
    pub addr: SocketAddr,
    /// PORTID in the discovery log; `None` = its position in the list, from 1.
    pub portid: Option<u16>,
    /// Subsystems exported on this port; `None` = all (nvmetcli configs name them per port).
    pub subsystems: Option<Vec<String>>,
    pub tls: PortTls,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SubsystemConfig {
    pub nqn: String,
    pub serial: Option<String>,
    pub model: Option<String>,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    /// Fixed reactor index for every queue of this subsystem.
    pub reactor: Option<usize>,
    pub namespaces: Vec<NamespaceConfig>,
}

impl SubsystemConfig {
    pub fn new(nqn: impl Into<String>) -> Self {
        SubsystemConfig {
            nqn: nqn.into(),
            serial: None,
            model: None,
            allow_any_host: true,
            hosts: Vec::new(),
            reactor: None,
            namespaces: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct NamespaceConfig {
    pub nsid: u32,
    pub backend: BackendConfig,
    pub block_size: u32,
    pub nguid: Option<[u8; 16]>,
    pub uuid: Option<[u8; 16]>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HostMapEntry {
    pub hostnqn: String,
    pub reactor: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}:{column}: {message}")]
    Syntax { path: PathBuf, line: usize, column: usize, message: String },
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
}

impl ConfigError {
    pub fn invalid(origin: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid { origin: origin.into(), message: message.into() }
    }
}

/// Parses the stats endpoint address: `ADDR:PORT`, or a bare `PORT` meaning loopback (the
/// endpoint is unauthenticated, so it is exposed beyond this machine only when asked).
pub fn parse_stats_addr(s: &str) -> Option<SocketAddr> {
    let s = s.trim();
    match s.parse::<u16>() {
        Ok(port) => Some(SocketAddr::from(([127, 0, 0, 1], port))),
        Err(_) => s.parse().ok(),
    }
}

/// Parses a core list: `0`, `0,2`, `1-3`, `0,4-5`.
pub fn parse_core_list(s: &str) -> Option<Vec<usize>> {
    let mut cores = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if let Some((a, b)) = part.split_once('-') {
            let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
            if a > b || b - a > 4096 {
                return None;
            }
            cores.extend(a..=b);
        } else {
            cores.push(part.parse().ok()?);
        }
    }
    (!cores.is_empty()).then_some(cores)
}

/// Parses 32 hex digits, dashes allowed (UUID form).
pub fn parse_hex16(s: &str) -> Option<[u8; 16]> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl TargetConfig {
    /// A config with default settings, no ports and no subsystems.
    pub fn empty() -> Self {
        TargetConfig {
            target: TargetSettings::default(),
            ports: Vec::new(),
            subsystems: Vec::new(),
            host_map: Vec::new(),
            hosts: Vec::new(),
            tls_keys: Vec::new(),
            rdma_ports: Vec::new(),
        }
    }

    /// Checks cross-field rules. `origin` names the source (file path or "command line").
    pub fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let bad = |msg: String| Err(ConfigError::invalid(origin, msg));
        let t = &self.target;
        if t.cores.is_empty() {
            return bad("target.cores: at least one core is needed".into());
        }
        if let Some(allowed) = allowed_cores() {
            if let Some(c) = t.cores.iter().find(|c| !allowed.contains(c)) {
                return bad(format!("target.cores: core {c} is not available to this process (it may run on {allowed:?})"));
            }
        }
        if t.in_capsule_data_size % 16 != 0 || t.in_capsule_data_size > MAX_IN_CAPSULE_DATA_SIZE {
            return bad(format!(
                "target.in_capsule_data_size = {}: must be a multiple of 16 and at most {}",
                t.in_capsule_data_size, MAX_IN_CAPSULE_DATA_SIZE
            ));
        }
        if t.maxh2cdata < 4096 || t.maxh2cdata % 4 != 0 {
            return bad(format!(
                "target.maxh2cdata = {}: must be at least 4096 and a multiple of 4 (Linux hosts refuse less)",
                t.maxh2cdata
            ));
        }
        if let Some(name) = &t.tcp_congestion {
            if !nvmf_proto::congestion::is_congestion_name(name) {
                return bad(format!(
                    "target.tcp_congestion = {name:?}: expected a kernel name such as \"cubic\" or \"bbr\" (1-15 of a-z, 0-9, _)"
                ));
            }
        }
        if t.so_priority > i32::MAX as u32 || t.tos > 255 {
            return bad("target.tos must be 0..=255 and so_priority a non-negative i32".into());
        }
        if t.max_connections == 0 || t.max_controllers == 0 || t.max_controllers > 0xFFEF {
            return bad(format!(
                "target.max_connections = {} and max_controllers = {}: both must be at least 1, controllers at most 65519",
                t.max_connections, t.max_controllers
            ));
        }
        if t.buffer_memory.is_some_and(|b| b < 2 << 20) {
            return bad("target.buffer_memory: at least 2 MiB (one command of MDTS)".into());
        }
        if self.ports.is_empty() && self.rdma_ports.is_empty() {
            return bad("no listen address: add a [[port]] or --listen".into());
        }
        let mut portids = HashSet::new();
        for (i, p) in self.rdma_ports.iter().enumerate() {
            let id = p.portid.unwrap_or((self.ports.len() + i) as u16 + 1);
            if !portids.insert(id) {
                return bad(format!("RDMA port {}: portid {id} is used twice", p.addr));
            }
            if p.tls != PortTls::None {
                return bad(format!("RDMA port {}: TLS is a NVMe/TCP feature", p.addr));
            }
        }
        for (i, p) in self.ports.iter().enumerate() {
            if !portids.insert(p.portid.unwrap_or(i as u16 + 1)) {
                return bad(format!("port[{i}] ({}): portid {} is used twice", p.addr, p.portid.unwrap_or(i as u16 + 1)));
            }
            // Two ports on one address would fail at bind as "address in use", as if another
            // process held it; port 0 (any free port) may repeat.
            if let Some(j) = self.ports[..i].iter().position(|q| q.addr == p.addr && p.addr.port() != 0) {
                return bad(format!("port[{i}] ({}): the same address as port[{j}]; give each port its own address", p.addr));
            }
        }
        if t.ram_limit_percent == 0 || t.ram_limit_percent > 100 {
            return bad(format!("target.ram_limit_percent = {}: must be 1..=100", t.ram_limit_percent));
        }
        let ram_total: u64 = self
            .subsystems
            .iter()
            .flat_map(|s| &s.namespaces)
            .map(|ns| match ns.backend {
                BackendConfig::Ram { size } | BackendConfig::Model { size, .. } => size,
                _ => 0,
            })
            .fold(0u64, u64::saturating_add);
        if ram_total > 0 {
            if let Some(available) = meminfo_bytes("MemAvailable:") {
                check_ram_namespaces(ram_total, available, t.ram_limit_percent).or_else(bad)?;
            }
        }
        let mut nqns = HashSet::new();
        for (i, s) in self.subsystems.iter().enumerate() {
            let at = format!("subsystem[{i}] ({})", s.nqn);
            if s.nqn.is_empty() || s.nqn.len() > MAX_NQN_LEN {
                return bad(format!("{at}: nqn must be 1..={MAX_NQN_LEN} bytes"));
            }
            if s.nqn == DISCOVERY_NQN {
                return bad(format!("{at}: the discovery NQN is reserved for the discovery controller"));
            }
            if !nqns.insert(s.nqn.as_str()) {
                return bad(format!("{at}: duplicate subsystem nqn"));
            }
            if let Some(r) = s.reactor {
                if r >= t.cores.len() {
                    return bad(format!("{at}: reactor = {r} but only {} cores are configured", t.cores.len()));
                }
            }
            let mut nsids = HashSet::new();
            for ns in &s.namespaces {
                let at = format!("{at} namespace nsid {}", ns.nsid);
                if ns.nsid == 0 || ns.nsid == u32::MAX {
                    return bad(format!("{at}: nsid must be 1..0xfffffffe"));
                }
                if !nsids.insert(ns.nsid) {
                    return bad(format!("{at}: duplicate nsid"));
                }
                if !ns.block_size.is_power_of_two() || !(512..=4096).contains(&ns.block_size) {
                    return bad(format!("{at}: block_size {} must be 512, 1024, 2048 or 4096", ns.block_size));
                }
                if let BackendConfig::Null { size } | BackendConfig::Ram { size } | BackendConfig::Model { size, .. } = ns.backend {
                    if size == 0 || size % ns.block_size as u64 != 0 {
                        return bad(format!(
                            "{at}: size {size} must be a non-zero multiple of the block size {}",
                            ns.block_size
                        ));
                    }
                }
            }
        }
        for p in &self.ports {
            for nqn in p.subsystems.iter().flatten() {
                if !nqns.contains(nqn.as_str()) {
                    return bad(format!("port {}: unknown subsystem {nqn}", p.addr));
                }
            }
        }
        for h in &self.host_map {
            if h.reactor >= t.cores.len() {
                return bad(format!(
                    "host_map {}: reactor = {} but only {} cores are configured",
                    h.hostnqn,
                    h.reactor,
                    t.cores.len()
                ));
            }
        }
        let mut host_nqns = HashSet::new();
        for h in &self.hosts {
            if !host_nqns.insert(h.nqn.as_str()) {
                return bad(format!("host {}: DH-HMAC-CHAP keys are given twice", h.nqn));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
