//! Compiles src/shim.c (the fio side of the engine) against fio's own headers.
//!
//! fio's headers need the `config-host.h` that fio's `./configure` writes, and Debian ships no
//! headers at all, so the source tree is found, unpacked into OUT_DIR and configured once:
//!
//! 1. `NVMFLAB_FIO_SRC`: a fio source tarball, or a fio source directory (configured or not);
//!    when set to a path that does not exist, nothing else is tried (a stub is built);
//! 2. `<workspace>/../shared/peers/fio-3.33.tar.gz`;
//! 3. `/work/shared/peers/fio-3.33.tar.gz`.
//!
//! When none is found (or compiling fails) the crate still builds, as a stub whose
//! `get_ioengine` explains what is missing, and cargo prints a warning; with
//! `NVMFLAB_FIO_REQUIRE=1` (set by `make fio-engine`) that is an error instead.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARBALL: &str = "fio-3.33.tar.gz";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-env-changed=NVMFLAB_FIO_SRC");
    println!("cargo:rerun-if-env-changed=NVMFLAB_FIO_REQUIRE");
    println!("cargo:rustc-check-cfg=cfg(nvmf_fio_shim)");
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    match build_shim(&out) {
        Ok(src) => {
            println!("cargo:rustc-link-search=native={}", out.display());
            println!("cargo:rustc-link-lib=static=nvmf_fio_shim");
            println!("cargo:rustc-cfg=nvmf_fio_shim");
            println!("cargo:rustc-env=NVMF_FIO_HEADERS={}", src.display());
        }
        Err(why) => {
            if env::var("NVMFLAB_FIO_REQUIRE").is_ok_and(|v| v == "1") {
                panic!("nvmf-fio: cannot build the fio engine: {why}");
            }
            println!("cargo:warning=nvmf-fio: built as a stub without fio support: {why}");
            println!("cargo:rustc-env=NVMF_FIO_STUB_REASON={why}");
        }
    }
}

fn candidates() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(p) = env::var("NVMFLAB_FIO_SRC") {
        if !p.is_empty() {
            v.push(PathBuf::from(p));
        }
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    // crates/nvmf-fio -> workspace root -> its parent's shared/peers
    if let Some(root) = manifest.parent().and_then(Path::parent) {
        v.push(root.join("..").join("shared").join("peers").join(TARBALL));
    }
    v.push(PathBuf::from("/work/shared/peers").join(TARBALL));
    v
}

fn build_shim(out: &Path) -> Result<PathBuf, String> {
    if let Ok(p) = env::var("NVMFLAB_FIO_SRC") {
        if !p.is_empty() && !Path::new(&p).exists() {
            return Err(format!("NVMFLAB_FIO_SRC={p} does not exist"));
        }
    }
    let found = candidates().into_iter().find(|p| p.exists()).ok_or_else(|| {
        format!(
            "no fio source found (set NVMFLAB_FIO_SRC to a fio 3.33 tarball or source directory, \
             or put {TARBALL} in ../shared/peers)"
        )
    })?;
    println!("cargo:rerun-if-changed={}", found.display());
    let tree = configured_tree(&found, out)?;
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let obj = out.join("shim.o");
    let status = Command::new(&cc)
        .args(["-std=gnu99", "-O2", "-g", "-fPIC", "-Wall", "-D_GNU_SOURCE", "-include", "config-host.h"])
        .arg("-I")
        .arg(&tree)
        .args(["-c", "src/shim.c", "-o"])
        .arg(&obj)
        .status()
        .map_err(|e| format!("cannot run {cc}: {e}"))?;
    if !status.success() {
        return Err(format!("{cc} failed on src/shim.c against {}", tree.display()));
    }
    let lib = out.join("libnvmf_fio_shim.a");
    let _ = fs::remove_file(&lib);
    let ar = env::var("AR").unwrap_or_else(|_| "ar".into());
    let status = Command::new(&ar).arg("crs").arg(&lib).arg(&obj).status().map_err(|e| format!("cannot run {ar}: {e}"))?;
    if !status.success() {
        return Err(format!("{ar} failed"));
    }
    Ok(found)
}

/// A fio source directory with config-host.h: the given one if already configured, else a
/// copy (or the unpacked tarball) under OUT_DIR, configured there once.
fn configured_tree(found: &Path, out: &Path) -> Result<PathBuf, String> {
    if found.is_dir() && found.join("config-host.h").exists() && found.join("fio.h").exists() {
        return Ok(found.to_path_buf());
    }
    let work = out.join("fio-src");
    let stamp = out.join("fio-src.stamp");
    let key = found.display().to_string();
    if fs::read_to_string(&stamp).ok().as_deref() == Some(key.as_str()) {
        if let Some(dir) = find_fio_dir(&work) {
            if dir.join("config-host.h").exists() {
                return Ok(dir);
            }
        }
    }
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| format!("mkdir {}: {e}", work.display()))?;
    let status = if found.is_dir() {
        Command::new("cp").arg("-a").arg(found).arg(&work).status()
    } else {
        Command::new("tar").arg("xzf").arg(found).arg("-C").arg(&work).status()
    }
    .map_err(|e| format!("unpacking {}: {e}", found.display()))?;
    if !status.success() {
        return Err(format!("cannot unpack {}", found.display()));
    }
    let dir = find_fio_dir(&work).ok_or_else(|| format!("{} holds no fio source (no fio.h)", found.display()))?;
    let log = out.join("fio-configure.log");
    let logf = fs::File::create(&log).map_err(|e| e.to_string())?;
    let status = Command::new("./configure")
        .arg("--disable-native")
        .current_dir(&dir)
        .stdout(logf.try_clone().map_err(|e| e.to_string())?)
        .stderr(logf)
        .status()
        .map_err(|e| format!("cannot run fio's ./configure: {e}"))?;
    if !status.success() || !dir.join("config-host.h").exists() {
        return Err(format!("fio's ./configure failed, see {}", log.display()));
    }
    fs::write(&stamp, key).map_err(|e| e.to_string())?;
    Ok(dir)
}

fn find_fio_dir(work: &Path) -> Option<PathBuf> {
    if work.join("fio.h").exists() {
        return Some(work.to_path_buf());
    }
    fs::read_dir(work).ok()?.flatten().map(|e| e.path()).find(|p| p.join("fio.h").exists())
}
