//! nvmf-bench: the measuring tools `bench/run.py` needs beyond nvmf-perf.
//!
//! - `pingpong`: the latency floor of one request/reply over loopback TCP (busy-polling or
//!   blocking), the best any NVMe/TCP stack can do for one 4 KiB read on the same two cores.
//! - `queues`: many connected I/O queues at a given depth, held open while the caller reads the
//!   target's memory (nvmf-perf opens one queue per job thread, which does not scale to 1000).
//! - `aead`: the AES-GCM rate of our record layer (nvmf-tls), for the bench's cipher bound.
//!
//! Each prints one JSON object on stdout; errors are one line on stderr and exit code 1.

mod aead;
mod pingpong;
mod queues;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "nvmf-bench",
    version,
    about = "Bench helpers: TCP ping-pong floor, many connected I/O queues, our AES-GCM rate"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Request/reply round trips over loopback TCP between two pinned threads
    Pingpong(pingpong::Args),
    /// Connect many I/O queues, drive each once at full depth, hold them open a while
    Queues(queues::Args),
    /// Seal (or open) TLS records with nvmf-tls for a while: bytes per CPU-second
    Aead(aead::Args),
}

fn main() {
    let cli = Cli::parse();
    let result: anyhow::Result<String> = match cli.command {
        Command::Pingpong(a) => pingpong::run(&a).and_then(|r| Ok(serde_json::to_string(&r)?)),
        Command::Queues(a) => queues::run(&a),
        Command::Aead(a) => aead::run(&a).and_then(|r| Ok(serde_json::to_string(&r)?)),
    };
    match result {
        Ok(json) => println!("{json}"),
        Err(e) => {
            eprintln!("nvmf-bench: {e:#}");
            std::process::exit(1)
        }
    }
}
