//! What the integration tests share: the real target, in process on an ephemeral loopback port.

use std::path::Path;

/// A target serving `nqn` to any host with one namespace (`backend` null or ram, `size` like "16MiB").
pub fn start_target(nqn: &str, backend: &str, size: &str) -> nvmf_target::RunningTarget {
    let cfg = format!(
        r#"
[[port]]
addr = "127.0.0.1:0"

[[subsystem]]
nqn = "{nqn}"
allow_any_host = true
  [[subsystem.namespace]]
  nsid = 1
  backend = "{backend}"
  size = "{size}"
"#
    );
    let config = nvmf_target::config::toml::parse(&cfg, Path::new("test.toml")).expect("config");
    nvmf_target::start(config).expect("target starts")
}
