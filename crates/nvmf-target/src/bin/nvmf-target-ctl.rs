//! `nvmf-target-ctl`: sends control requests to a running nvmf-target (docs/control.md).
//!
//!     nvmf-target-ctl --socket /run/nvmf-target.sock '{"op":"show"}'
//!     nvmf-target-ctl --socket S '{"op":"set_host","nqn":"H","dhchap_key":"DHHC-1:00:..."}'
//!
//! Each REQUEST (or, without any, each line of stdin) is sent as one line; each reply is printed
//! as one line. Exit status (docs/control.md): 0 every reply has "ok": true; 1 the target refused
//! a request; 2 bad input (an empty request, a stdin line that is not UTF-8: named on stderr, the
//! other lines are still sent) or the socket cannot be reached or the target closes it early.
//! Bad input wins over a refusal.

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

/// Exit statuses (docs/control.md).
const REFUSED: i32 = 1;
const BAD_INPUT_OR_UNREACHABLE: i32 = 2;

fn fail(msg: String) -> ! {
    eprintln!("nvmf-target-ctl: {msg}");
    std::process::exit(BAD_INPUT_OR_UNREACHABLE)
}

/// The requests of stdin, one a line (blank lines skipped). A line that is not UTF-8 is named on
/// stderr and left out; the others are kept. Returns them and whether one was left out.
fn stdin_requests(input: impl BufRead) -> (Vec<String>, bool) {
    let mut requests = Vec::new();
    let mut bad = false;
    for (i, line) in input.split(b'\n').enumerate() {
        let line = line.unwrap_or_else(|e| fail(format!("reading stdin: {e}")));
        match String::from_utf8(line) {
            Ok(t) if t.trim().is_empty() => {}
            Ok(t) => requests.push(t),
            Err(_) => {
                eprintln!("nvmf-target-ctl: stdin line {}: not UTF-8: not sent", i + 1);
                bad = true;
            }
        }
    }
    (requests, bad)
}

fn main() {
    let a = Args::parse();
    let (requests, bad_input) = if a.requests.is_empty() {
        stdin_requests(std::io::stdin().lock())
    } else {
        // All arguments are there at once: an empty one is a usage error, before anything is sent.
        if let Some(i) = a.requests.iter().position(|r| r.trim().is_empty()) {
            fail(format!("request {} is empty: expected a JSON object such as '{{\"op\":\"show\"}}'", i + 1));
        }
        (a.requests, false)
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
    let _ = std::io::stdout().flush();
    std::process::exit(if bad_input {
        BAD_INPUT_OR_UNREACHABLE
    } else if all_ok {
        0
    } else {
        REFUSED
    });
}
