//! The TOML config parser on arbitrary text: it returns a config or an error with a message
//! and a position, never panics; a config it accepts passes validation again and can start
//! nothing unexpected (its fields are only read here).

use std::path::Path;

pub fn run(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    match nvmf_target::config::toml::parse(&text, Path::new("fuzz.toml")) {
        Ok(config) => check_accepted(&config),
        Err(e) => assert!(!e.to_string().is_empty(), "an empty error message"),
    }
}

/// Whatever a parser accepts is a config `validate` agrees with.
pub fn check_accepted(config: &nvmf_target::TargetConfig) {
    if let Err(e) = config.validate("fuzz") {
        panic!("the parser accepted a config that validate() rejects: {e}");
    }
}
