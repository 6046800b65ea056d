//! Durability across a crash: writes and Flushes on a file namespace, SIGKILL of the target in
//! the middle of the run, a restart on the same file, then every block acknowledged before the
//! last completed Flush must read back as written.
//!
//! What this can prove: the target acknowledges a write only once the backend has it, and a
//! restarted target serves what the file holds. What it cannot prove: SIGKILL ends the process,
//! not the kernel, so the page cache survives and un-flushed writes survive too. That Flush really
//! reaches fdatasync (and FUA a RWF_DSYNC write) is asserted by the backend's unit tests
//! (`file_flush_and_fua_*`) and `tests/it/durability_commands.rs` in nvmf-target; power loss itself
//! needs a VM or a device that can be cut (docs/reliability.md).

use std::time::{Duration, Instant};

use nvmf_e2e::{Target, TempDir, HOSTNQN};
use nvmf_host::{Completion, ConnectOptions, Controller, IoQueue};

const NQN: &str = "nqn.2024-01.io.nvmflab:durability";
/// 4 KiB units written whole; the namespace has 512-byte blocks.
const UNIT: usize = 4096;
const UNITS: usize = 512;
const DEPTH: usize = 8;
const TIMEOUT: Duration = Duration::from_secs(10);

/// Contents of `unit` written in round `round`: every 16 bytes hold (unit, round).
fn pattern(unit: usize, round: u64, out: &mut [u8]) {
    for chunk in out.chunks_exact_mut(16) {
        chunk[..8].copy_from_slice(&(unit as u64).to_le_bytes());
        chunk[8..].copy_from_slice(&round.to_le_bytes());
    }
}

/// The round a unit's contents came from: Some(0) for never written (zeroes), None when torn or
/// not a pattern of this unit.
fn decode(unit: usize, data: &[u8]) -> Option<u64> {
    if data.iter().all(|b| *b == 0) {
        return Some(0);
    }
    let round = u64::from_le_bytes(data[8..16].try_into().unwrap());
    let mut expect = vec![0u8; data.len()];
    pattern(unit, round, &mut expect);
    (expect == data).then_some(round)
}

/// A small deterministic generator (xorshift64*), seeded per run and printed for replay.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

fn start(path: &std::path::Path) -> Target {
    Target::start(&["--nqn", NQN, "--ns", &format!("file:{}", path.display()), "--block-size", "512"])
}

fn connect(t: &Target) -> (Controller, IoQueue) {
    let opts = ConnectOptions::new(t.addr.to_string(), HOSTNQN);
    let ctrl = Controller::connect(&opts, NQN).expect("connect admin queue");
    let mut q = IoQueue::connect(&ctrl.io_queue_params(), 1, DEPTH, UNIT).expect("connect I/O queue");
    q.set_namespace(1, 512);
    (ctrl, q)
}

/// Waits for `n` completions, each successful.
fn complete(q: &mut IoQueue, n: usize) -> Result<(), String> {
    let deadline = Instant::now() + TIMEOUT;
    let mut done: Vec<Completion> = Vec::new();
    let mut left = n;
    while left > 0 {
        if Instant::now() > deadline {
            return Err("no completion within 10 s".into());
        }
        q.poll(Duration::from_millis(100), &mut done).map_err(|e| e.to_string())?;
        for c in &done {
            c.result.as_ref().map_err(|e| e.to_string())?;
        }
        left -= done.len().min(left);
    }
    Ok(())
}

#[test]
fn every_write_acknowledged_before_the_last_flush_survives_sigkill() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("durability seed {seed}");
    let mut rng = Rng(seed);
    let dir = TempDir::new();
    let path = dir.join("disk.img");
    std::fs::write(&path, vec![0u8; UNITS * UNIT]).unwrap();

    let target = start(&path);
    let (ctrl, mut q) = connect(&target);
    assert_eq!(ctrl.identity().vwc & 1, 1, "a file namespace reports a volatile write cache");
    // Per unit: its round at the last completed Flush, and the rounds written since (acknowledged
    // or still in flight when the target died): after the crash it may hold any of those.
    let mut durable = vec![0u64; UNITS];
    let mut since: Vec<Vec<u64>> = vec![Vec::new(); UNITS];
    let kill_round = 5 + rng.below(20);
    let kill_during_flush = rng.below(2) == 1;
    let mut flushes = 0;
    let mut target = Some(target);
    for round in 1..=kill_round {
        // A batch of writes to distinct units, all acknowledged before the Flush is sent.
        let mut units: Vec<usize> = Vec::new();
        while units.len() < DEPTH {
            let u = rng.below(UNITS as u64) as usize;
            if !units.contains(&u) {
                units.push(u);
            }
        }
        for (tag, &u) in units.iter().enumerate() {
            pattern(u, round, &mut q.buffer(tag as u16)[..UNIT]);
            q.submit_write(tag as u16, (u * UNIT / 512) as u64, (UNIT / 512) as u32).unwrap();
            since[u].push(round);
        }
        q.commit().unwrap();
        if round == kill_round && !kill_during_flush {
            break; // writes in flight when the target dies
        }
        complete(&mut q, units.len()).expect("writes complete");
        q.submit_flush(0).unwrap();
        q.commit().unwrap();
        if round == kill_round {
            break; // a Flush in flight: its writes were acknowledged but are not yet promised
        }
        complete(&mut q, 1).expect("flush completes");
        flushes += 1;
        for u in 0..UNITS {
            if let Some(&last) = since[u].last() {
                durable[u] = last;
                since[u].clear();
            }
        }
    }
    // SIGKILL (dropping the handle kills and reaps the process).
    drop(target.take());
    drop(q);
    drop(ctrl);
    assert!(flushes >= 4, "the run completed {flushes} flushes before the kill");

    let target = start(&path);
    let (ctrl, mut q) = connect(&target);
    let mut buf = vec![0u8; UNIT];
    let mut promised = 0;
    for u in 0..UNITS {
        q.read((u * UNIT / 512) as u64, &mut buf, TIMEOUT).expect("read back");
        let got = decode(u, &buf);
        let ok = got.is_some_and(|r| r == durable[u] || since[u].contains(&r));
        assert!(
            ok,
            "unit {u}: read {got:?}, expected round {} (flushed) or one of {:?} (written after the last flush); seed {seed}",
            durable[u], since[u]
        );
        promised += (durable[u] > 0) as usize;
    }
    assert!(promised >= 4 * DEPTH / 2, "only {promised} units were promised durable: the test proved little");
    q.disconnect(TIMEOUT).unwrap();
    ctrl.shutdown().unwrap();
    assert!(!target.log().contains("ERROR"), "{}", target.log());
}
