//! Userspace NVMe/TCP target. See README.md.
//!
//! `start(config)` binds the listeners, opens the namespaces, starts one reactor thread per
//! configured core, the acceptor and (optionally) the stats endpoint, and returns a
//! [`RunningTarget`] that reports the real addresses (port 0 binds an ephemeral port).

pub mod admin;
pub mod auth;
pub mod backend;
pub mod capabilities;
pub mod command;
pub mod config;
pub mod control;
pub mod core;
pub mod discovery;
pub mod fabrics;
pub mod io;
pub mod port_stats;
pub mod reactor;
pub mod stats;
pub mod transport;
pub mod units;
pub mod wire;

pub use config::{ConfigError, TargetConfig};

use crate::config::PortConfig;
use crate::reactor::{Acceptor, Placement, Reactor, SocketOptions};
use crate::stats::StatsRegistry;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("{0}")]
    Backend(#[from] backend::BackendError),
    #[error("{0}")]
    Stats(String),
    #[error("{0}")]
    Control(String),
    #[error("TLS set-up failed: {0}")]
    Tls(String),
    /// `--ktls on` on a kernel without kTLS.
    #[error("--ktls on (target.ktls = \"on\"), but {0}; use --ktls auto or off for TLS records in userspace")]
    NoKtls(String),
    /// `target.tcp_congestion` names one the kernel does not have or does not allow.
    #[error("target.tcp_congestion = {name:?} refused ({source}); this machine allows: {allowed}")]
    Congestion { name: String, source: std::io::Error, allowed: String },
    #[error("cannot start thread: {0}")]
    Thread(std::io::Error),
    #[error("an RDMA port ({0}) was asked for, but this nvmf-target was built without RDMA: rebuild it with `cargo build --release -p nvmf-target --features rdma`, which needs rdma-core's librdmacm-dev and libibverbs-dev")]
    NoRdma(SocketAddr),
    #[error("cannot listen for NVMe/RDMA on {addr}: {source} (is there an RDMA device, e.g. rxe, on that address?)")]
    RdmaListen { addr: SocketAddr, source: std::io::Error },
}

impl StartError {
    /// Errors in what the user asked for (exit status 2) rather than in the environment.
    pub fn is_config_error(&self) -> bool {
        matches!(
            self,
            StartError::Config(_) | StartError::Backend(_) | StartError::NoRdma(_) | StartError::NoKtls(_) | StartError::Congestion { .. }
        )
    }

    fn congestion(name: &str, source: std::io::Error) -> StartError {
        StartError::Congestion { name: name.to_string(), source, allowed: nvmf_proto::sockopts::allowed_congestion_controls() }
    }
}

pub struct RunningTarget {
    listen_addrs: Vec<SocketAddr>,
    rdma_addrs: Vec<SocketAddr>,
    stats_addr: Option<SocketAddr>,
    stop: Arc<AtomicBool>,
    wakers: Vec<Arc<mio::Waker>>,
    threads: Vec<JoinHandle<()>>,
    stats: Arc<StatsRegistry>,
    control: Arc<control::Control>,
}

impl RunningTarget {
    /// The runtime control surface (also served on `[target] control` when configured).
    pub fn control(&self) -> &Arc<control::Control> {
        &self.control
    }

    /// The bound listen addresses, in configuration order.
    pub fn listen_addrs(&self) -> &[SocketAddr] {
        &self.listen_addrs
    }

    pub fn stats_addr(&self) -> Option<SocketAddr> {
        self.stats_addr
    }

    /// Counters as served by `/stats` (for in-process tests).
    pub fn stats_json(&self) -> serde_json::Value {
        self.stats.json()
    }

    /// The `ready ...` line the binary prints.
    pub fn ready_line(&self) -> String {
        let listen: Vec<String> = self.listen_addrs.iter().map(|a| a.to_string()).collect();
        let stats = self.stats_addr.map_or("none".to_string(), |a| a.to_string());
        let tls: Vec<String> = self.stats.ports.iter().filter(|p| p.transport == transport::TransportKind::Tcp).map(|p| p.tls_description()).collect();
        let mut line = format!("ready listen={} stats={} tls={}", listen.join(","), stats, tls.join(","));
        if !self.rdma_addrs.is_empty() {
            let rdma: Vec<String> = self.rdma_addrs.iter().map(|a| a.to_string()).collect();
            line += &format!(" rdma={}", rdma.join(","));
        }
        line
    }

    /// Stops every thread after closing all connections.
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, Relaxed);
        for w in &self.wakers {
            let _ = w.wake();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for RunningTarget {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// Buffer alignment of a target whose namespaces may change at run time.
const RUNTIME_NAMESPACE_ALIGN: usize = 4096;

/// Starts a target. The config is validated again here (it may have been built in code).
pub fn start(config: TargetConfig) -> Result<RunningTarget, StartError> {
    config.validate("config")?;
    #[cfg(not(feature = "rdma"))]
    if let Some(p) = config.rdma_ports.first() {
        return Err(StartError::NoRdma(p.addr));
    }
    let mut listeners = Vec::new();
    let mut bound = Vec::new();
    for p in &config.ports {
        let l = std::net::TcpListener::bind(p.addr).map_err(|source| StartError::Listen { addr: p.addr, source })?;
        l.set_nonblocking(true).map_err(|source| StartError::Listen { addr: p.addr, source })?;
        if let Some(name) = &config.target.tcp_congestion {
            reactor::set_congestion_control(l.as_raw_fd(), name).map_err(|e| StartError::congestion(name, e))?;
        }
        let addr = l.local_addr().map_err(|source| StartError::Listen { addr: p.addr, source })?;
        bound.push(PortConfig { addr, ..p.clone() });
        listeners.push(mio::net::TcpListener::from_std(l));
    }
    let mut target = core::Target::new(config.target.clone(), &config.subsystems, &bound)?.with_host_auth(&config.hosts);
    target.ports.extend(config.rdma_ports.iter().enumerate().map(|(i, p)| core::Port {
        portid: p.portid.unwrap_or((bound.len() + i) as u16 + 1),
        addr: p.addr,
        subsystems: p.subsystems.clone(),
        tls: p.tls,
        tls_stats: Default::default(),
        transport: transport::TransportKind::Rdma,
    }));
    if config.target.control.is_some() {
        // A file namespace added at run time reads with O_DIRECT: buffers aligned for any
        // device's logical block (at most a page) from the start, as they cannot change later.
        target.buffer_align = target.buffer_align.max(RUNTIME_NAMESPACE_ALIGN);
    }
    let target = Arc::new(target);
    let stop = Arc::new(AtomicBool::new(false));
    let t = &config.target;
    let mut handles = Vec::new();
    let mut threads = Vec::new();
    let mut reactor_stats = Vec::new();
    let mut wakers = Vec::new();
    let guard = StopGuard { stop: stop.clone() };
    for (i, &core) in t.cores.iter().enumerate() {
        let (reactor, handle) = Reactor::new(i, core, t.mode, t.idle_poll_us, stop.clone()).map_err(StartError::Thread)?;
        reactor_stats.push(reactor.stats.clone());
        wakers.push(handle.waker.clone());
        handles.push(handle);
        threads.push(
            std::thread::Builder::new()
                .name(format!("nvmf-reactor-{i}"))
                .spawn(move || reactor.run())
                .map_err(StartError::Thread)?,
        );
    }
    let registry = Arc::new(StatsRegistry {
        start: Instant::now(),
        reactors: reactor_stats,
        ports: target.ports.clone(),
        buffers: target.buffers.clone(),
    });
    let stats_addr = match t.stats {
        Some(addr) => {
            let server = stats::serve(addr, registry.clone(), stop.clone()).map_err(StartError::Stats)?;
            threads.push(server.thread);
            Some(server.addr)
        }
        None => None,
    };
    let control = Arc::new(control::Control::new(target.clone(), config.clone()));
    if let Some(path) = &t.control {
        threads.push(control::socket::serve(path, control.clone(), stop.clone()).map_err(StartError::Control)?);
    }
    let placement = Arc::new(Placement::new(&config));
    let rdma_addrs = start_rdma(&target, &handles, &placement, &stop, &mut threads)?;
    let ports = target.ports.clone();
    let tls_config = tls_server_config(&config, &ports)?;
    let acceptor = Acceptor {
        tls_config,
        target: target.clone(),
        listeners: listeners.into_iter().zip(ports).collect(),
        reactors: handles,
        placement,
        sockopts: SocketOptions {
            so_priority: t.so_priority,
            tos: t.tos,
            busy_poll_us: t.busy_poll_us,
            tcp_congestion: t.tcp_congestion.clone(),
        },
        stop: stop.clone(),
    };
    threads.push(transport::spawn_acceptor(acceptor).map_err(StartError::Thread)?);
    std::mem::forget(guard);
    let listen_addrs = bound.iter().map(|p| p.addr).collect();
    Ok(RunningTarget { listen_addrs, rdma_addrs, stats_addr, stop, wakers, threads, stats: registry, control })
}

/// The TLS setup of a target with a TLS port: the TLS PSK for an identity naming a configured
/// host (`tls_keys`) and a configured subsystem (or the discovery subsystem) is derived from that
/// host's key; the records go to the kernel as `target.ktls` says, `auto` finding out here
/// whether the kernel has kTLS. None when no port allows TLS.
fn tls_server_config(config: &TargetConfig, ports: &[core::Port]) -> Result<Option<wire::TlsSetup>, StartError> {
    if config.ports.iter().all(|p| p.tls == config::PortTls::None) {
        if !config.tls_keys.is_empty() {
            // A key does not turn TLS on (docs/tls.md): say so, rather than leave it unused unseen.
            tracing::warn!(
                "TLS keys are configured for {} host(s) but no port takes TLS, so they are not used: add --tls allowed or required ([[port]] tls)",
                config.tls_keys.len()
            );
        }
        return Ok(None);
    }
    let ktls = match (config.target.ktls, nvmf_tls::ktls::probe()) {
        (nvmf_tls::KtlsMode::Off, _) => nvmf_tls::KtlsMode::Off,
        (nvmf_tls::KtlsMode::On, Err(why)) => return Err(StartError::NoKtls(why)),
        (nvmf_tls::KtlsMode::Auto, Err(why)) => {
            tracing::info!("TLS records in userspace: {why}");
            nvmf_tls::KtlsMode::Off
        }
        (mode, Ok(())) => mode,
    };
    for p in ports.iter().filter(|p| p.transport == transport::TransportKind::Tcp && p.tls != config::PortTls::None) {
        p.tls_stats.kernel_records.store(ktls != nvmf_tls::KtlsMode::Off, Relaxed);
    }
    if config.tls_keys.is_empty() {
        tracing::warn!("a port allows TLS but no host has a TLS key: every TLS handshake will fail");
    }
    let mut subnqns: Vec<String> = config.subsystems.iter().map(|s| s.nqn.clone()).collect();
    subnqns.push(config::DISCOVERY_NQN.to_string());
    let hosts = config.tls_keys.iter().map(|k| (k.nqn.clone(), k.key.clone())).collect();
    let server = nvmf_tls::ServerConfig::for_subsystems(subnqns, hosts, false).map_err(|e| StartError::Tls(e.to_string()))?;
    Ok(Some(wire::TlsSetup { config: Arc::new(server), ktls }))
}

/// Binds every RDMA port and starts the RDMA CM acceptor thread, which hands each queue past
/// Connect to the reactor `placement` picks, as the TCP acceptor does; returns the bound
/// addresses. No thread without an RDMA port.
#[cfg(feature = "rdma")]
fn start_rdma(
    target: &Arc<core::Target>,
    reactors: &[reactor::ReactorHandle],
    placement: &Arc<Placement>,
    stop: &Arc<AtomicBool>,
    threads: &mut Vec<JoinHandle<()>>,
) -> Result<Vec<SocketAddr>, StartError> {
    let mut listeners = Vec::new();
    for port in target.ports.iter().filter(|p| p.transport == transport::TransportKind::Rdma) {
        let l = transport::rdma::RdmaListener::bind(port.clone()).map_err(|source| StartError::RdmaListen { addr: port.addr, source })?;
        listeners.push(l);
    }
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.port.addr).collect();
    if !listeners.is_empty() {
        let acceptor = reactor::RdmaAcceptor::new(target.clone(), listeners, reactors.to_vec(), placement.clone(), stop.clone());
        threads.push(transport::spawn_acceptor(acceptor).map_err(StartError::Thread)?);
    }
    Ok(addrs)
}

/// Without the `rdma` feature `start` has refused RDMA ports already.
#[cfg(not(feature = "rdma"))]
fn start_rdma(
    _: &Arc<core::Target>,
    _: &[reactor::ReactorHandle],
    _: &Arc<Placement>,
    _: &Arc<AtomicBool>,
    _: &mut Vec<JoinHandle<()>>,
) -> Result<Vec<SocketAddr>, StartError> {
    Ok(Vec::new())
}

/// Stops already started threads when `start` fails half way.
struct StopGuard {
    stop: Arc<AtomicBool>,
}

impl Drop for StopGuard {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}
