//! Which reactor serves a queue, decided once its Connect names the subsystem and host.

use crate::config::TargetConfig;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Queue placement: host map first, then the subsystem's fixed reactor, else round robin.
pub struct Placement {
    host_map: Vec<(String, usize)>,
    subsys_map: Vec<(String, usize)>,
    reactors: usize,
    next: AtomicUsize,
}

impl Placement {
    pub fn new(config: &TargetConfig) -> Placement {
        Placement {
            host_map: config.host_map.iter().map(|h| (h.hostnqn.clone(), h.reactor)).collect(),
            subsys_map: config.subsystems.iter().filter_map(|s| Some((s.nqn.clone(), s.reactor?))).collect(),
            reactors: config.target.cores.len(),
            next: AtomicUsize::new(0),
        }
    }

    pub fn pick(&self, subnqn: &str, hostnqn: &str) -> usize {
        if let Some((_, r)) = self.host_map.iter().find(|(h, _)| h == hostnqn) {
            return *r;
        }
        if let Some((_, r)) = self.subsys_map.iter().find(|(s, _)| s == subnqn) {
            return *r;
        }
        self.next.fetch_add(1, Relaxed) % self.reactors
    }
}
