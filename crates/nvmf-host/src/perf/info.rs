//! `nvmf-perf identify` and `nvmf-perf discover`: what the controller says about itself, its
//! namespaces and the discovery log, for a person (text) or a program (JSON).

use nvmf_proto::discovery::{self as disc, DiscoveryLogEntry, DiscoveryLogPage};
use nvmf_proto::identify::{IdentifyController, IdentifyNamespace};
use serde_json::{json, Map, Value};

/// Identify data of one controller and the namespaces asked for.
#[derive(Debug, Clone)]
pub struct IdentifyReport {
    pub cntlid: u16,
    pub version: u32,
    pub max_transfer: Option<u64>,
    pub ctrl: IdentifyController,
    pub namespaces: Vec<(u32, IdentifyNamespace)>,
    /// Raw Identify Controller data (4096 bytes), printed field by field in nvme-cli's layout.
    pub ctrl_raw: Vec<u8>,
    /// Raw Identify Namespace data of each namespace, in `namespaces` order.
    pub ns_raw: Vec<Vec<u8>>,
}

fn version_text(vs: u32) -> String {
    format!("{}.{}.{}", vs >> 16, (vs >> 8) & 0xFF, vs & 0xFF)
}

impl IdentifyReport {
    /// nvme-cli's `nvme id-ctrl -o json` object, plus `"namespaces"`: one `nvme id-ns -o json`
    /// object per namespace with `"nsid"`, `"block_size"` and `"capacity_bytes"` added, and
    /// `"controller"`: the short summary this command printed before (kept for its users).
    pub fn to_json(&self) -> Value {
        let c = &self.ctrl;
        let mut v = id_ctrl_json(&self.ctrl_raw);
        let namespaces: Vec<Value> = self
            .namespaces
            .iter()
            .zip(&self.ns_raw)
            .map(|((nsid, n), raw)| {
                let mut m = Map::new();
                if let Value::Object(o) = id_ns_json(raw) {
                    m.extend(o);
                }
                m.insert("nsid".into(), json!(nsid));
                m.insert("block_size".into(), json!(n.block_size()));
                m.insert("capacity_bytes".into(), json!(n.nsze.saturating_mul(n.block_size())));
                Value::Object(m)
            })
            .collect();
        let summary = json!({
            "cntlid": self.cntlid, "mn": c.mn, "sn": c.sn, "fr": c.fr, "subnqn": c.subnqn,
            "vid": c.vid, "ver": version_text(if c.ver != 0 { c.ver } else { self.version }),
            "ioccsz": c.ioccsz, "iorcsz": c.iorcsz, "in_capsule_data_size": c.in_capsule_data_size(),
            "maxcmd": c.maxcmd, "mdts": c.mdts, "max_transfer_bytes": self.max_transfer,
            "nn": c.nn, "kas": c.kas, "sgls": c.sgls, "oncs": c.oncs, "cntrltype": c.cntrltype,
        });
        if let Value::Object(o) = &mut v {
            o.insert("namespaces".into(), Value::Array(namespaces));
            o.insert("controller".into(), summary);
        }
        v
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

/// libnvme's name for a table index, "unrecognized" outside it (its `arg_str`).
fn table(names: &[(u16, &'static str)], v: u16) -> &'static str {
    names.iter().find(|(k, _)| *k == v).map_or("unrecognized", |(_, n)| n)
}

fn entry_json(e: &DiscoveryLogEntry) -> Value {
    let trtype = table(&[(1, "rdma"), (2, "fc"), (3, "tcp"), (254, "loop")], e.trtype as u16);
    let adrfam =
        table(&[(0, "pci"), (1, "ipv4"), (2, "ipv6"), (3, "infiniband"), (4, "fibre-channel")], e.adrfam as u16);
    let subtype = table(
        &[(1, "discovery subsystem referral"), (2, "nvme subsystem"), (3, "current discovery subsystem")],
        e.subtype as u16,
    );
    let treq = table(
        &[
            (0, "not specified"),
            (1, "required"),
            (2, "not required"),
            (4, "not specified, sq flow control disable supported"),
            (5, "required, sq flow control disable supported"),
            (6, "not required, sq flow control disable supported"),
        ],
        e.treq as u16,
    );
    let eflags = table(
        &[
            (0, "none"),
            (2, "explicit discovery connections"),
            (1, "duplicate discovery information"),
            (3, "explicit discovery connections, duplicate discovery information"),
            (4, "no cdc connectivity"),
            (6, "explicit discovery connections, no cdc connectivity"),
            (5, "duplicate discovery information, no cdc connectivity"),
            (7, "explicit discovery connections, duplicate discovery information, no cdc connectivity"),
        ],
        e.eflags,
    );
    let mut m = Map::new();
    m.insert("trtype".into(), json!(trtype));
    m.insert("adrfam".into(), json!(adrfam));
    m.insert("subtype".into(), json!(subtype));
    m.insert("treq".into(), json!(treq));
    m.insert("portid".into(), json!(e.portid));
    m.insert("trsvcid".into(), json!(e.trsvcid));
    m.insert("subnqn".into(), json!(e.subnqn));
    m.insert("traddr".into(), json!(e.traddr));
    m.insert("eflags".into(), json!(eflags));
    if e.trtype == disc::TRTYPE_TCP {
        m.insert("sectype".into(), json!(table(&[(0, "none"), (1, "tls"), (2, "tls13")], e.sectype as u16)));
    }
    Value::Object(m)
}

/// `nvme discover -o json`: `{"genctr": N, "records": [...]}`, keys and strings as nvme-cli
/// (libnvme) prints them.
pub fn discovery_json(page: &DiscoveryLogPage) -> Value {
    json!({
        "genctr": page.genctr,
        "records": page.entries.iter().map(entry_json).collect::<Vec<_>>(),
    })
}

fn le(b: &[u8], off: usize, len: usize) -> u128 {
    b.get(off..off + len).map_or(0, |s| s.iter().rev().fold(0u128, |acc, &x| acc << 8 | x as u128))
}

/// A fixed-width ASCII field as nvme-cli prints it (`%-.*s`: up to the first NUL, spaces kept).
fn ascii(b: &[u8], off: usize, len: usize) -> String {
    let s = b.get(off..off + len).unwrap_or(&[]);
    let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
    String::from_utf8_lossy(&s[..end]).into_owned()
}

fn num(v: u128) -> Value {
    match u64::try_from(v) {
        Ok(v) => json!(v),
        Err(_) => json!(v.to_string()),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Identify Controller field offsets and sizes (NVMe Base 2.1, libnvme's `struct nvme_id_ctrl`)
/// in the order `nvme id-ctrl -o json` prints them; `sn`, `mn`, `fr`, `fguid`, `subnqn` and
/// `psds` are handled apart.
const ID_CTRL_FIELDS: &[(&str, usize, usize)] = &[
    ("vid", 0, 2), ("ssvid", 2, 2), ("sn", 4, 20), ("mn", 24, 40), ("fr", 64, 8), ("rab", 72, 1),
    ("ieee", 73, 3), ("cmic", 76, 1), ("mdts", 77, 1), ("cntlid", 78, 2), ("ver", 80, 4),
    ("rtd3r", 84, 4), ("rtd3e", 88, 4), ("oaes", 92, 4), ("ctratt", 96, 4), ("rrls", 100, 2),
    ("bpcap", 102, 1), ("nssl", 104, 4), ("plsi", 110, 1), ("cntrltype", 111, 1), ("fguid", 112, 16),
    ("crdt1", 128, 2), ("crdt2", 130, 2), ("crdt3", 132, 2), ("crcap", 134, 1), ("nvmsr", 253, 1),
    ("vwci", 254, 1), ("mec", 255, 1), ("oacs", 256, 2), ("acl", 258, 1), ("aerl", 259, 1),
    ("frmw", 260, 1), ("lpa", 261, 1), ("elpe", 262, 1), ("npss", 263, 1), ("avscc", 264, 1),
    ("apsta", 265, 1), ("wctemp", 266, 2), ("cctemp", 268, 2), ("mtfa", 270, 2), ("hmpre", 272, 4),
    ("hmmin", 276, 4), ("tnvmcap", 280, 16), ("unvmcap", 296, 16), ("rpmbs", 312, 4), ("edstt", 316, 2),
    ("dsto", 318, 1), ("fwug", 319, 1), ("kas", 320, 2), ("hctma", 322, 2), ("mntmt", 324, 2),
    ("mxtmt", 326, 2), ("sanicap", 328, 4), ("hmminds", 332, 4), ("hmmaxd", 336, 2),
    ("nsetidmax", 338, 2), ("endgidmax", 340, 2), ("anatt", 342, 1), ("anacap", 343, 1),
    ("anagrpmax", 344, 4), ("nanagrpid", 348, 4), ("pels", 352, 4), ("domainid", 356, 2),
    ("kpioc", 358, 1), ("mptfawr", 360, 2), ("megcap", 368, 16), ("tmpthha", 384, 1), ("cqt", 386, 2),
    ("cdpa", 388, 2), ("mup", 390, 2), ("ipmsr", 392, 2), ("msmt", 394, 2), ("sqes", 512, 1),
    ("cqes", 513, 1), ("maxcmd", 514, 2), ("nn", 516, 4), ("oncs", 520, 2), ("fuses", 522, 2),
    ("fna", 524, 1), ("vwc", 525, 1), ("awun", 526, 2), ("awupf", 528, 2), ("icsvscc", 530, 1),
    ("nwpc", 531, 1), ("acwu", 532, 2), ("ocfs", 534, 2), ("sgls", 536, 4), ("mnan", 540, 4),
    ("maxdna", 544, 16), ("maxcna", 560, 4), ("oaqd", 564, 4), ("rhiri", 568, 1), ("hirt", 569, 1),
    ("cmmrtd", 570, 2), ("nmmrtd", 572, 2), ("minmrtg", 574, 1), ("maxmrtg", 575, 1), ("trattr", 576, 1),
    ("mcudmq", 578, 2), ("mnsudmq", 580, 2), ("mcmr", 582, 2), ("nmcmr", 584, 2), ("mcdqpc", 586, 2),
    ("subnqn", 768, 256), ("ioccsz", 1792, 4), ("iorcsz", 1796, 4), ("icdoff", 1800, 2),
    ("fcatt", 1802, 1), ("msdbd", 1803, 1), ("ofcs", 1804, 2), ("dctype", 1806, 1), ("ccrl", 1807, 1),
];

fn uuid_string(b: &[u8]) -> String {
    let h = hex(b);
    if h.len() != 32 {
        return h;
    }
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// `nvme id-ctrl -o json` of raw Identify Controller data (nvme-cli's `json_nvme_id_ctrl`).
pub fn id_ctrl_json(b: &[u8]) -> Value {
    let mut m = Map::new();
    for &(k, off, len) in ID_CTRL_FIELDS {
        let v = match k {
            "sn" | "mn" | "fr" => json!(ascii(b, off, len)),
            "fguid" => json!(uuid_string(b.get(off..off + len).unwrap_or(&[]))),
            "subnqn" => {
                let s = ascii(b, off, len);
                if s.is_empty() {
                    continue;
                }
                json!(s)
            }
            _ => num(le(b, off, len)),
        };
        m.insert(k.into(), v);
    }
    let npss = b.get(263).copied().unwrap_or(0) as usize;
    let psds: Vec<Value> = (0..=npss)
        .map(|i| {
            let p = 2048 + i * 32;
            let byte = |o: usize| b.get(p + o).copied().unwrap_or(0) as u64;
            let scale = |x: u64| (x >> 6) & 0x3;
            let mut d = Map::new();
            for (k, v) in [
                ("max_power", le(b, p, 2) as u64),
                ("max_power_scale", byte(3) & 1),
                ("non-operational_state", (byte(3) >> 1) & 1),
                ("entry_lat", le(b, p + 4, 4) as u64),
                ("exit_lat", le(b, p + 8, 4) as u64),
                ("read_tput", byte(12)),
                ("read_lat", byte(13)),
                ("write_tput", byte(14)),
                ("write_lat", byte(15)),
                ("idle_power", le(b, p + 16, 2) as u64),
                ("idle_scale", scale(byte(18))),
                ("active_power", le(b, p + 20, 2) as u64),
                ("active_power_work", byte(22) & 7),
                ("active_scale", scale(byte(22))),
                ("emerg_power_fail_recover_time", byte(23)),
                ("emerg_power_fail_recover_scale", byte(26) & 0xF),
                ("force_quiesce_vault_time", byte(24)),
                ("force_quiesce_vault_scale", byte(26) >> 4),
                ("emerg_power_fail_vault_time", byte(25)),
                ("emerg_power_fail_vault_scale", byte(27) & 0xF),
            ] {
                d.insert(k.into(), json!(v));
            }
            Value::Object(d)
        })
        .collect();
    m.insert("psds".into(), Value::Array(psds));
    Value::Object(m)
}

/// `nvme id-ns -o json` of raw Identify Namespace data (nvme-cli's `json_nvme_id_ns`).
pub fn id_ns_json(b: &[u8]) -> Value {
    let byte = |o: usize| b.get(o).copied().unwrap_or(0);
    let nsfeat = byte(24);
    let mut fields: Vec<(&str, usize, usize)> = vec![
        ("nsze", 0, 8), ("ncap", 8, 8), ("nuse", 16, 8), ("nsfeat", 24, 1), ("nlbaf", 25, 1),
        ("flbas", 26, 1), ("mc", 27, 1), ("dpc", 28, 1), ("dps", 29, 1), ("nmic", 30, 1),
        ("rescap", 31, 1), ("fpi", 32, 1), ("dlfeat", 33, 1), ("nawun", 34, 2), ("nawupf", 36, 2),
        ("nacwu", 38, 2), ("nabsn", 40, 2), ("nabo", 42, 2), ("nabspf", 44, 2), ("noiob", 46, 2),
        ("nvmcap", 48, 16),
    ];
    if nsfeat & 0x30 != 0 {
        fields.extend([("npwg", 64, 2), ("npwa", 66, 2)]);
        if nsfeat & 0x10 != 0 {
            fields.push(("npdg", 68, 2));
        }
        fields.extend([("npda", 70, 2), ("nows", 72, 2)]);
    }
    fields.extend([
        ("mssrl", 74, 2), ("mcl", 76, 4), ("msrc", 80, 1), ("kpios", 81, 1), ("nulbaf", 82, 1),
        ("kpiodaag", 84, 4), ("anagrpid", 92, 4), ("nsattr", 99, 1), ("nvmsetid", 100, 2), ("endgid", 102, 2),
    ]);
    let mut m = Map::new();
    for (k, off, len) in fields {
        m.insert(k.into(), num(le(b, off, len)));
    }
    m.insert("nguid".into(), json!(hex(b.get(104..120).unwrap_or(&[]))));
    m.insert("eui64".into(), json!(hex(b.get(120..128).unwrap_or(&[]))));
    let nlbaf = byte(25) as usize;
    // FLBAS bits 3:0 and 6:5 give the format in use.
    let flbas = byte(26) as usize;
    let in_use = (flbas & 0xF) | ((flbas >> 5) & 0x3) << 4;
    let lbafs: Vec<Value> = (0..=nlbaf.min(63))
        .map(|i| {
            let p = 128 + i * 4;
            json!({"lbaf": i, "ms": le(b, p, 2) as u64, "ds": byte(p + 2), "rp": byte(p + 3) & 3, "in_use": (i == in_use) as u8})
        })
        .collect();
    m.insert("lbafs".into(), Value::Array(lbafs));
    // Vendor specific bytes as printable text, 16 per line, as nvme-cli's d_json.
    let vs = b.get(384..).unwrap_or(&[]);
    let vs = &vs[..vs.iter().position(|&c| c == 0).unwrap_or(vs.len())];
    let lines: Vec<Value> = vs
        .chunks(16)
        .map(|c| json!(c.iter().map(|&x| if (b'!'..=b'~').contains(&x) { x as char } else { '.' }).collect::<String>()))
        .collect();
    m.insert("vs".into(), Value::Array(lines));
    Value::Object(m)
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
        s.push_str(&format!("sectype: {}\n", table(&[(0, "none"), (1, "tls"), (2, "tls13")], e.sectype as u16)));
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
            eflags: 0,
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
            ctrl_raw: Vec::new(),
            ns_raw: Vec::new(),
        };
        let t = r.to_text();
        for needle in ["model (mn)", "nvmflab", "ioccsz", "8192 bytes of in-capsule", "mdts", "nn", "Namespace 1", "8388608 bytes"] {
            assert!(t.contains(needle), "{needle}: {t}");
        }
    }

    #[test]
    fn json_is_nvme_clis_layout() {
        let ctrl = IdentifyController {
            vid: 0x1b36,
            sn: "SN1".into(),
            mn: "nvmflab".into(),
            fr: "0.1.0".into(),
            ieee: [0x01, 0x02, 0x03],
            cmic: 2,
            mdts: 9,
            cntlid: 5,
            ver: 0x10400,
            nn: 1,
            vwc: 1,
            sgls: 0x100001,
            subnqn: "nqn.x".into(),
            ioccsz: 516,
            iorcsz: 1,
            msdbd: 1,
            ..Default::default()
        };
        let ns = IdentifyNamespace { nsze: 16384, ncap: 16384, nuse: 16384, lbads: 9, nmic: 1, ..Default::default() };
        let r = IdentifyReport {
            cntlid: 5,
            version: 0x10400,
            max_transfer: Some(1 << 21),
            ctrl_raw: ctrl.encode(),
            ns_raw: vec![ns.encode()],
            ctrl,
            namespaces: vec![(1, ns)],
        };
        let v: Value = serde_json::from_str(&r.to_json().to_string()).unwrap();
        assert_eq!(v["vid"], 0x1b36);
        assert_eq!(v["sn"], "SN1                 ", "nvme-cli keeps the space padding");
        assert_eq!(v["mn"].as_str().unwrap().trim_end(), "nvmflab");
        assert_eq!(v["ieee"], 0x030201);
        assert_eq!(v["ver"], 0x10400);
        assert_eq!((v["cmic"].clone(), v["mdts"].clone(), v["cntlid"].clone()), (json!(2), json!(9), json!(5)));
        assert_eq!((v["nn"].clone(), v["vwc"].clone(), v["sgls"].clone()), (json!(1), json!(1), json!(0x100001)));
        assert_eq!((v["ioccsz"].clone(), v["iorcsz"].clone(), v["msdbd"].clone()), (json!(516), json!(1), json!(1)));
        assert_eq!(v["subnqn"], "nqn.x");
        assert_eq!(v["fguid"], "00000000-0000-0000-0000-000000000000");
        assert_eq!(v["tnvmcap"], 0, "128-bit fields are plain numbers");
        for k in ["ssvid", "fr", "rab", "oacs", "acl", "aerl", "kas", "sqes", "cqes", "maxcmd", "oncs", "ctratt", "anacap", "ofcs"] {
            assert!(v.get(k).is_some(), "id-ctrl key {k}");
        }
        let psds = v["psds"].as_array().unwrap();
        assert_eq!(psds.len(), 1, "NPSS 0: one power state");
        for k in ["max_power", "max_power_scale", "non-operational_state", "entry_lat", "exit_lat", "idle_scale", "active_scale"] {
            assert!(psds[0].get(k).is_some(), "psd key {k}");
        }
        let n = &v["namespaces"][0];
        assert_eq!(n["nsid"], 1);
        assert_eq!(n["capacity_bytes"], 16384 * 512);
        assert_eq!(v["controller"]["subnqn"], "nqn.x");
        assert_eq!((n["nsze"].clone(), n["ncap"].clone(), n["nuse"].clone()), (json!(16384), json!(16384), json!(16384)));
        assert_eq!(n["nmic"], 1);
        assert_eq!(n["nguid"].as_str().unwrap().len(), 32);
        assert_eq!(n["eui64"].as_str().unwrap().len(), 16);
        assert_eq!(n["lbafs"], json!([{"lbaf": 0, "ms": 0, "ds": 9, "rp": 0, "in_use": 1}]));
        assert_eq!(n["vs"], json!([]));
        assert!(n.get("npwg").is_none(), "NSFEAT bits 4/5 clear: no optimal I/O fields");
    }

    #[test]
    fn discovery_json_is_nvme_clis_layout() {
        let e = DiscoveryLogEntry {
            trtype: disc::TRTYPE_TCP,
            adrfam: disc::ADRFAM_IPV4,
            subtype: disc::SUBTYPE_NVME,
            treq: disc::TREQ_NOT_SPECIFIED | disc::TREQ_DISABLE_SQFLOW,
            portid: 1,
            cntlid: 0xFFFF,
            asqsz: 32,
            eflags: 0,
            trsvcid: "4420".into(),
            subnqn: "nqn.a".into(),
            traddr: "127.0.0.1".into(),
            sectype: 0,
        };
        let v: Value = serde_json::from_str(&discovery_json(&DiscoveryLogPage { genctr: 3, entries: vec![e] }).to_string()).unwrap();
        let mut top: Vec<&String> = v.as_object().unwrap().keys().collect();
        top.sort();
        assert_eq!(top, ["genctr", "records"]);
        assert_eq!(v["genctr"], 3);
        assert_eq!(
            v["records"][0],
            json!({"trtype": "tcp", "adrfam": "ipv4", "subtype": "nvme subsystem",
                   "treq": "not specified, sq flow control disable supported", "portid": 1,
                   "trsvcid": "4420", "subnqn": "nqn.a", "traddr": "127.0.0.1", "eflags": "none",
                   "sectype": "none"})
        );
    }
}
