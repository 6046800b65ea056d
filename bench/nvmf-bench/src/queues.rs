//! Many connected I/O queues, for the target's memory per queue: connects `count` I/O queues
//! (over as many controllers as the target's queue limit needs), runs one full-depth round of
//! reads on each so the target has set up every command slot, prints one JSON line, then holds
//! every connection open for `--hold` seconds (the caller stops it sooner once it has read the
//! target's RSS).

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use nvmf_host::{default_hostnqn, ConnectOptions, Controller, IoQueue};

/// NVMe allows 65535 I/O queues per controller; a target grants fewer (Set Features).
const MAX_QUEUES_PER_CONTROLLER: usize = 65535;
const MAX_COUNT: usize = 100_000;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Target address
    #[arg(short = 'a', long, default_value = "127.0.0.1")]
    pub traddr: String,
    /// Target port
    #[arg(short = 's', long, default_value_t = 4420)]
    pub trsvcid: u16,
    /// Subsystem NQN
    #[arg(short = 'n', long)]
    pub nqn: String,
    /// I/O queues to connect
    #[arg(long, default_value_t = 1)]
    pub count: usize,
    /// Commands in flight per queue in the full-depth round
    #[arg(long, default_value_t = 128)]
    pub iodepth: usize,
    /// Bytes per read
    #[arg(long, default_value_t = 4096)]
    pub bs: usize,
    /// Seconds to hold the queues open after the ready line
    #[arg(long, default_value_t = 60.0)]
    pub hold: f64,
}

pub fn run(a: &Args) -> Result<String> {
    if a.count == 0 || a.count > MAX_COUNT || a.iodepth == 0 || a.iodepth > 1024 {
        bail!("--count must be 1..={MAX_COUNT} and --iodepth 1..=1024");
    }
    if a.bs == 0 || a.bs % 512 != 0 || a.bs > 1 << 20 {
        bail!("--bs must be a multiple of 512 up to 1 MiB");
    }
    if !(0.0..=3600.0).contains(&a.hold) {
        bail!("--hold must be 0..=3600 seconds");
    }
    raise_fd_limit(a.count);
    let started = Instant::now();
    let mut opts = ConnectOptions::new(format!("{}:{}", a.traddr, a.trsvcid), default_hostnqn());
    opts.timeout = IO_TIMEOUT;
    let mut controllers = Vec::new();
    let mut queues = Vec::with_capacity(a.count);
    while queues.len() < a.count {
        let ctrl = Controller::connect(&opts, &a.nqn)
            .with_context(|| format!("connect controller {}", controllers.len() + 1))?;
        let ns = ctrl.identify_namespace(1).context("identify namespace 1")?;
        let block = 1u64 << ns.lbads;
        let blocks_per_io = (a.bs as u64 / block).max(1);
        let want = (a.count - queues.len()).min(MAX_QUEUES_PER_CONTROLLER);
        let (granted, _) = ctrl.set_number_of_queues(want as u16)?;
        let params = ctrl.io_queue_params();
        for qid in 1..=(granted as usize).min(want) {
            let mut q = IoQueue::connect(&params, qid as u16, a.iodepth, a.bs)
                .with_context(|| format!("connect I/O queue {} (qid {qid})", queues.len() + 1))?;
            q.set_namespace(1, block);
            full_depth_round(&mut q, blocks_per_io, ns.nsze)
                .with_context(|| format!("I/O on queue {}", queues.len() + 1))?;
            queues.push(q);
        }
        controllers.push(ctrl);
    }
    let line = serde_json::json!({
        "queues": queues.len(), "controllers": controllers.len(), "iodepth": a.iodepth, "bs": a.bs,
        "connect_s": started.elapsed().as_secs_f64(),
    });
    println!("{line}");
    std::io::stdout().flush()?;
    std::thread::sleep(Duration::from_secs_f64(a.hold));
    // Dropping closes every socket; the target tears the controllers down itself.
    drop(queues);
    drop(controllers);
    Ok(serde_json::json!({ "released": true }).to_string())
}

/// `depth` reads in flight at once, then wait for all of them.
fn full_depth_round(q: &mut IoQueue, blocks_per_io: u64, nsze: u64) -> Result<()> {
    let depth = q.depth();
    let span = (nsze / blocks_per_io).max(1);
    for tag in 0..depth {
        q.submit_read(
            tag as u16,
            (tag as u64 % span) * blocks_per_io,
            blocks_per_io as u32,
        )?;
    }
    q.commit()?;
    let (mut done, mut finished) = (Vec::with_capacity(depth), 0);
    let deadline = Instant::now() + IO_TIMEOUT;
    while finished < depth {
        if Instant::now() > deadline {
            bail!("{finished} of {depth} reads completed in {IO_TIMEOUT:?}");
        }
        q.poll(Duration::from_millis(100), &mut done)?;
        for c in done.drain(..) {
            c.result
                .with_context(|| format!("read with CID {}", c.tag))?;
            finished += 1;
        }
    }
    Ok(())
}

/// One socket per queue plus the admin queues: lift the soft descriptor limit to the hard one.
fn raise_fd_limit(queues: usize) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed in.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0
            && (lim.rlim_cur as usize) < queues + 64
        {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(port: u16) -> Args {
        Args {
            traddr: "127.0.0.1".into(),
            trsvcid: port,
            nqn: "nqn.2024-01.io.nvmflab:none".into(),
            count: 2,
            iodepth: 4,
            bs: 4096,
            hold: 0.0,
        }
    }

    #[test]
    fn refuses_counts_depths_and_sizes_out_of_range() {
        for change in [
            |a: &mut Args| a.count = 0,
            |a: &mut Args| a.iodepth = 0,
            |a: &mut Args| a.bs = 1000,
            |a: &mut Args| a.hold = -1.0,
        ] {
            let mut a = args(1);
            change(&mut a);
            assert!(run(&a).is_err());
        }
    }

    #[test]
    fn a_port_nobody_listens_on_is_an_error_not_a_hang() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = run(&args(port)).unwrap_err();
        assert!(
            format!("{err:#}").contains("connect controller 1"),
            "{err:#}"
        );
    }
}
