//! The discovery log page (log 0x70): one record per exported subsystem and port, limited to
//! the subsystems the asking host may connect to.

use crate::core::Target;
use nvmf_proto::discovery::{
    DiscoveryLogEntry, DiscoveryLogPage, ADRFAM_IPV4, ADRFAM_IPV6, SECTYPE_NONE, SUBTYPE_NVME, TREQ_DISABLE_SQFLOW, TREQ_NOT_SPECIFIED,
    TRTYPE_TCP,
};

/// Changes only with the configuration, which is fixed for the life of the process.
pub const GENCTR: u64 = 1;

pub fn log_page(target: &Target, hostnqn: &str) -> Vec<u8> {
    let mut entries = Vec::new();
    for port in &target.ports {
        for s in target.subsystems.iter().filter(|s| port.exports(&s.nqn) && s.allows(hostnqn)) {
            entries.push(DiscoveryLogEntry {
                trtype: TRTYPE_TCP,
                adrfam: if port.addr.is_ipv4() { ADRFAM_IPV4 } else { ADRFAM_IPV6 },
                subtype: SUBTYPE_NVME,
                // As nvmet: nvme-cli names only this combination with the SQ flow control bit.
                treq: TREQ_NOT_SPECIFIED | TREQ_DISABLE_SQFLOW,
                portid: port.portid,
                cntlid: nvmf_proto::fabrics::CNTLID_DYNAMIC,
                asqsz: 32,
                eflags: 0,
                trsvcid: port.addr.port().to_string(),
                subnqn: s.nqn.clone(),
                traddr: port.addr.ip().to_string(),
                sectype: SECTYPE_NONE,
            });
        }
    }
    DiscoveryLogPage { genctr: GENCTR, entries }.encode()
}
