//! `nvmf-perf identify` and `nvmf-perf discover`: what the controller says about itself, its
//! namespaces and the discovery log, for a person (text) or a program (JSON).

use nvmf_proto::discovery::{self as disc, DiscoveryLogEntry, DiscoveryLogPage};
use nvmf_proto::identify::{IdentifyController, IdentifyNamespace};
use serde_json::{json, Value};

/// Identify data of one controller and the namespaces asked for.
#[derive(Debug, Clone)]
pub struct IdentifyReport {
    pub cntlid: u16,
    pub version: u32,
    pub max_transfer: Option<u64>,
    pub ctrl: IdentifyController,
    pub namespaces: Vec<(u32, IdentifyNamespace)>,
}

fn version_text(vs: u32) -> String {
    format!("{}.{}.{}", vs >> 16, (vs >> 8) & 0xFF, vs & 0xFF)
}

impl IdentifyReport {
    pub fn to_json(&self) -> Value {
        let c = &self.ctrl;
        json!({
            "controller": {
                "cntlid": self.cntlid, "mn": c.mn, "sn": c.sn, "fr": c.fr, "subnqn": c.subnqn,
                "vid": c.vid, "ver": version_text(if c.ver != 0 { c.ver } else { self.version }),
                "ioccsz": c.ioccsz, "iorcsz": c.iorcsz, "in_capsule_data_size": c.in_capsule_data_size(),
                "maxcmd": c.maxcmd, "mdts": c.mdts, "max_transfer_bytes": self.max_transfer,
                "nn": c.nn, "kas": c.kas, "sgls": c.sgls, "oncs": c.oncs, "cntrltype": c.cntrltype,
            },
            "namespaces": self.namespaces.iter().map(|(nsid, n)| json!({
                "nsid": nsid, "nsze": n.nsze, "ncap": n.ncap, "nuse": n.nuse,
                "block_size": n.block_size(), "capacity_bytes": n.nsze.saturating_mul(n.block_size()),
            })).collect::<Vec<_>>(),
        })
    }

    pub fn to_text(&self) -> String {
        let c = &self.ctrl;
        let mut s = String::new();
        s.push_str(&format!("Controller {} of {}\n", self.cntlid, c.subnqn));
        let rows: Vec<(&str, String)> = vec![
            ("model (mn)", c.mn.clone()),
            ("serial (sn)", c.sn.clone()),
            ("firmware (fr)", c.fr.clone()),
            ("subnqn", c.subnqn.clone()),
            ("cntlid", format!("{:#x}", self.cntlid)),
            ("version", version_text(if c.ver != 0 { c.ver } else { self.version })),
            ("ioccsz", format!("{} ({} bytes of in-capsule data)", c.ioccsz, c.in_capsule_data_size())),
            ("iorcsz", c.iorcsz.to_string()),
            ("maxcmd", c.maxcmd.to_string()),
            (
                "mdts",
                match self.max_transfer {
                    Some(b) => format!("{} ({b} bytes per command)", c.mdts),
                    None => format!("{} (no limit)", c.mdts),
                },
            ),
            ("nn", c.nn.to_string()),
            ("kas", format!("{} ({} ms granularity)", c.kas, c.kas as u32 * 100)),
        ];
        for (k, v) in rows {
            s.push_str(&format!("  {k:<14}: {v}\n"));
        }
        for (nsid, n) in &self.namespaces {
            let bytes = n.nsze.saturating_mul(n.block_size());
            s.push_str(&format!("Namespace {nsid}\n"));
            s.push_str(&format!("  {:<14}: {} blocks\n", "nsze", n.nsze));
            s.push_str(&format!("  {:<14}: {} blocks\n", "ncap", n.ncap));
            s.push_str(&format!("  {:<14}: {} blocks\n", "nuse", n.nuse));
            s.push_str(&format!("  {:<14}: {} bytes\n", "block size", n.block_size()));
            s.push_str(&format!("  {:<14}: {bytes} bytes ({:.2} GiB)\n", "capacity", bytes as f64 / (1u64 << 30) as f64));
        }
        s
    }
}

fn trtype(v: u8) -> String {
    match v {
        1 => "rdma".into(),
        2 => "fc".into(),
        disc::TRTYPE_TCP => "tcp".into(),
        254 => "loop".into(),
        v => format!("unknown ({v})"),
    }
}

fn adrfam(v: u8) -> String {
    match v {
        disc::ADRFAM_IPV4 => "ipv4".into(),
        disc::ADRFAM_IPV6 => "ipv6".into(),
        v => format!("unknown ({v})"),
    }
}

fn subtype(v: u8) -> String {
    match v {
        disc::SUBTYPE_REFERRAL => "discovery subsystem referral".into(),
        disc::SUBTYPE_NVME => "nvme subsystem".into(),
        disc::SUBTYPE_CURRENT_DISCOVERY => "current discovery subsystem".into(),
        v => format!("unknown ({v})"),
    }
}

fn treq(v: u8) -> String {
    let secure = match v & 0x3 {
        0 => "not specified",
        1 => "required",
        2 => "not required",
        _ => "reserved",
    };
    if v & disc::TREQ_DISABLE_SQFLOW != 0 {
        format!("{secure}, sq flow control disable supported")
    } else {
        secure.into()
    }
}

fn entry_json(e: &DiscoveryLogEntry) -> Value {
    json!({
        "trtype": trtype(e.trtype), "adrfam": adrfam(e.adrfam), "subtype": subtype(e.subtype),
        "treq": treq(e.treq), "portid": e.portid, "trsvcid": e.trsvcid, "subnqn": e.subnqn,
        "traddr": e.traddr, "cntlid": e.cntlid, "asqsz": e.asqsz, "sectype": e.sectype,
    })
}

pub fn discovery_json(page: &DiscoveryLogPage) -> Value {
    json!({
        "genctr": page.genctr,
        "numrec": page.entries.len(),
        "records": page.entries.iter().map(entry_json).collect::<Vec<_>>(),
    })
}

/// One block per entry, as `nvme discover` prints them.
pub fn discovery_text(page: &DiscoveryLogPage) -> String {
    let mut s = format!(
        "\nDiscovery Log Number of Records {}, Generation counter {}\n",
        page.entries.len(),
        page.genctr
    );
    for (i, e) in page.entries.iter().enumerate() {
        s.push_str(&format!("=====Discovery Log Entry {i}======\n"));
        s.push_str(&format!("trtype:  {}\n", trtype(e.trtype)));
        s.push_str(&format!("adrfam:  {}\n", adrfam(e.adrfam)));
        s.push_str(&format!("subtype: {}\n", subtype(e.subtype)));
        s.push_str(&format!("treq:    {}\n", treq(e.treq)));
        s.push_str(&format!("portid:  {}\n", e.portid));
        s.push_str(&format!("trsvcid: {}\n", e.trsvcid));
        s.push_str(&format!("subnqn:  {}\n", e.subnqn));
        s.push_str(&format!("traddr:  {}\n", e.traddr));
        s.push_str(&format!("sectype: {}\n", if e.sectype == disc::SECTYPE_NONE { "none".into() } else { e.sectype.to_string() }));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_text_has_one_block_per_entry() {
        let e = |nqn: &str| DiscoveryLogEntry {
            trtype: disc::TRTYPE_TCP,
            adrfam: disc::ADRFAM_IPV4,
            subtype: disc::SUBTYPE_NVME,
            treq: disc::TREQ_NOT_REQUIRED,
            portid: 1,
            cntlid: 0xFFFF,
            asqsz: 32,
            trsvcid: "4420".into(),
            subnqn: nqn.into(),
            traddr: "127.0.0.1".into(),
            sectype: 0,
        };
        let page = DiscoveryLogPage { genctr: 3, entries: vec![e("nqn.a"), e("nqn.b")] };
        let t = discovery_text(&page);
        assert!(t.contains("Number of Records 2, Generation counter 3"));
        assert_eq!(t.matches("=====Discovery Log Entry").count(), 2);
        assert!(t.contains("subnqn:  nqn.b") && t.contains("trtype:  tcp") && t.contains("trsvcid: 4420"));
        assert_eq!(discovery_json(&page)["records"][1]["subnqn"], "nqn.b");
    }

    #[test]
    fn identify_text_names_the_fields() {
        let r = IdentifyReport {
            cntlid: 1,
            version: 0x10400,
            max_transfer: Some(1 << 20),
            ctrl: IdentifyController { mn: "nvmflab".into(), ioccsz: 516, nn: 1, ..Default::default() },
            namespaces: vec![(1, IdentifyNamespace { nsze: 16384, ncap: 16384, lbads: 9, ..Default::default() })],
        };
        let t = r.to_text();
        for needle in ["model (mn)", "nvmflab", "ioccsz", "8192 bytes of in-capsule", "mdts", "nn", "Namespace 1", "8388608 bytes"] {
            assert!(t.contains(needle), "{needle}: {t}");
        }
        assert_eq!(r.to_json()["namespaces"][0]["capacity_bytes"], 8388608);
    }
}
