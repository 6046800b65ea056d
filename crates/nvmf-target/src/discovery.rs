//! The discovery log page (log 0x70): one record per exported subsystem and port, limited to
//! the subsystems the asking host may connect to.

use crate::config::PortTls;
use crate::core::Target;
use nvmf_proto::discovery::{
    DiscoveryLogEntry, DiscoveryLogPage, SECTYPE_NONE, SECTYPE_TLS13, SUBTYPE_NVME, TREQ_DISABLE_SQFLOW, TREQ_NOT_REQUIRED,
    TREQ_NOT_SPECIFIED, TREQ_REQUIRED, HEADER_LEN, ENTRY_LEN,
};

/// TREQ's secure channel bits and TSAS's SECTYPE for a port, as nvmet reports them: `addr_tsas`
/// tls1.3 sets SECTYPE 2 (TLS 1.3) and, unless `addr_treq` says "not required", TREQ "required".
pub fn secure_channel(tls: PortTls) -> (u8, u8) {
    match tls {
        PortTls::None => (TREQ_NOT_SPECIFIED, SECTYPE_NONE),
        PortTls::Allowed => (TREQ_NOT_REQUIRED, SECTYPE_TLS13),
        PortTls::Required => (TREQ_REQUIRED, SECTYPE_TLS13),
    }
}


/// The page for `hostnqn`: each entry's TRTYPE, ADRFAM, TREQ and TSAS come from the
/// capabilities of its port's transport.
pub fn log_page(target: &Target, hostnqn: &str) -> Vec<u8> {
    let mut entries = Vec::new();
    // Per entry, TSAS bytes 1 and 2 (the entry encoding carries byte 0 only, as SECTYPE).
    let mut tsas_tails = Vec::new();
    for port in &target.ports {
        let caps = port.transport.capabilities(&target.settings);
        let (treq, tsas) = if caps.secure_channel {
            let (treq, sectype) = secure_channel(port.tls);
            (treq, [sectype, 0, 0])
        } else {
            (TREQ_NOT_SPECIFIED, caps.tsas)
        };
        for s in target.subsystems().iter().filter(|s| port.exports(&s.nqn) && s.allows(hostnqn)) {
            tsas_tails.push([tsas[1], tsas[2]]);
            entries.push(DiscoveryLogEntry {
                trtype: caps.trtype,
                adrfam: caps.adrfam(&port.addr),
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
                sectype: tsas[0],
            });
        }
    }
    let mut page = DiscoveryLogPage { genctr: target.generation(), entries }.encode();
    for (i, tail) in tsas_tails.iter().enumerate().filter(|(_, t)| **t != [0, 0]) {
        let tsas = HEADER_LEN + i * ENTRY_LEN + 768;
        if let Some(b) = page.get_mut(tsas + 1..tsas + 3) {
            b.copy_from_slice(tail);
        }
    }
    page
}
