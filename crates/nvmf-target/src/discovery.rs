//! The discovery log page (log 0x70): one record per exported subsystem and port, limited to
//! the subsystems the asking host may connect to.

use crate::config::PortTls;
use crate::core::Target;
use nvmf_proto::discovery::{
    DiscoveryLogEntry, DiscoveryLogPage, ADRFAM_IPV4, ADRFAM_IPV6, SECTYPE_NONE, SECTYPE_TLS13, SUBTYPE_NVME, TREQ_DISABLE_SQFLOW,
    TREQ_NOT_REQUIRED, TREQ_NOT_SPECIFIED, TREQ_REQUIRED, TRTYPE_TCP, HEADER_LEN, ENTRY_LEN,
};

/// TRTYPE RDMA, and its TSAS (as nvmet reports it): QP type reliable connected, no provider
/// type, RDMA CM.
const TRTYPE_RDMA: u8 = 1;
const RDMA_QPTYPE_CONNECTED: u8 = 1;
const RDMA_PRTYPE_NOT_SPECIFIED: u8 = 1;
const RDMA_CMS_RDMA_CM: u8 = 1;

/// TREQ's secure channel bits and TSAS's SECTYPE for a port, as nvmet reports them: `addr_tsas`
/// tls1.3 sets SECTYPE 2 (TLS 1.3) and, unless `addr_treq` says "not required", TREQ "required".
pub fn secure_channel(tls: PortTls) -> (u8, u8) {
    match tls {
        PortTls::None => (TREQ_NOT_SPECIFIED, SECTYPE_NONE),
        PortTls::Allowed => (TREQ_NOT_REQUIRED, SECTYPE_TLS13),
        PortTls::Required => (TREQ_REQUIRED, SECTYPE_TLS13),
    }
}


pub fn log_page(target: &Target, hostnqn: &str) -> Vec<u8> {
    let mut entries = Vec::new();
    let mut rdma_entries = Vec::new();
    for port in &target.ports {
        let (treq, sectype) = if port.rdma { (TREQ_NOT_SPECIFIED, RDMA_QPTYPE_CONNECTED) } else { secure_channel(port.tls) };
        for s in target.subsystems().iter().filter(|s| port.exports(&s.nqn) && s.allows(hostnqn)) {
            if port.rdma {
                rdma_entries.push(entries.len());
            }
            entries.push(DiscoveryLogEntry {
                trtype: if port.rdma { TRTYPE_RDMA } else { TRTYPE_TCP },
                adrfam: if port.addr.is_ipv4() { ADRFAM_IPV4 } else { ADRFAM_IPV6 },
                subtype: SUBTYPE_NVME,
                // As nvmet: nvme-cli names only this combination with the SQ flow control bit.
                treq: treq | TREQ_DISABLE_SQFLOW,
                portid: port.portid,
                cntlid: nvmf_proto::fabrics::CNTLID_DYNAMIC,
                asqsz: 32,
                eflags: 0,
                trsvcid: port.addr.port().to_string(),
                subnqn: s.nqn.clone(),
                traddr: port.addr.ip().to_string(),
                sectype,
            });
        }
    }
    let mut page = DiscoveryLogPage { genctr: target.generation(), entries }.encode();
    // The RDMA TSAS's other two bytes (QP type went in as the first, where TCP has SECTYPE).
    for i in rdma_entries {
        let tsas = HEADER_LEN + i * ENTRY_LEN + 768;
        if let Some(b) = page.get_mut(tsas + 1..tsas + 3) {
            b.copy_from_slice(&[RDMA_PRTYPE_NOT_SPECIFIED, RDMA_CMS_RDMA_CM]);
        }
    }
    page
}
