//! Reconnect through a loopback proxy that the test controls: connections cut (as when a target
//! dies), connections gone silent (detected by Keep Alive within KATO), and a target that stays
//! away (ctrl-loss-tmo expires). The real target runs in process behind the proxy.

use crate::common;

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvmf_host::{
    default_hostnqn, Completion, ConnectOptions, Controller, Error, ReconnectPolicy, Session, SessionQueue,
};

const NQN: &str = "nqn.2024-01.io.nvmflab:reconnect";
const BLOCK: usize = 512;
const DEPTH: usize = 8;

/// A TCP forwarder on loopback. `cut` closes every connection made so far, `freeze` makes them
/// silent (open, nothing forwarded), `refuse` stops accepting; new connections work until then.
struct Proxy {
    addr: SocketAddr,
    pairs: Arc<Mutex<Vec<(u64, TcpStream, TcpStream)>>>,
    next_id: Arc<AtomicU64>,
    frozen_below: Arc<AtomicU64>,
    refusing: Arc<AtomicBool>,
}

impl Proxy {
    fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let p = Proxy {
            addr: listener.local_addr().unwrap(),
            pairs: Arc::default(),
            next_id: Arc::default(),
            frozen_below: Arc::default(),
            refusing: Arc::default(),
        };
        let (pairs, next_id, frozen, refusing) =
            (p.pairs.clone(), p.next_id.clone(), p.frozen_below.clone(), p.refusing.clone());
        std::thread::spawn(move || {
            // Dropping the listener when refusing makes connects fail with ECONNREFUSED.
            while !refusing.load(Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(upstream) else { continue };
                let id = next_id.fetch_add(1, Ordering::SeqCst);
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server.try_clone().unwrap(), client.try_clone().unwrap()),
                ] {
                    let frozen = frozen.clone();
                    std::thread::spawn(move || pump(id, from, to, &frozen));
                }
                pairs.lock().unwrap().push((id, client, server));
            }
        });
        p
    }

    fn cut(&self) {
        for (_, a, b) in self.pairs.lock().unwrap().drain(..) {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }

    fn freeze(&self) {
        self.frozen_below.store(self.next_id.load(Ordering::SeqCst), Ordering::SeqCst);
    }

    fn refuse(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50)); // the accept loop sees it and drops the listener
        self.cut();
    }
}

fn pump(id: u64, mut from: TcpStream, mut to: TcpStream, frozen_below: &AtomicU64) {
    from.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if id < frozen_below.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

fn connect(proxy: &Proxy, kato_ms: u32, policy: ReconnectPolicy) -> Session {
    let mut opts = ConnectOptions::new(proxy.addr.to_string(), default_hostnqn());
    opts.kato_ms = kato_ms;
    opts.timeout = Duration::from_secs(3);
    let ctrl = Controller::connect(&opts, NQN).expect("connect");
    ctrl.set_number_of_queues(1).expect("queues");
    Session::new(ctrl, policy).with_io_queues(1)
}

fn policy(delay_ms: u64, tmo_ms: u64) -> ReconnectPolicy {
    ReconnectPolicy {
        reconnect_delay: Duration::from_millis(delay_ms),
        ctrl_loss_tmo: Some(Duration::from_millis(tmo_ms)),
    }
}

/// Contents of block `lba` in write `round`: every byte names both.
fn pattern(lba: u64, round: u8) -> u8 {
    (lba as u8).wrapping_mul(31) ^ round
}

/// Keeps up to DEPTH commands in flight until all of `lbas` completed (30 s at most); `hook`
/// runs once, right after the first `at` submissions were queued and before they are sent.
fn run_io(
    q: &mut SessionQueue<'_>,
    lbas: std::ops::Range<u64>,
    read: bool,
    round: u8,
    at: usize,
    hook: &mut dyn FnMut(),
) -> Result<(), Error> {
    // Under 1 s on a quiet machine, outages included: the bound is for liveness only.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut next = lbas.start;
    let mut submitted = 0;
    let mut free: Vec<u16> = (0..DEPTH as u16).collect();
    let mut lba_of = [0u64; DEPTH];
    let mut done: Vec<Completion> = Vec::new();
    let mut completed = 0;
    let mut hooked = false;
    while completed < lbas.end - lbas.start {
        assert!(Instant::now() < deadline, "{completed} of {} I/Os within 30 s", lbas.end - lbas.start);
        while next < lbas.end {
            let Some(tag) = free.pop() else { break };
            lba_of[tag as usize] = next;
            if read {
                q.queue().submit_read(tag, next, 1)?;
            } else {
                q.queue().buffer(tag)[..BLOCK].fill(pattern(next, round));
                q.queue().submit_write(tag, next, 1)?;
            }
            next += 1;
            submitted += 1;
            if submitted == at && !hooked {
                hooked = true;
                hook();
            }
        }
        q.commit()?;
        q.poll(Duration::from_millis(100), &mut done)?;
        for c in done.drain(..) {
            c.result?;
            let lba = lba_of[c.tag as usize];
            if read {
                let want = pattern(lba, round);
                let got = &q.queue().buffer(c.tag)[..BLOCK];
                assert!(got.iter().all(|&b| b == want), "LBA {lba}: read {:#x}.., want {want:#x}", got[0]);
            }
            free.push(c.tag);
            completed += 1;
        }
    }
    Ok(())
}

#[test]
fn a_cut_connection_is_reconnected_and_in_flight_writes_are_resubmitted() {
    let target = common::start_target(NQN, "ram", "1MiB");
    let proxy = Proxy::start(target.listen_addrs()[0]);
    let session = connect(&proxy, 5000, policy(100, 5000));
    let mut q = session.io_queue(1, DEPTH, 4096).expect("I/O queue");
    q.queue().set_namespace(1, BLOCK as u64);
    run_io(&mut q, 0..64, false, 1, 0, &mut || {}).expect("writes before the cut");

    // The cut comes when DEPTH writes are queued and not yet sent: they can only complete by
    // being resubmitted on the new connection.
    let cut_at = Mutex::new(None);
    run_io(&mut q, 64..256, false, 1, DEPTH, &mut || {
        proxy.cut();
        *cut_at.lock().unwrap() = Some(Instant::now());
    })
    .expect("writes across the cut");
    assert_eq!(q.retried(), DEPTH as u64, "the writes in flight at the cut were resubmitted");
    run_io(&mut q, 0..256, true, 1, 0, &mut || {}).expect("read back");

    let outages = session.outages();
    assert_eq!(outages.len(), 1, "{outages:?}");
    let o = &outages[0];
    let cut_at = cut_at.into_inner().unwrap().unwrap();
    let end = o.end.expect("reconnected");
    assert!(o.start >= cut_at, "noticed after the cut");
    let down = end - o.start;
    assert!(down >= Duration::from_millis(100), "the first attempt waits --reconnect-delay: {down:?}");
    // A quiet machine takes about 100 ms (the delay, then one attempt); the slack is for a loaded one.
    assert!(down < Duration::from_secs(3), "{down:?}");
    assert_eq!(o.attempts, 1);
    assert!(o.cause.contains("closed") || o.cause.contains("socket"), "{}", o.cause);
    drop(q);
    session.into_controller().expect("controller").shutdown().expect("clean shutdown after reconnect");
}

#[test]
fn a_silent_connection_is_detected_by_keep_alive() {
    let target = common::start_target(NQN, "ram", "1MiB");
    let proxy = Proxy::start(target.listen_addrs()[0]);
    let session = connect(&proxy, 1000, policy(100, 5000));
    let mut q = session.io_queue(1, DEPTH, 4096).expect("I/O queue");
    q.queue().set_namespace(1, BLOCK as u64);
    run_io(&mut q, 0..32, false, 2, 0, &mut || {}).expect("writes before");
    let frozen_at = Mutex::new(None);
    run_io(&mut q, 32..128, false, 2, 4, &mut || {
        proxy.freeze();
        *frozen_at.lock().unwrap() = Some(Instant::now());
    })
    .expect("writes across the silence");
    run_io(&mut q, 0..128, true, 2, 0, &mut || {}).expect("read back");
    let outages = session.outages();
    assert_eq!(outages.len(), 1, "{outages:?}");
    let o = &outages[0];
    assert!(o.cause.contains("Keep Alive"), "found by keep-alive: {}", o.cause);
    // KATO 1 s: a Keep Alive every 500 ms, each allowed 1 s.
    let noticed = o.start - frozen_at.into_inner().unwrap().unwrap();
    // Slack above 1.5 s for a loaded machine: the point is seconds (KATO), not the 30 s I/O timeout.
    assert!(noticed <= Duration::from_secs(10), "silence noticed after {noticed:?}");
    assert!(noticed >= Duration::from_millis(900), "not before a Keep Alive went unanswered for KATO: {noticed:?}");
    assert!(q.retried() >= 4, "the writes stuck in the silent connection were resubmitted: {}", q.retried());
}

#[test]
fn a_target_that_stays_away_fails_after_ctrl_loss_tmo() {
    let target = common::start_target(NQN, "ram", "1MiB");
    let proxy = Proxy::start(target.listen_addrs()[0]);
    let session = connect(&proxy, 5000, policy(200, 1000));
    let mut q = session.io_queue(1, DEPTH, 4096).expect("I/O queue");
    q.queue().set_namespace(1, BLOCK as u64);
    let t0 = Mutex::new(None);
    let e = run_io(&mut q, 0..64, false, 3, 4, &mut || {
        proxy.refuse();
        *t0.lock().unwrap() = Some(Instant::now());
    })
    .expect_err("no target: the I/O fails");
    let took = t0.into_inner().unwrap().unwrap().elapsed();
    let msg = e.to_string();
    assert!(matches!(e, Error::ControllerLost(_)), "{msg}");
    assert!(msg.contains("--ctrl-loss-tmo 1s") && msg.contains("refused"), "{msg}");
    // About 1 s (--ctrl-loss-tmo); the upper slack is for a loaded machine.
    assert!(took >= Duration::from_millis(950) && took < Duration::from_secs(10), "gave up after {took:?}");
    let o = session.outages();
    assert_eq!(o.len(), 1);
    assert!(o[0].end.is_none());
    assert_eq!(o[0].attempts, 5, "attempts at 0.2, 0.4 .. 1.0 s");
    // Later calls fail at once with the same reason.
    let again = q.poll(Duration::from_millis(10), &mut Vec::new()).expect_err("still lost");
    assert_eq!(again.to_string(), msg);
    assert!(session.into_controller().is_none());
}

#[test]
fn a_cut_tls_connection_is_reconnected_over_tls() {
    let hostnqn = "nqn.2014-08.org.nvmexpress:uuid:7c1e2f00-0000-4000-8000-00000000bbbb";
    let key = nvmf_tls::ConfiguredPsk::new(nvmf_tls::PskTransform::Sha256, &[0x42; 32]).unwrap();
    let cfg = format!(
        "[target]\nstats = \"0\"\n[[port]]\naddr = \"127.0.0.1:0\"\ntls = \"required\"\n[[host]]\nnqn = \"{hostnqn}\"\ntls_key = \"{}\"\n\
         [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n  [[subsystem.namespace]]\n  nsid = 1\n  backend = \"ram\"\n  size = \"1MiB\"\n",
        key.to_interchange()
    );
    let config = nvmf_target::config::toml::parse(&cfg, std::path::Path::new("tls.toml")).expect("config");
    let target = nvmf_target::start(config).expect("target starts");
    let proxy = Proxy::start(target.listen_addrs()[0]);
    let mut opts = ConnectOptions::new(proxy.addr.to_string(), hostnqn);
    opts.timeout = Duration::from_secs(3);
    opts.tls = Some(nvmf_host::TlsOptions::new(key));
    let ctrl = Controller::connect(&opts, NQN).expect("connect over TLS");
    ctrl.set_number_of_queues(1).expect("queues");
    let session = Session::new(ctrl, policy(100, 5000)).with_io_queues(1);
    let mut q = session.io_queue(1, DEPTH, 4096).expect("I/O queue");
    q.queue().set_namespace(1, BLOCK as u64);
    run_io(&mut q, 0..64, false, 2, 0, &mut || {}).expect("writes before the cut");
    run_io(&mut q, 64..256, false, 2, DEPTH, &mut || proxy.cut()).expect("writes across the cut");
    run_io(&mut q, 0..256, true, 2, 0, &mut || {}).expect("read back");
    assert_eq!(session.outages().len(), 1);
    assert!(session.outages()[0].end.is_some(), "reconnected");
    // Every connection, the first ones and the reconnected ones, was TLS.
    let port = &target.stats_json()["ports"][0];
    assert_eq!(port["tls_connections"], 4, "{port}");
    assert_eq!(port["plain_refused"], 0);
    drop(q);
    session.into_controller().expect("controller").shutdown().expect("clean shutdown after reconnect");
}
