//! Which files `add_namespace` may open: only those under the directories the target's config
//! allows (`[control] allow_paths`, `--control-allow-path`; default: the directories of the file
//! namespaces configured at start). Whoever holds the control socket can export a file to any
//! allowed host, so `/etc/shadow` must not be one.

use crate::config::{BackendConfig, TargetConfig};
use std::path::{Path, PathBuf};

/// The directories a namespace's file may lie under, as configured (not yet resolved).
pub fn allowed_dirs(config: &TargetConfig) -> Vec<PathBuf> {
    if let Some(dirs) = &config.target.control_allow_paths {
        return dirs.clone();
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    for ns in config.subsystems.iter().flat_map(|s| &s.namespaces) {
        if let BackendConfig::File { path } = &ns.backend {
            // A relative file name lies in the directory the target was started in.
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs
}

/// `path` with symbolic links and `..` resolved, when it lies under one of `allowed`; the
/// resolved path is what gets opened, so a link cannot lead out of an allowed directory.
pub fn check(path: &Path, allowed: &[PathBuf]) -> Result<PathBuf, String> {
    let real = std::fs::canonicalize(path).map_err(|e| format!("path {}: {e}", path.display()))?;
    if allowed.iter().filter_map(|d| std::fs::canonicalize(d).ok()).any(|d| real.starts_with(d)) {
        return Ok(real);
    }
    let dirs = if allowed.is_empty() {
        "none: the target was started without file namespaces".to_string()
    } else {
        allowed.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
    };
    Err(format!(
        "path {} is outside the directories allowed for namespaces added at run time ({dirs}); allow its directory with [control] allow_paths or --control-allow-path",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{NamespaceConfig, SubsystemConfig};

    fn with_file_namespace(path: &str) -> TargetConfig {
        let mut c = TargetConfig::empty();
        let mut s = SubsystemConfig::new("nqn.x");
        s.namespaces.push(NamespaceConfig { nsid: 1, backend: BackendConfig::File { path: path.into() }, block_size: 512, nguid: None, uuid: None });
        c.subsystems.push(s);
        c
    }

    #[test]
    fn the_default_is_the_directories_of_the_configured_file_namespaces() {
        assert_eq!(allowed_dirs(&with_file_namespace("/srv/img/a.img")), vec![PathBuf::from("/srv/img")]);
        assert_eq!(allowed_dirs(&with_file_namespace("a.img")), vec![PathBuf::from(".")]);
        assert!(allowed_dirs(&TargetConfig::empty()).is_empty());
        let mut c = with_file_namespace("/srv/img/a.img");
        c.target.control_allow_paths = Some(vec!["/data".into()]);
        assert_eq!(allowed_dirs(&c), vec![PathBuf::from("/data")], "configured: only those");
    }

    #[test]
    fn files_outside_the_allowed_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join("ns.img");
        std::fs::write(&inside, b"x").unwrap();
        let allowed = vec![dir.path().to_path_buf()];
        assert_eq!(check(&inside, &allowed).unwrap(), std::fs::canonicalize(&inside).unwrap());
        let e = check(Path::new("/etc/shadow"), &allowed).unwrap_err();
        assert!(e.contains("/etc/shadow is outside") && e.contains("allow_paths"), "{e}");
        // Neither `..` nor a link leads out.
        let e = check(&dir.path().join("../../etc/passwd"), &allowed).unwrap_err();
        assert!(e.contains("outside"), "{e}");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
        assert!(check(&link, &allowed).unwrap_err().contains("outside"));
        let e = check(&inside, &[]).unwrap_err();
        assert!(e.contains("none: the target was started without file namespaces"), "{e}");
    }
}
