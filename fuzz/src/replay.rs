//! Replays saved fuzz inputs through a driver: the committed corpus (`fuzz/corpus/<target>`)
//! and the inputs that once crashed or hung (`fuzz/regressions/<target>`). Each input runs on
//! its own thread under a time limit, so a regression that hangs fails the test by name
//! instead of hanging the suite.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::Duration;

/// Runs every saved input of `target`; returns how many ran. Panics naming the first input
/// that panics or takes longer than `limit`.
pub fn replay(fuzz_dir: &Path, target: &str, run: fn(&[u8]), limit: Duration) -> usize {
    let files = inputs(fuzz_dir, target);
    for path in &files {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let name = path.display().to_string();
        let (done, finished) = channel();
        let worker = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                run(&data);
                let _ = done.send(());
            })
            .expect("spawn replay thread");
        match finished.recv_timeout(limit) {
            Ok(()) => worker.join().expect("replay thread"),
            Err(RecvTimeoutError::Disconnected) => {
                let _ = worker.join();
                panic!("{name}: the {target} driver panicked on this input (message above)");
            }
            Err(RecvTimeoutError::Timeout) => panic!("{name}: the {target} driver did not finish within {limit:?}"),
        }
    }
    files.len()
}

fn inputs(fuzz_dir: &Path, target: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for kind in ["corpus", "regressions"] {
        let Ok(dir) = std::fs::read_dir(fuzz_dir.join(kind).join(target)) else { continue };
        files.extend(dir.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()));
    }
    files.sort();
    files
}
