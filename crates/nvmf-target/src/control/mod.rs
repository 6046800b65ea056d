//! The runtime control surface: requests that change a running target's hosts (and their
//! DH-HMAC-CHAP keys, hash and DH group), subsystems, allowed hosts and namespaces without a
//! restart, so connections open at that moment stay up. docs/control.md describes the requests.
//!
//! Every change is made to a copy of the target's configuration first and checked by the same
//! [`TargetConfig::validate`] a config file goes through; only a change that passes (and whose
//! backend opens) reaches the running target. Changes are serialized by one mutex.
//!
//! What a change means for a controller that is already connected:
//! - host keys, hash, DH group: the next authentication of any queue uses them (a new queue, or a
//!   re-authentication the host starts on a live queue);
//! - allowed hosts: checked at Connect, so they gate the next Connect;
//! - disable/remove a namespace: inactive at once for every controller (I/O gets Invalid
//!   Namespace, Identify reads zeroes); enable makes it active again;
//! - add a namespace: active at once for every controller; connected controllers whose host
//!   enabled Namespace Attribute Notices get that event (and the nsid in log page 04h), so the
//!   host rescans. Disable, enable and remove raise it too;
//! - remove a subsystem: its controllers end, as nvmet's;
//! - qid_max: the subsystem's controllers end, as nvmet's, and their hosts reconnect and are
//!   granted at most that many I/O queues.

pub mod paths;
pub mod request;
pub mod socket;

use crate::config::host_auth::RawHostAuth;
use crate::config::{BackendConfig, HostAuthConfig, NamespaceConfig, SubsystemConfig, TargetConfig};
use crate::core::{Namespace, Subsystem, Target, MAX_IO_QUEUES};
use request::{NamespaceSpec, Request};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Origin named in configuration errors a request causes.
const ORIGIN: &str = "control";

/// A host's DH-HMAC-CHAP fields as text, kept even while the host has no key yet (nvmet lets a
/// hash or group be set before the key).
#[derive(Debug, Clone, Default)]
struct HostFields {
    key: String,
    ctrl_key: String,
    hash: String,
    dhgroup: String,
}

impl HostFields {
    fn from_config(h: &HostAuthConfig) -> HostFields {
        HostFields {
            key: h.dhchap_key.encode(),
            ctrl_key: h.dhchap_ctrl_key.as_ref().map(|k| k.encode()).unwrap_or_default(),
            hash: h.dhchap_hash.name().to_string(),
            dhgroup: h.dhchap_dhgroup.name().to_string(),
        }
    }

    fn parse(&self, nqn: &str) -> Result<Option<HostAuthConfig>, String> {
        let raw = RawHostAuth {
            key: Some(&self.key),
            ctrl_key: Some(&self.ctrl_key),
            hash: Some(&self.hash),
            dhgroup: Some(&self.dhgroup),
        };
        HostAuthConfig::from_raw(ORIGIN, &format!("host {nqn}"), nqn, raw).map_err(|e| e.to_string())
    }
}

struct State {
    config: TargetConfig,
    hosts: BTreeMap<String, HostFields>,
}

/// The control surface of one running target.
pub struct Control {
    target: Arc<Target>,
    state: Mutex<State>,
    /// Directories `add_namespace` may open files under (paths.rs), fixed at start.
    allowed_dirs: Vec<std::path::PathBuf>,
}

impl Control {
    /// `config` is what the target was started with.
    pub fn new(target: Arc<Target>, config: TargetConfig) -> Control {
        let hosts = config.hosts.iter().map(|h| (h.nqn.clone(), HostFields::from_config(h))).collect();
        let allowed_dirs = paths::allowed_dirs(&config);
        Control { target, state: Mutex::new(State { config, hosts }), allowed_dirs }
    }

    /// Parses and applies one request (a JSON text); the reply is a JSON object with `ok`.
    pub fn handle_json(&self, text: &str) -> Value {
        match request::parse(text).and_then(|r| self.apply(r)) {
            Ok(v) => v,
            Err(e) => json!({ "ok": false, "error": e }),
        }
    }

    /// Applies one request. Err is the message for the client.
    pub fn apply(&self, req: Request) -> Result<Value, String> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let done = json!({ "ok": true });
        match req {
            Request::Show {} => Ok(self.show(&st)),
            Request::SetHost { nqn, dhchap_key, dhchap_ctrl_key, dhchap_hash, dhchap_dhgroup } => {
                request::check_nqn("nqn", &nqn)?;
                let mut f = st.hosts.get(&nqn).cloned().unwrap_or_default();
                for (field, value) in [
                    (&mut f.key, dhchap_key),
                    (&mut f.ctrl_key, dhchap_ctrl_key),
                    (&mut f.hash, dhchap_hash),
                    (&mut f.dhgroup, dhchap_dhgroup),
                ] {
                    if let Some(v) = value {
                        *field = v;
                    }
                }
                let auth = f.parse(&nqn)?;
                st.config.hosts.retain(|h| h.nqn != nqn);
                st.config.hosts.extend(auth.clone());
                st.hosts.insert(nqn.clone(), f);
                tracing::info!(host = %nqn, key = auth.is_some(), "control: host DH-HMAC-CHAP settings changed");
                self.target.set_host_auth(&nqn, auth);
                Ok(done)
            }
            Request::RemoveHost { nqn } => {
                if st.hosts.remove(&nqn).is_none() {
                    return Err(format!("no host {nqn:?} has DH-HMAC-CHAP settings"));
                }
                st.config.hosts.retain(|h| h.nqn != nqn);
                self.target.set_host_auth(&nqn, None);
                tracing::info!(host = %nqn, "control: host DH-HMAC-CHAP settings removed");
                Ok(done)
            }
            Request::AddSubsystem { nqn, allow_any_host, hosts, serial, model } => {
                request::check_nqn("nqn", &nqn)?;
                hosts.iter().try_for_each(|h| request::check_nqn("hosts", h))?;
                if st.config.subsystems.iter().any(|s| s.nqn == nqn) {
                    return Err(format!("subsystem {nqn:?} exists already"));
                }
                let s = SubsystemConfig { allow_any_host, hosts, serial, model, ..SubsystemConfig::new(nqn.clone()) };
                let mut next = st.config.clone();
                next.subsystems.push(s.clone());
                next.validate(ORIGIN).map_err(|e| e.to_string())?;
                let opened = Subsystem::open(&s).map_err(|e| e.to_string())?;
                self.target.put_subsystem(Arc::new(opened));
                st.config = next;
                tracing::info!(subsystem = %nqn, "control: subsystem added");
                Ok(done)
            }
            Request::RemoveSubsystem { nqn } => {
                let before = st.config.subsystems.len();
                st.config.subsystems.retain(|s| s.nqn != nqn);
                if st.config.subsystems.len() == before {
                    return Err(format!("no subsystem {nqn:?}"));
                }
                self.target.remove_subsystem(&nqn);
                tracing::info!(subsystem = %nqn, "control: subsystem removed");
                Ok(done)
            }
            Request::AllowHost { subsystem, host } => {
                request::check_nqn("host", &host)?;
                self.change_hosts(&mut st, &subsystem, |allow_any, hosts| {
                    if !hosts.contains(&host) {
                        hosts.push(host.clone());
                    }
                    Ok(allow_any)
                })
            }
            Request::DisallowHost { subsystem, host } => self.change_hosts(&mut st, &subsystem, |allow_any, hosts| {
                let before = hosts.len();
                hosts.retain(|h| *h != host);
                if hosts.len() == before {
                    return Err(format!("host {host:?} is not in the allowed hosts of {subsystem:?}"));
                }
                Ok(allow_any)
            }),
            Request::SetAllowAnyHost { subsystem, allow } => {
                self.change_hosts(&mut st, &subsystem, |_, _| Ok(allow))
            }
            Request::SetQidMax { subsystem, qid_max } => {
                if !(1..=MAX_IO_QUEUES).contains(&qid_max) {
                    return Err(format!("qid_max must be 1..={MAX_IO_QUEUES}, not {qid_max}"));
                }
                let (_, live) = Self::find(&st, &self.target, &subsystem)?;
                self.target.put_subsystem(Arc::new(live.with_max_qid(qid_max)));
                let ended = self.target.end_controllers(&subsystem);
                tracing::info!(%subsystem, qid_max, ended, "control: qid_max changed, controllers ended to reconnect");
                Ok(done)
            }
            Request::AddNamespace(spec) => self.add_namespace(&mut st, spec),
            Request::RemoveNamespace { subsystem, nsid } => {
                let (si, live) = Self::find(&st, &self.target, &subsystem)?;
                let ns = live.namespaces.iter().find(|n| n.nsid == nsid).cloned().ok_or_else(|| no_ns(&subsystem, nsid))?;
                let kept: Vec<_> = live.namespaces.iter().filter(|n| n.nsid != nsid).cloned().collect();
                ns.set_enabled(false);
                self.target.put_subsystem(Arc::new(live.changed(live.allow_any_host, live.hosts.clone(), kept)));
                st.config.subsystems[si].namespaces.retain(|n| n.nsid != nsid);
                self.target.namespace_changed(&subsystem, nsid);
                tracing::info!(%subsystem, nsid, "control: namespace removed");
                Ok(done)
            }
            Request::EnableNamespace { subsystem, nsid } => self.set_enabled(&st, &subsystem, nsid, true),
            Request::DisableNamespace { subsystem, nsid } => self.set_enabled(&st, &subsystem, nsid, false),
        }
    }

    fn set_enabled(&self, st: &State, subsystem: &str, nsid: u32, on: bool) -> Result<Value, String> {
        let (_, live) = Self::find(st, &self.target, subsystem)?;
        let ns = live.namespaces.iter().find(|n| n.nsid == nsid).ok_or_else(|| no_ns(subsystem, nsid))?;
        if ns.enabled() != on {
            ns.set_enabled(on);
            self.target.namespace_changed(subsystem, nsid);
        }
        tracing::info!(%subsystem, nsid, enabled = on, "control: namespace {}", if on { "enabled" } else { "disabled" });
        Ok(json!({ "ok": true }))
    }

    /// The configured subsystem's index and the running one.
    fn find(st: &State, target: &Target, nqn: &str) -> Result<(usize, Arc<Subsystem>), String> {
        let i = st.config.subsystems.iter().position(|s| s.nqn == nqn).ok_or_else(|| format!("no subsystem {nqn:?}"))?;
        let live = target.subsystem(nqn).ok_or_else(|| format!("no subsystem {nqn:?}"))?;
        Ok((i, live))
    }

    /// Changes a subsystem's allowed hosts: `f` edits the list and returns allow_any_host.
    fn change_hosts(
        &self,
        st: &mut State,
        nqn: &str,
        f: impl FnOnce(bool, &mut Vec<String>) -> Result<bool, String>,
    ) -> Result<Value, String> {
        let (i, live) = Self::find(st, &self.target, nqn)?;
        let mut hosts = st.config.subsystems[i].hosts.clone();
        let allow_any = f(st.config.subsystems[i].allow_any_host, &mut hosts)?;
        let mut next = st.config.clone();
        next.subsystems[i].hosts = hosts.clone();
        next.subsystems[i].allow_any_host = allow_any;
        next.validate(ORIGIN).map_err(|e| e.to_string())?;
        self.target.put_subsystem(Arc::new(live.changed(allow_any, hosts, live.namespaces.clone())));
        st.config = next;
        tracing::info!(subsystem = %nqn, allow_any_host = allow_any, "control: allowed hosts changed");
        Ok(json!({ "ok": true }))
    }

    fn add_namespace(&self, st: &mut State, spec: NamespaceSpec) -> Result<Value, String> {
        let subsystem = spec.subsystem.clone();
        let enabled = spec.enabled;
        let mut n: NamespaceConfig = spec.into_config()?;
        if let BackendConfig::File { path } = &n.backend {
            let real = paths::check(path, &self.allowed_dirs).map_err(|e| format!("namespace {}: {e}", n.nsid))?;
            n.backend = BackendConfig::File { path: real };
        }
        let (i, live) = Self::find(st, &self.target, &subsystem)?;
        let mut next = st.config.clone();
        next.subsystems[i].namespaces.push(n.clone());
        next.validate(ORIGIN).map_err(|e| e.to_string())?;
        let ns = Namespace::open(&subsystem, &n).map_err(|e| e.to_string())?;
        // Buffers of every connection are aligned once, at start, for the namespaces then.
        if ns.backend.buffer_align() > self.target.buffer_align {
            return Err(format!(
                "namespace {}: its backend needs {}-byte aligned buffers, this target allocates {}-byte aligned ones (configure such a namespace at start)",
                n.nsid,
                ns.backend.buffer_align(),
                self.target.buffer_align
            ));
        }
        ns.set_enabled(enabled);
        let mut namespaces = live.namespaces.clone();
        namespaces.push(Arc::new(ns));
        self.target.put_subsystem(Arc::new(live.changed(live.allow_any_host, live.hosts.clone(), namespaces)));
        st.config = next;
        if enabled {
            self.target.namespace_changed(&subsystem, n.nsid);
        }
        tracing::info!(%subsystem, nsid = n.nsid, enabled, "control: namespace added");
        Ok(json!({ "ok": true }))
    }

    /// Subsystems, namespaces and hosts as they are now. Keys are never shown, only whether set.
    fn show(&self, st: &State) -> Value {
        let subsystems: Vec<Value> = self
            .target
            .subsystems()
            .iter()
            .map(|s| {
                json!({
                    "nqn": s.nqn,
                    "allow_any_host": s.allow_any_host,
                    "hosts": s.hosts,
                    "qid_max": s.max_qid,
                    "namespaces": s.namespaces.iter().map(|n| json!({
                        "nsid": n.nsid,
                        "enabled": n.enabled(),
                        "blocks": n.nlb,
                        "block_size": n.block_size,
                        "uuid": request::format_uuid(&n.uuid),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let hosts: Vec<Value> = st
            .hosts
            .iter()
            .map(|(nqn, f)| {
                json!({
                    "nqn": nqn,
                    "dhchap_key": !f.key.trim().is_empty(),
                    "dhchap_ctrl_key": !f.ctrl_key.trim().is_empty(),
                    "dhchap_hash": f.hash,
                    "dhchap_dhgroup": f.dhgroup,
                    "authenticates": self.target.host_auth(nqn).is_some(),
                })
            })
            .collect();
        json!({ "ok": true, "generation": self.target.generation(), "subsystems": subsystems, "hosts": hosts })
    }
}

fn no_ns(subsystem: &str, nsid: u32) -> String {
    format!("subsystem {subsystem:?} has no namespace {nsid}")
}
