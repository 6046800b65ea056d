//! The one-line command line (CONTRACTS.md section 2). Flags given together with `--config` or
//! `--nvmetcli` override the file's settings; `--ns` adds a subsystem named by `--nqn`.

use super::{
    parse_core_list, parse_size, BackendConfig, ConfigError, HostMapEntry, NamespaceConfig, PortConfig,
    ReactorMode, SubsystemConfig, TargetConfig, DEFAULT_NQN,
};
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser, Debug, Default)]
#[command(name = "nvmf-target", version, about = "Userspace NVMe/TCP target")]
pub struct Cli {
    /// TOML config file
    #[arg(long, conflicts_with = "nvmetcli")]
    pub config: Option<PathBuf>,
    /// Linux `nvmetcli save` JSON file
    #[arg(long)]
    pub nvmetcli: Option<PathBuf>,
    /// Listen address, repeatable (default 127.0.0.1:4420)
    #[arg(long)]
    pub listen: Vec<String>,
    /// Subsystem NQN for --ns
    #[arg(long)]
    pub nqn: Option<String>,
    /// Namespace: null:SIZE | ram:SIZE | file:PATH (repeatable; nsid 1, 2, ...)
    #[arg(long)]
    pub ns: Vec<String>,
    /// Host NQN allowed to connect to the --nqn subsystem (repeatable; default any host)
    #[arg(long = "allow-host")]
    pub allow_host: Vec<String>,
    /// Reactor cores, e.g. 0 or 0,2 or 1-3
    #[arg(long)]
    pub cores: Option<String>,
    /// Reactor mode: poll or event
    #[arg(long)]
    pub mode: Option<String>,
    #[arg(long = "idle-poll-us")]
    pub idle_poll_us: Option<u64>,
    /// KEY=IDX with KEY = subsys:NQN or host:NQN; IDX indexes --cores
    #[arg(long = "reactor-map")]
    pub reactor_map: Vec<String>,
    #[arg(long = "in-capsule-data-size")]
    pub in_capsule_data_size: Option<u32>,
    #[arg(long)]
    pub maxh2cdata: Option<u32>,
    #[arg(long = "so-priority")]
    pub so_priority: Option<u32>,
    #[arg(long)]
    pub tos: Option<u32>,
    #[arg(long = "busy-poll-us")]
    pub busy_poll_us: Option<u32>,
    /// TCP congestion control of every connection (e.g. cubic); default: the system's
    #[arg(long = "tcp-congestion")]
    pub tcp_congestion: Option<String>,
    /// Stats HTTP endpoint ADDR:PORT, or PORT alone for loopback (unauthenticated: bind a
    /// non-loopback address only on a trusted network)
    #[arg(long)]
    pub stats: Option<String>,
    /// Unix socket for runtime changes (hosts, keys, subsystems, namespaces): docs/control.md
    #[arg(long)]
    pub control: Option<std::path::PathBuf>,
    /// A directory whose files add_namespace may open, repeatable (default: the directories of
    /// the configured file namespaces); overrides the config file's [control] allow_paths
    #[arg(long = "control-allow-path")]
    pub control_allow_path: Vec<std::path::PathBuf>,
    /// Most TCP connections open at once; one more is closed as soon as it is accepted
    #[arg(long = "max-connections")]
    pub max_connections: Option<u32>,
    /// Most controllers at once; one more Connect gets Connect Controller Busy
    #[arg(long = "max-controllers")]
    pub max_controllers: Option<u32>,
    /// Command data buffers and queued output of all connections together, e.g. 2GiB (default:
    /// a quarter of RAM)
    #[arg(long = "buffer-memory")]
    pub buffer_memory: Option<String>,
    /// Drop a connection stalled mid-PDU (or not reading, or not answering an R2T) this long; 0 = never
    #[arg(long = "stall-timeout-ms")]
    pub stall_timeout_ms: Option<u64>,
    /// RAM namespaces together may take at most this percentage of available memory (default 90)
    #[arg(long = "ram-limit-percent")]
    pub ram_limit_percent: Option<u32>,
    /// Block size of --ns namespaces: 512 or 4096
    #[arg(long = "block-size")]
    pub block_size: Option<u32>,
    /// TLS 1.3 on the --listen ports (all ports when none is given): none, allowed or required
    #[arg(long)]
    pub tls: Option<String>,
    /// HOSTNQN=KEY: the host's TLS PSK in the interchange format (NVMeTLSkey-1:HH:...:), repeatable
    #[arg(long = "tls-key")]
    pub tls_key: Vec<String>,
    /// TLS records in the kernel (kTLS): auto (when the kernel has it, else userspace), on (fail
    /// without it), off
    #[arg(long)]
    pub ktls: Option<String>,
}

const ORIGIN: &str = "command line";

fn bad(msg: String) -> ConfigError {
    ConfigError::invalid(ORIGIN, msg)
}

fn addr(s: &str, flag: &str) -> Result<SocketAddr, ConfigError> {
    super::parse_listen_addr(s).map_err(|e| bad(format!("{flag} {e}")))
}

impl Cli {
    /// Builds the config: file first (if any), then flags on top.
    pub fn into_config(self) -> Result<TargetConfig, ConfigError> {
        let from_file = self.config.is_some() || self.nvmetcli.is_some();
        let mut c = match (&self.config, &self.nvmetcli) {
            (Some(p), _) => super::toml::load(p)?,
            (None, Some(p)) => super::nvmetcli::load(p)?,
            (None, None) => TargetConfig::empty(),
        };
        let t = &mut c.target;
        if let Some(s) = &self.cores {
            t.cores = parse_core_list(s).ok_or_else(|| bad(format!("--cores {s:?}: expected e.g. 0 or 0,2 or 1-3")))?;
        }
        if let Some(m) = &self.mode {
            t.mode = ReactorMode::parse(m).ok_or_else(|| bad(format!("--mode {m:?}: expected poll or event")))?;
        }
        macro_rules! take {
            ($($f:ident),*) => { $(if let Some(v) = self.$f { t.$f = v; })* };
        }
        take!(idle_poll_us, in_capsule_data_size, maxh2cdata, so_priority, tos, busy_poll_us);
        take!(max_connections, max_controllers, stall_timeout_ms, ram_limit_percent);
        if let Some(name) = &self.tcp_congestion {
            t.tcp_congestion = Some(name.clone());
        }
        if let Some(s) = &self.stats {
            let parsed = super::parse_stats_addr(s);
            t.stats = Some(parsed.ok_or_else(|| bad(format!("--stats {s:?}: expected ADDR:PORT or PORT (loopback)")))?);
        }
        if !self.control_allow_path.is_empty() {
            t.control_allow_paths = Some(self.control_allow_path.clone());
        }
        if let Some(p) = &self.control {
            t.control = Some(p.clone());
        }
        if let Some(k) = &self.ktls {
            t.ktls = nvmf_tls::KtlsMode::parse(k).ok_or_else(|| bad(format!("--ktls {k:?}: expected auto, on or off")))?;
        }
        if let Some(s) = &self.buffer_memory {
            t.buffer_memory = Some(parse_size(s).ok_or_else(|| bad(format!("--buffer-memory {s:?}: expected a size like 2GiB")))?);
        }
        if !self.listen.is_empty() {
            let port = |l: &str| Ok(PortConfig { addr: addr(l, "--listen")?, portid: None, subsystems: None, tls: Default::default() });
            let rdma = |l: &&String| l.starts_with("rdma:");
            c.ports = self.listen.iter().filter(|l| !rdma(l)).map(|l| port(l.strip_prefix("tcp:").unwrap_or(l))).collect::<Result<_, ConfigError>>()?;
            c.rdma_ports = self.listen.iter().filter(rdma).map(|l| port(&l["rdma:".len()..])).collect::<Result<_, ConfigError>>()?;
        } else if c.ports.is_empty() && c.rdma_ports.is_empty() {
            c.ports.push(PortConfig { addr: "127.0.0.1:4420".parse().expect("literal"), portid: None, subsystems: None, tls: Default::default() });
        }
        if let Some(m) = &self.tls {
            let tls = super::PortTls::parse(m)
                .ok_or_else(|| bad(format!("--tls {m:?}: expected none, allowed or required")))?;
            for p in &mut c.ports {
                p.tls = tls;
            }
        }
        for spec in &self.tls_key {
            let (nqn, key) = spec
                .split_once('=')
                .ok_or_else(|| bad(format!("--tls-key {spec:.20}...: expected HOSTNQN=NVMeTLSkey-1:HH:...:")))?;
            let key = nvmf_tls::ConfiguredPsk::parse(key).map_err(|e| bad(format!("--tls-key {nqn}=...: {e}")))?;
            c.tls_keys.retain(|k| k.nqn != nqn);
            c.tls_keys.push(super::HostTlsKey { nqn: nqn.to_string(), key });
        }
        let block_size = self.block_size.unwrap_or(512);
        if !self.ns.is_empty() || (!from_file && c.subsystems.is_empty()) || self.nqn.is_some() {
            let mut sub = SubsystemConfig::new(self.nqn.clone().unwrap_or_else(|| DEFAULT_NQN.to_string()));
            for (i, spec) in self.ns.iter().enumerate() {
                let (kind, arg) = spec
                    .split_once(':')
                    .ok_or_else(|| bad(format!("--ns {spec:?}: expected null:SIZE, ram:SIZE, model:SIZE[,lat=..,par=..,bw=..] or file:PATH")))?;
                let size = || parse_size(arg).ok_or_else(|| bad(format!("--ns {spec:?}: bad size {arg:?}")));
                let backend = match kind {
                    "null" => BackendConfig::Null { size: size()? },
                    "ram" => BackendConfig::Ram { size: size()? },
                    "file" => BackendConfig::File { path: arg.into() },
                    "model" => {
                        let (size_text, params) = arg.split_once(',').unwrap_or((arg, ""));
                        let size = parse_size(size_text).ok_or_else(|| bad(format!("--ns {spec:?}: bad size {size_text:?}")))?;
                        let params = crate::backend::ModelParams::parse(params).map_err(|e| bad(format!("--ns {spec:?}: {e}")))?;
                        BackendConfig::Model { size, params }
                    }
                    _ => return Err(bad(format!("--ns {spec:?}: backend must be null, ram, model or file"))),
                };
                sub.namespaces.push(NamespaceConfig { nsid: i as u32 + 1, backend, block_size, nguid: None, uuid: None });
            }
            if !self.allow_host.is_empty() {
                sub.allow_any_host = false;
                sub.hosts = self.allow_host.clone();
            }
            c.subsystems.retain(|s| s.nqn != sub.nqn);
            c.subsystems.push(sub);
        }
        for entry in &self.reactor_map {
            let (key, idx) = entry
                .rsplit_once('=')
                .ok_or_else(|| bad(format!("--reactor-map {entry:?}: expected subsys:NQN=IDX or host:NQN=IDX")))?;
            let idx: usize = idx.parse().map_err(|_| bad(format!("--reactor-map {entry:?}: IDX must be a number")))?;
            if let Some(nqn) = key.strip_prefix("subsys:") {
                let sub = c
                    .subsystems
                    .iter_mut()
                    .find(|s| s.nqn == nqn)
                    .ok_or_else(|| bad(format!("--reactor-map {entry:?}: no subsystem {nqn}")))?;
                sub.reactor = Some(idx);
            } else if let Some(nqn) = key.strip_prefix("host:") {
                c.host_map.push(HostMapEntry { hostnqn: nqn.to_string(), reactor: idx });
            } else {
                return Err(bad(format!("--reactor-map {entry:?}: KEY must start with subsys: or host:")));
            }
        }
        c.validate(self.config.as_deref().or(self.nvmetcli.as_deref()).map(|p| p.to_string_lossy()).as_deref().unwrap_or(ORIGIN))?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Result<TargetConfig, ConfigError> {
        let mut v = vec!["nvmf-target"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap().into_config()
    }

    #[test]
    fn tls_flags() {
        let key = "NVMeTLSkey-1:01:VRLbtnN9AQb2WXW3c9+wEf/DRLz0QuLdbYvEhwtdWwNf9LrZ:";
        let c = cli(&["--listen", "127.0.0.1:4420", "--listen", "127.0.0.1:4421", "--tls", "required", "--tls-key", &format!("nqn.h={key}")])
            .unwrap();
        assert!(c.ports.iter().all(|p| p.tls == super::super::PortTls::Required));
        assert_eq!(c.tls_keys[0].nqn, "nqn.h");
        assert!(cli(&["--tls", "sometimes"]).unwrap_err().to_string().contains("--tls"));
        assert_eq!(cli(&["--ktls", "on"]).unwrap().target.ktls, nvmf_tls::KtlsMode::On);
        assert_eq!(cli(&[]).unwrap().target.ktls, nvmf_tls::KtlsMode::Auto);
        assert!(cli(&["--ktls", "maybe"]).unwrap_err().to_string().contains("--ktls \"maybe\": expected auto, on or off"));
        assert!(cli(&["--tls-key", key]).unwrap_err().to_string().contains("HOSTNQN="));
        let e = cli(&["--tls-key", "nqn.h=NVMeTLSkey-1:01:AAAA:"]).unwrap_err().to_string();
        assert!(e.contains("--tls-key nqn.h=") && !e.contains("AAAA"), "{e}");
    }

    #[test]
    fn tcp_congestion_is_taken_and_its_name_checked() {
        assert_eq!(cli(&[]).unwrap().target.tcp_congestion, None, "the machine's unless told");
        assert_eq!(cli(&["--tcp-congestion", "cubic"]).unwrap().target.tcp_congestion.as_deref(), Some("cubic"));
        for bad in ["Cubic", "cubic reno", "", "a_name_of_16_byt"] {
            let e = cli(&["--tcp-congestion", bad]).unwrap_err().to_string();
            assert!(e.contains("target.tcp_congestion") && e.contains("kernel name"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn one_line_demo() {
        let c = cli(&["--listen", "127.0.0.1:4420", "--nqn", "nqn.2024-01.io.nvmflab:demo", "--ns", "ram:1GiB"]).unwrap();
        assert_eq!(c.ports[0].addr, "127.0.0.1:4420".parse().unwrap());
        assert_eq!(c.subsystems.len(), 1);
        assert_eq!(c.subsystems[0].nqn, "nqn.2024-01.io.nvmflab:demo");
        assert_eq!(c.subsystems[0].namespaces[0].backend, BackendConfig::Ram { size: 1 << 30 });
        assert!(c.subsystems[0].allow_any_host);
    }

    #[test]
    fn model_namespaces_take_size_then_parameters() {
        let c = cli(&["--ns", "model:64m,lat=20us,par=4,bw=1GiB"]).unwrap();
        let want = crate::backend::ModelParams { latency_ns: 20_000, parallelism: 4, bandwidth: Some(1 << 30) };
        assert_eq!(c.subsystems[0].namespaces[0].backend, BackendConfig::Model { size: 64 << 20, params: want });
        let plain = cli(&["--ns", "model:64m"]).unwrap();
        assert_eq!(plain.subsystems[0].namespaces[0].backend, BackendConfig::Model { size: 64 << 20, params: Default::default() });
        let e = cli(&["--ns", "model:64m,par=0"]).unwrap_err().to_string();
        assert!(e.contains("par=0") && e.contains("parallelism"), "{e}");
    }

    #[test]
    fn defaults_and_maps() {
        let c = cli(&[
            "--ns", "null:1g", "--ns", "ram:1m", "--cores", "0-1", "--mode", "poll", "--allow-host", "nqn.h",
            "--reactor-map", "subsys:nqn.2024-01.io.nvmflab:default=1", "--reactor-map", "host:nqn.h=0",
        ])
        .unwrap();
        assert_eq!(c.ports[0].addr, "127.0.0.1:4420".parse().unwrap());
        assert_eq!(c.target.cores, vec![0, 1]);
        assert_eq!(c.target.mode, ReactorMode::Poll);
        let s = &c.subsystems[0];
        assert_eq!(s.namespaces[1].nsid, 2);
        assert!(!s.allow_any_host);
        assert_eq!(s.reactor, Some(1));
        assert_eq!(c.host_map[0], HostMapEntry { hostnqn: "nqn.h".into(), reactor: 0 });
    }

    #[test]
    fn limits_and_a_loopback_stats_port() {
        let c = cli(&["--stats", "9100", "--max-connections", "10", "--max-controllers", "3", "--buffer-memory", "64MiB",
            "--stall-timeout-ms", "500"])
        .unwrap();
        assert_eq!(c.target.stats, Some("127.0.0.1:9100".parse().unwrap()), "a bare port is loopback");
        assert_eq!((c.target.max_connections, c.target.max_controllers), (10, 3));
        assert_eq!(c.target.buffer_memory_bytes(), 64 << 20);
        assert_eq!(c.target.stall_timeout_ms, 500);
        let d = cli(&[]).unwrap();
        assert!(d.target.buffer_memory_bytes() >= 256 << 20, "default sized to the machine");
        let e = cli(&["--max-controllers", "0"]).unwrap_err().to_string();
        assert!(e.contains("max_controllers"), "{e}");
        let e = cli(&["--buffer-memory", "lots"]).unwrap_err().to_string();
        assert!(e.contains("--buffer-memory"), "{e}");
    }

    #[test]
    fn bad_flags_say_which() {
        let e = cli(&["--ns", "disk:1g"]).unwrap_err().to_string();
        assert!(e.contains("--ns"), "{e}");
        let e = cli(&["--listen", "localhost"]).unwrap_err().to_string();
        assert!(e.contains("--listen"), "{e}");
        let e = cli(&["--reactor-map", "host:x=5"]).unwrap_err().to_string();
        assert!(e.contains("reactor = 5"), "{e}");
    }
}
