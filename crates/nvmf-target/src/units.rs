//! Sizes as the CLI, the TOML file and the model backend's parameters write them. Imports
//! nothing from the crate, so config/ and backend/ both use it without importing each other.
//! The parsing itself is `nvmf_proto::units`, shared with the host's `nvmf-perf`.

/// Parses sizes as the CLI and the TOML file write them: `512`, `4k`, `1m`, `64MiB`, `1GiB`
/// (k/m/g/t and KiB/MiB/GiB/TiB are powers of 1024); `None` when it is not one. The callers
/// name the option in their own error.
pub fn parse_size(s: &str) -> Option<u64> {
    nvmf_proto::units::parse_size(s).ok()
}
