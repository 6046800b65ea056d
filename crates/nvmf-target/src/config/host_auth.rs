//! Per-host DH-HMAC-CHAP settings, as nvmet keeps them under `hosts/<nqn>/`: the host's secret
//! (`dhchap_key`), the controller's secret for bidirectional authentication (`dhchap_ctrl_key`),
//! the hash (`dhchap_hash`) and the DH group (`dhchap_dhgroup`). A host with a key must
//! authenticate every queue it connects to a subsystem (discovery excepted).

use super::ConfigError;
use nvmf_proto::auth::{DhGroup, HashId, Secret};

#[derive(Debug, Clone, PartialEq)]
pub struct HostAuthConfig {
    pub nqn: String,
    pub dhchap_key: Secret,
    pub dhchap_ctrl_key: Option<Secret>,
    pub dhchap_hash: HashId,
    pub dhchap_dhgroup: DhGroup,
}

/// The four fields as a config file writes them (all text).
#[derive(Debug, Default)]
pub struct RawHostAuth<'a> {
    pub key: Option<&'a str>,
    pub ctrl_key: Option<&'a str>,
    pub hash: Option<&'a str>,
    pub dhgroup: Option<&'a str>,
}

impl HostAuthConfig {
    /// Checks and parses the fields of host `nqn`; `at` names the entry in errors. Ok(None) when
    /// the entry configures no key (a host entry without authentication).
    pub fn from_raw(
        origin: &str,
        at: &str,
        nqn: &str,
        raw: RawHostAuth,
    ) -> Result<Option<HostAuthConfig>, ConfigError> {
        let bad = |msg: String| ConfigError::invalid(origin, format!("{at}: {msg}"));
        let secret = |name: &str, text: Option<&str>| -> Result<Option<Secret>, ConfigError> {
            // nvmetcli saves an unset key as an empty string.
            match text.map(str::trim).filter(|t| !t.is_empty()) {
                None => Ok(None),
                Some(t) => Secret::parse(t).map(Some).map_err(|e| bad(format!("{name}: {e}"))),
            }
        };
        let key = secret("dhchap_key", raw.key)?;
        let ctrl_key = secret("dhchap_ctrl_key", raw.ctrl_key)?;
        let hash = match raw.hash.map(str::trim).filter(|t| !t.is_empty()) {
            None => HashId::Sha256,
            Some(h) => HashId::parse(h)
                .ok_or_else(|| bad(format!("dhchap_hash = {h:?}: expected sha256, sha384 or sha512")))?,
        };
        let dhgroup = match raw.dhgroup.map(str::trim).filter(|t| !t.is_empty()) {
            None => DhGroup::Null,
            Some(g) => DhGroup::parse(g).ok_or_else(|| {
                bad(format!(
                    "dhchap_dhgroup = {g:?}: expected null, ffdhe2048, ffdhe3072, ffdhe4096, ffdhe6144 or ffdhe8192"
                ))
            })?,
        };
        match (key, ctrl_key) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(bad("dhchap_ctrl_key needs dhchap_key too (the host authenticates first)".into())),
            (Some(dhchap_key), dhchap_ctrl_key) => Ok(Some(HostAuthConfig {
                nqn: nqn.to_string(),
                dhchap_key,
                dhchap_ctrl_key,
                dhchap_hash: hash,
                dhchap_dhgroup: dhgroup,
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

    #[test]
    fn fields_parse_with_defaults() {
        let raw = RawHostAuth { key: Some(KEY), ..Default::default() };
        let h = HostAuthConfig::from_raw("f", "host[0]", "nqn.h", raw).unwrap().unwrap();
        assert_eq!((h.dhchap_hash, h.dhchap_dhgroup), (HashId::Sha256, DhGroup::Null));
        assert_eq!(h.dhchap_key.key.len(), 32);
        let raw =
            RawHostAuth { key: Some(KEY), ctrl_key: Some(KEY), hash: Some("hmac(sha512)"), dhgroup: Some("ffdhe3072") };
        let h = HostAuthConfig::from_raw("f", "host[0]", "nqn.h", raw).unwrap().unwrap();
        assert_eq!((h.dhchap_hash, h.dhchap_dhgroup), (HashId::Sha512, DhGroup::Ffdhe3072));
        assert!(h.dhchap_ctrl_key.is_some());
        assert_eq!(
            HostAuthConfig::from_raw("f", "h", "n", RawHostAuth { key: Some(""), ..Default::default() }).unwrap(),
            None
        );
    }

    #[test]
    fn mistakes_name_the_field() {
        let e = |raw| HostAuthConfig::from_raw("f.toml", "host[1]", "n", raw).unwrap_err().to_string();
        let m = e(RawHostAuth { key: Some("DHHC-1:00:xx:"), ..Default::default() });
        assert!(m.contains("host[1]") && m.contains("dhchap_key"), "{m}");
        let m = e(RawHostAuth { key: Some(KEY), hash: Some("md5"), ..Default::default() });
        assert!(m.contains("dhchap_hash"), "{m}");
        let m = e(RawHostAuth { key: Some(KEY), dhgroup: Some("modp"), ..Default::default() });
        assert!(m.contains("dhchap_dhgroup"), "{m}");
        let m = e(RawHostAuth { ctrl_key: Some(KEY), ..Default::default() });
        assert!(m.contains("needs dhchap_key"), "{m}");
    }
}
