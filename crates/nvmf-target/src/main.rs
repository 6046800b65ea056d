//! `nvmf-target`: see CONTRACTS.md section 2 and README.md.

use clap::Parser;
use nvmf_target::config::cli::Cli;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = match Cli::parse().into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nvmf-target: config error: {e}");
            std::process::exit(2);
        }
    };
    raise_fd_limit();
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            eprintln!("nvmf-target: cannot install signal handler: {e}");
            std::process::exit(1);
        }
    }
    let target = match nvmf_target::start(config) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("nvmf-target: {e}");
            std::process::exit(if e.is_config_error() { 2 } else { 1 });
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", target.ready_line());
    let _ = out.flush();
    drop(out);
    while !stop.load(Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    tracing::info!("signal received; shutting down");
    target.shutdown();
}

/// Every queue is a socket: lift the soft open-file limit to the hard one, so that
/// `max_connections` rather than a default of 1024 descriptors decides how many hosts fit.
fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit read and write one rlimit struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                tracing::warn!("cannot raise the open-file limit: {}", std::io::Error::last_os_error());
            }
        }
    }
}
