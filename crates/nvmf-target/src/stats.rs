//! Counters published by reactors and served over HTTP (`/metrics` Prometheus text, `/stats`
//! JSON, CONTRACTS.md section 2). Each counter has one writer (the reactor owning the queue), so
//! bumping it is a relaxed load and store; readers take snapshots. The registries behind mutexes
//! are touched only when a queue connects and when the endpoint is read, never per I/O.

use crate::capabilities::TransportKind;
use crate::config::ReactorMode;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A single-writer counter.
#[derive(Default, Debug)]
pub struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

#[derive(Debug)]
pub struct QueueStats {
    pub subnqn: String,
    pub hostnqn: String,
    pub cntlid: u16,
    pub qid: u16,
    pub connected: AtomicBool,
    /// The queue's transport: a reactor serves queues of every transport.
    pub transport: TransportKind,
    pub commands: Counter,
    pub read: Counter,
    pub write: Counter,
    pub flush: Counter,
    pub write_zeroes: Counter,
    pub dsm: Counter,
    pub admin: Counter,
    pub fabrics: Counter,
    pub bytes_read: Counter,
    pub bytes_written: Counter,
}

impl QueueStats {
    pub fn new(subnqn: &str, hostnqn: &str, cntlid: u16, qid: u16, transport: TransportKind) -> QueueStats {
        QueueStats {
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
            cntlid,
            qid,
            connected: AtomicBool::new(true),
            transport,
            commands: Counter::default(),
            read: Counter::default(),
            write: Counter::default(),
            flush: Counter::default(),
            write_zeroes: Counter::default(),
            dsm: Counter::default(),
            admin: Counter::default(),
            fabrics: Counter::default(),
            bytes_read: Counter::default(),
            bytes_written: Counter::default(),
        }
    }
}

#[derive(Debug)]
pub struct NsStats {
    pub subnqn: String,
    pub nsid: u32,
    pub commands: Counter,
    pub reads: Counter,
    pub writes: Counter,
    pub other: Counter,
    pub bytes_read: Counter,
    pub bytes_written: Counter,
}

#[derive(Debug)]
pub struct ReactorStats {
    pub index: usize,
    /// The core the thread is pinned to.
    pub core: usize,
    pub mode: ReactorMode,
    pub idle_poll_us: u64,
    pub busy_ns: Counter,
    pub idle_ns: Counter,
    pub wakeups: Counter,
    /// Commands of queues dropped from `queues` (see [`MAX_IDLE_CLOSED_QUEUES`]), so that the
    /// reactor's totals stay cumulative.
    retired_commands: AtomicU64,
    queues: Mutex<Vec<Arc<QueueStats>>>,
    namespaces: Mutex<Vec<Arc<NsStats>>>,
}

impl ReactorStats {
    pub fn new(index: usize, core: usize, mode: ReactorMode, idle_poll_us: u64) -> ReactorStats {
        ReactorStats {
            index,
            core,
            mode,
            idle_poll_us,
            busy_ns: Counter::default(),
            idle_ns: Counter::default(),
            wakeups: Counter::default(),
            retired_commands: AtomicU64::new(0),
            queues: Mutex::new(Vec::new()),
            namespaces: Mutex::new(Vec::new()),
        }
    }

    /// Records a queue now served by this reactor (at connection hand-off). Closed queues stay
    /// listed (their counters are cumulative), except closed queues that never did I/O beyond
    /// [`MAX_IDLE_CLOSED_QUEUES`]: a churn of connections (a flood, discovery polling) would
    /// otherwise grow the list without bound.
    pub fn add_queue(&self, q: Arc<QueueStats>) {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        queues.push(q);
        let idle_closed = |q: &QueueStats| !q.connected.load(Relaxed) && q.bytes_read.get() + q.bytes_written.get() == 0
            && q.read.get() + q.write.get() + q.flush.get() + q.write_zeroes.get() + q.dsm.get() == 0;
        let count = queues.iter().filter(|q| idle_closed(q)).count();
        if count > MAX_IDLE_CLOSED_QUEUES {
            // Drop the oldest half of the excess at once: the scan then runs rarely.
            let mut drop = count - MAX_IDLE_CLOSED_QUEUES / 2;
            queues.retain(|q| {
                if drop > 0 && idle_closed(q) {
                    drop -= 1;
                    self.retired_commands.fetch_add(q.commands.get(), Relaxed);
                    return false;
                }
                true
            });
        }
    }

    /// This reactor's counters for a namespace, created on first use.
    pub fn namespace(&self, subnqn: &str, nsid: u32) -> Arc<NsStats> {
        let mut list = self.namespaces.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = list.iter().find(|n| n.nsid == nsid && n.subnqn == subnqn) {
            return n.clone();
        }
        let n = Arc::new(NsStats {
            subnqn: subnqn.into(),
            nsid,
            commands: Counter::default(),
            reads: Counter::default(),
            writes: Counter::default(),
            other: Counter::default(),
            bytes_read: Counter::default(),
            bytes_written: Counter::default(),
        });
        list.push(n.clone());
        n
    }

    fn queues(&self) -> Vec<Arc<QueueStats>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn namespaces(&self) -> Vec<Arc<NsStats>> {
        self.namespaces.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Closed queues without I/O kept in the listing, per reactor.
pub const MAX_IDLE_CLOSED_QUEUES: usize = 1024;

pub struct StatsRegistry {
    pub start: Instant,
    pub reactors: Vec<Arc<ReactorStats>>,
    /// Listening ports: their TLS setting and counters.
    pub ports: Vec<crate::core::Port>,
    /// The process-wide cap on command data buffers (`buffer_memory`), TCP and RDMA alike, which
    /// a TCP connection's queued output beyond 64 KiB also counts against.
    pub buffers: Arc<crate::backend::MemoryBudget>,
}

impl StatsRegistry {
    pub fn json(&self) -> Value {
        let reactors: Vec<Value> = self
            .reactors
            .iter()
            .map(|r| {
                let queues = r.queues();
                let sum = |f: fn(&QueueStats) -> u64| queues.iter().map(|q| f(q)).sum::<u64>();
                json!({
                    "index": r.index, "core": r.core, "mode": r.mode.as_str(), "idle_poll_us": r.idle_poll_us,
                    "busy_ns": r.busy_ns.get(), "idle_ns": r.idle_ns.get(), "wakeups": r.wakeups.get(),
                    "commands": sum(|q| q.commands.get()) + r.retired_commands.load(Relaxed),
                    "bytes_read": sum(|q| q.bytes_read.get()),
                    "bytes_written": sum(|q| q.bytes_written.get()),
                    "namespaces": r.namespaces().iter().map(|n| json!({
                        "subnqn": n.subnqn, "nsid": n.nsid, "commands": n.commands.get(),
                        "reads": n.reads.get(), "writes": n.writes.get(), "other": n.other.get(),
                        "bytes_read": n.bytes_read.get(), "bytes_written": n.bytes_written.get(),
                    })).collect::<Vec<_>>(),
                    "queues": queues.iter().map(|q| json!({
                        "subnqn": q.subnqn, "hostnqn": q.hostnqn, "cntlid": q.cntlid, "qid": q.qid,
                        "connected": q.connected.load(Relaxed),
                        "transport": q.transport.name(), "commands": q.commands.get(),
                        "by_opcode": {
                            "read": q.read.get(), "write": q.write.get(), "flush": q.flush.get(),
                            "write_zeroes": q.write_zeroes.get(), "dsm": q.dsm.get(),
                            "admin": q.admin.get(), "fabrics": q.fabrics.get(),
                        },
                        "bytes_read": q.bytes_read.get(), "bytes_written": q.bytes_written.get(),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let ports: Vec<Value> = self
            .ports
            .iter()
            .map(|p| {
                let t = &p.tls_stats;
                json!({
                    "portid": p.portid, "addr": p.addr.to_string(), "tls": p.tls.name(),
                    "tls_records": p.records(),
                    "ktls_connections": t.ktls_connections.load(Relaxed),
                    "ktls_fallbacks": t.ktls_fallbacks.load(Relaxed),
                    "tls_landed_bytes": t.landed_bytes.load(Relaxed),
                    "tls_connections": t.tls_connections.load(Relaxed),
                    "plain_connections": t.plain_connections.load(Relaxed),
                    "tls_handshake_failures": t.handshake_failures.load(Relaxed),
                    "plain_refused": t.plain_refused.load(Relaxed),
                    "tls_identity_mismatches": t.identity_mismatches.load(Relaxed),
                    "napi_ids": t.napi_ids.lock().unwrap_or_else(|e| e.into_inner()).iter()
                        .map(|(id, n)| (id.to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
                })
            })
            .collect();
        let b = &self.buffers;
        let buffers = json!({"limit": b.limit(), "used": b.used(), "peak": b.peak(), "refusals": b.refusals()});
        json!({"version": 1, "uptime_ns": self.start.elapsed().as_nanos() as u64, "reactors": reactors, "ports": ports,
               "buffer_memory": buffers})
    }

    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, rows: Vec<(String, u64)>| {
            let _ = writeln!(out, "# HELP nvmf_target_{name} {help}\n# TYPE nvmf_target_{name} {kind}");
            for (labels, v) in rows {
                let _ = writeln!(out, "nvmf_target_{name}{{{labels}}} {v}");
            }
        };
        metric("uptime_ns", "gauge", "Time since start.", vec![(String::new(), self.start.elapsed().as_nanos() as u64)]);
        let b = &self.buffers;
        metric("buffer_memory_limit_bytes", "gauge", "Cap on command data buffers (buffer_memory).", vec![(String::new(), b.limit() as u64)]);
        metric("buffer_memory_used_bytes", "gauge", "Command data buffers (and queued output beyond 64 KiB a connection) held now.", vec![(String::new(), b.used() as u64)]);
        metric("buffer_memory_peak_bytes", "gauge", "Most command data buffers held at once.", vec![(String::new(), b.peak() as u64)]);
        metric("buffer_memory_refusals_total", "counter", "Buffer requests that met the cap and waited.", vec![(String::new(), b.refusals())]);
        let per_reactor = |f: fn(&ReactorStats) -> u64| {
            self.reactors.iter().map(|r| (format!("reactor=\"{}\"", r.index), f(r))).collect::<Vec<_>>()
        };
        metric("reactor_busy_ns_total", "counter", "Time reactors spent working.", per_reactor(|r| r.busy_ns.get()));
        metric("reactor_idle_ns_total", "counter", "Time reactors spent idle.", per_reactor(|r| r.idle_ns.get()));
        metric("reactor_wakeups_total", "counter", "Reactor wakeups from sleep.", per_reactor(|r| r.wakeups.get()));
        let ns_rows = |f: fn(&NsStats) -> u64| {
            let mut rows = Vec::new();
            for r in &self.reactors {
                for n in r.namespaces() {
                    rows.push((format!("reactor=\"{}\",subnqn=\"{}\",nsid=\"{}\"", r.index, esc(&n.subnqn), n.nsid), f(&n)));
                }
            }
            rows
        };
        metric("namespace_commands_total", "counter", "Commands per namespace.", ns_rows(|n| n.commands.get()));
        metric("namespace_reads_total", "counter", "Reads per namespace.", ns_rows(|n| n.reads.get()));
        metric("namespace_writes_total", "counter", "Writes per namespace.", ns_rows(|n| n.writes.get()));
        metric("namespace_other_total", "counter", "Other I/O commands per namespace.", ns_rows(|n| n.other.get()));
        metric("namespace_bytes_read_total", "counter", "Bytes read per namespace.", ns_rows(|n| n.bytes_read.get()));
        metric("namespace_bytes_written_total", "counter", "Bytes written per namespace.", ns_rows(|n| n.bytes_written.get()));
        let q_rows = |f: fn(&QueueStats) -> u64| {
            let mut rows = Vec::new();
            for r in &self.reactors {
                for q in r.queues() {
                    let labels = format!(
                        "reactor=\"{}\",subnqn=\"{}\",hostnqn=\"{}\",cntlid=\"{}\",qid=\"{}\"",
                        r.index, esc(&q.subnqn), esc(&q.hostnqn), q.cntlid, q.qid
                    );
                    rows.push((labels, f(&q)));
                }
            }
            rows
        };
        metric("queue_connected", "gauge", "1 while the queue's connection is open.", q_rows(|q| q.connected.load(Relaxed) as u64));
        metric("queue_commands_total", "counter", "Commands per queue.", q_rows(|q| q.commands.get()));
        metric("queue_read_total", "counter", "Read commands per queue.", q_rows(|q| q.read.get()));
        metric("queue_write_total", "counter", "Write commands per queue.", q_rows(|q| q.write.get()));
        metric("queue_flush_total", "counter", "Flush commands per queue.", q_rows(|q| q.flush.get()));
        metric("queue_write_zeroes_total", "counter", "Write Zeroes commands per queue.", q_rows(|q| q.write_zeroes.get()));
        metric("queue_dsm_total", "counter", "Dataset Management commands per queue.", q_rows(|q| q.dsm.get()));
        metric("queue_admin_total", "counter", "Admin commands per queue.", q_rows(|q| q.admin.get()));
        metric("queue_fabrics_total", "counter", "Fabrics commands per queue.", q_rows(|q| q.fabrics.get()));
        metric("queue_bytes_read_total", "counter", "Bytes read per queue.", q_rows(|q| q.bytes_read.get()));
        metric("queue_bytes_written_total", "counter", "Bytes written per queue.", q_rows(|q| q.bytes_written.get()));
        out
    }
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The HTTP endpoint thread; stops when `stop` is set (polled every 100 ms).
pub struct StatsServer {
    pub addr: SocketAddr,
    pub thread: std::thread::JoinHandle<()>,
}

pub fn serve(
    addr: SocketAddr,
    registry: Arc<StatsRegistry>,
    stop: Arc<AtomicBool>,
) -> Result<StatsServer, String> {
    let server = tiny_http::Server::http(addr).map_err(|e| format!("cannot listen on stats address {addr}: {e}"))?;
    let addr = server.server_addr().to_ip().unwrap_or(addr);
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, "stats endpoint is unauthenticated and listens beyond loopback: anyone who reaches it reads every host NQN and counter");
    }
    let thread = std::thread::Builder::new()
        .name("nvmf-stats".into())
        .spawn(move || {
            while !stop.load(Relaxed) {
                let Ok(Some(req)) = server.recv_timeout(std::time::Duration::from_millis(100)) else { continue };
                let path = req.url().split('?').next().unwrap_or("").to_string();
                let (body, ctype, code) = match path.as_str() {
                    "/metrics" => (registry.prometheus(), "text/plain; version=0.0.4", 200),
                    "/stats" => (registry.json().to_string(), "application/json", 200),
                    _ => ("not found: try /metrics or /stats\n".to_string(), "text/plain", 404),
                };
                let header = tiny_http::Header::from_bytes("Content-Type", ctype).expect("static header");
                let _ = req.respond(tiny_http::Response::from_string(body).with_header(header).with_status_code(code));
            }
        })
        .map_err(|e| format!("cannot start stats thread: {e}"))?;
    Ok(StatsServer { addr, thread })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_queues_without_io_are_not_kept_forever() {
        let r = ReactorStats::new(0, 0, ReactorMode::Event, 0);
        let busy = Arc::new(QueueStats::new("nqn.s", "nqn.h", 1, 1, TransportKind::Tcp));
        busy.read.add(1);
        busy.commands.add(3);
        busy.connected.store(false, Relaxed);
        r.add_queue(busy);
        for i in 0..3 * MAX_IDLE_CLOSED_QUEUES {
            let q = Arc::new(QueueStats::new("nqn.s", "nqn.h", i as u16, 0, TransportKind::Tcp));
            q.commands.add(1); // its Connect
            q.connected.store(false, Relaxed);
            r.add_queue(q);
        }
        let queues = r.queues();
        assert!(queues.len() <= MAX_IDLE_CLOSED_QUEUES + 1, "{} queues listed", queues.len());
        assert!(queues.iter().any(|q| q.read.get() == 1), "a queue that did I/O stays");
        let total: u64 = queues.iter().map(|q| q.commands.get()).sum::<u64>() + r.retired_commands.load(Relaxed);
        assert_eq!(total, 3 + 3 * MAX_IDLE_CLOSED_QUEUES as u64, "every Connect is still counted");
    }

    #[test]
    fn json_and_prometheus_have_the_contract_shape() {
        let r = Arc::new(ReactorStats::new(0, 3, ReactorMode::Event, 10));
        let q = Arc::new(QueueStats::new("nqn.s", "nqn.h", 1, 1, TransportKind::Tcp));
        q.commands.add(2);
        q.read.add(1);
        q.bytes_read.add(4096);
        r.add_queue(q);
        r.namespace("nqn.s", 1).reads.add(1);
        let rdma = Arc::new(QueueStats::new("nqn.s", "nqn.h", 2, 0, TransportKind::Rdma));
        let r1 = Arc::new(ReactorStats::new(1, 5, ReactorMode::Poll, 0));
        r1.add_queue(rdma);
        let buffers = Arc::new(crate::backend::MemoryBudget::new(1 << 20));
        assert!(buffers.try_take(4096, false) && !buffers.try_take(1 << 20, false));
        let reg = StatsRegistry { start: Instant::now(), reactors: vec![r, r1], ports: Vec::new(), buffers };
        let j = reg.json();
        assert_eq!(j["version"], 1);
        assert_eq!(j["buffer_memory"], json!({"limit": 1 << 20, "used": 4096, "peak": 4096, "refusals": 1}));
        let r1 = &j["reactors"][1];
        assert_eq!((r1["index"].as_u64(), r1["core"].as_u64(), &r1["mode"]), (Some(1), Some(5), &json!("poll")), "{r1}");
        assert_eq!((&r1["queues"][0]["cntlid"], &r1["queues"][0]["transport"]), (&json!(2), &json!("rdma")));
        let r0 = &j["reactors"][0];
        assert_eq!(r0["core"], 3);
        assert_eq!(r0["queues"][0]["transport"], "tcp");
        assert_eq!(r0["mode"], "event");
        assert_eq!(r0["commands"], 2);
        assert_eq!(r0["bytes_read"], 4096);
        assert_eq!(r0["queues"][0]["by_opcode"]["read"], 1);
        assert_eq!(r0["queues"][0]["connected"], true);
        assert_eq!(r0["namespaces"][0]["reads"], 1);
        let p = reg.prometheus();
        assert!(p.contains("nvmf_target_queue_read_total{reactor=\"0\",subnqn=\"nqn.s\",hostnqn=\"nqn.h\",cntlid=\"1\",qid=\"1\"} 1"), "{p}");
        assert!(p.contains("nvmf_target_namespace_reads_total{reactor=\"0\",subnqn=\"nqn.s\",nsid=\"1\"} 1"), "{p}");
        assert!(p.contains("nvmf_target_buffer_memory_refusals_total{} 1\n") && p.contains("nvmf_target_buffer_memory_peak_bytes{} 4096\n"), "{p}");
    }
}
