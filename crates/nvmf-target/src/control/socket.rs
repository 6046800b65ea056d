//! The control surface on a Unix socket (`[target] control`, `--control PATH`): one JSON request
//! a line, one JSON reply a line. The socket is made mode 0600 (only its owner may change the
//! target); clients are served one at a time, so changes never interleave.

use super::request::MAX_REQUEST_LEN;
use super::Control;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A client that sends nothing for this long is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// No client holds the socket longer than this.
const CLIENT_LIMIT: Duration = Duration::from_secs(60);
/// How often the idle server looks at the stop flag.
const POLL: Duration = Duration::from_millis(20);

/// Binds `path` (a stale socket left there is replaced; any other file is an error) and serves
/// it on a thread until `stop`.
pub fn serve(path: &Path, control: Arc<Control>, stop: Arc<AtomicBool>) -> Result<JoinHandle<()>, String> {
    let fail = |what: &str, e: std::io::Error| format!("control socket {}: {what}: {e}", path.display());
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!("control socket {}: exists and is not a socket", path.display()));
        }
        std::fs::remove_file(path).map_err(|e| fail("cannot remove the stale socket", e))?;
    }
    let listener = UnixListener::bind(path).map_err(|e| fail("cannot bind", e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| fail("cannot chmod", e))?;
    listener.set_nonblocking(true).map_err(|e| fail("cannot set non-blocking", e))?;
    let path: PathBuf = path.to_path_buf();
    std::thread::Builder::new()
        .name("nvmf-control".into())
        .spawn(move || {
            while !stop.load(Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if let Err(e) = serve_client(stream, &control) {
                            tracing::info!("control client: {e}");
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(POLL),
                    Err(e) => {
                        tracing::warn!("control socket accept: {e}");
                        std::thread::sleep(POLL);
                    }
                }
            }
            let _ = std::fs::remove_file(&path);
        })
        .map_err(|e| format!("cannot start the control thread: {e}"))
}

/// Answers each line of one client until it closes, stalls or overstays.
fn serve_client(stream: UnixStream, control: &Control) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    stream.set_write_timeout(Some(READ_TIMEOUT))?;
    let mut out = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let start = Instant::now();
    let mut line = Vec::new();
    while start.elapsed() < CLIENT_LIMIT {
        line.clear();
        // One byte more than allowed tells a too-long line from one that fits.
        let n = (&mut reader).take(MAX_REQUEST_LEN as u64 + 1).read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        let reply = if line.len() > MAX_REQUEST_LEN && !line.ends_with(b"\n") {
            let reply = serde_json::json!({ "ok": false, "error": format!("request longer than {MAX_REQUEST_LEN} bytes") });
            writeln!(out, "{reply}")?;
            return Ok(()); // the rest of that line cannot be told from a next request
        } else {
            match std::str::from_utf8(&line) {
                Ok(t) if t.trim().is_empty() => continue,
                Ok(t) => control.handle_json(t),
                Err(_) => serde_json::json!({ "ok": false, "error": "request is not UTF-8" }),
            }
        };
        writeln!(out, "{reply}")?;
    }
    Ok(())
}
