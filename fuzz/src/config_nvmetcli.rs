//! The nvmetcli JSON (saveconfig) parser on arbitrary text: a config or an error, never a
//! panic; what it accepts validates.

use std::path::Path;

pub fn run(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    match nvmf_target::config::nvmetcli::parse(&text, Path::new("fuzz.json")) {
        Ok(config) => crate::config_toml::check_accepted(&config),
        Err(e) => assert!(!e.to_string().is_empty(), "an empty error message"),
    }
}
