//! `nvmf-target-ctl`: sends control requests to a running nvmf-target (docs/control.md).
//!
//!     nvmf-target-ctl --socket /run/nvmf-target.sock '{"op":"show"}'
//!     nvmf-target-ctl --socket S '{"op":"set_host","nqn":"H","dhchap_key":"DHHC-1:00:..."}'
//!
//! Each REQUEST (or, without any, each line of stdin) is sent as one line; each reply is printed
//! as one line. Exit status 0 when every reply has "ok": true, 1 when one does not, 2 when the
//! socket cannot be reached or the target closes it early.

use clap::Parser;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

#[derive(Parser)]
#[command(about = "Send runtime control requests (JSON) to nvmf-target's --control socket")]
struct Args {
    /// The target's control socket (`--control PATH`, `[target] control`)
    #[arg(long)]
    socket: std::path::PathBuf,
    /// Seconds to wait for each reply
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// JSON requests, one per argument; none: read them from stdin, one a line
    requests: Vec<String>,
}

fn main() {
    let a = Args::parse();
    let requests: Vec<String> = if a.requests.is_empty() {
        std::io::stdin().lock().lines().map_while(Result::ok).filter(|l| !l.trim().is_empty()).collect()
    } else {
        a.requests
    };
    let fail = |msg: String| -> ! {
        eprintln!("nvmf-target-ctl: {msg}");
        std::process::exit(2)
    };
    let stream = UnixStream::connect(&a.socket).unwrap_or_else(|e| fail(format!("{}: {e}", a.socket.display())));
    let _ = stream.set_read_timeout(Some(Duration::from_secs(a.timeout.max(1))));
    let mut out = stream.try_clone().unwrap_or_else(|e| fail(e.to_string()));
    let mut replies = BufReader::new(stream);
    let mut all_ok = true;
    for r in requests {
        // A request is one line: a newline inside would split it in two.
        let line = r.replace(['\n', '\r'], " ");
        if let Err(e) = writeln!(out, "{line}") {
            fail(format!("sending: {e}"));
        }
        let mut reply = String::new();
        match replies.read_line(&mut reply) {
            Ok(0) => fail("the target closed the connection without a reply".into()),
            Ok(_) => {}
            Err(e) => fail(format!("waiting for the reply: {e}")),
        }
        let ok = serde_json::from_str::<serde_json::Value>(&reply).ok().and_then(|v| v["ok"].as_bool()).unwrap_or(false);
        all_ok &= ok;
        print!("{reply}");
    }
    std::process::exit(if all_ok { 0 } else { 1 });
}
