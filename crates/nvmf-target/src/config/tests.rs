//! Tests of the parsed configuration's rules (`TargetConfig::validate` and helpers).

use super::*;

#[test]
fn core_lists() {
    assert_eq!(parse_core_list("0"), Some(vec![0]));
    assert_eq!(parse_core_list("0,2"), Some(vec![0, 2]));
    assert_eq!(parse_core_list("1-3"), Some(vec![1, 2, 3]));
    assert_eq!(parse_core_list("3-1"), None);
    assert_eq!(parse_core_list("a"), None);
}

#[test]
fn hex16_accepts_uuid_form() {
    let v = parse_hex16("ef90689c-6c46-d44c-89c1-4067801309a8").unwrap();
    assert_eq!(v[0], 0xef);
    assert_eq!(v[15], 0xa8);
    assert!(parse_hex16("abc").is_none());
}

#[test]
fn cores_outside_the_affinity_mask_are_refused() {
    let mut c = TargetConfig::empty();
    c.ports.push(PortConfig { addr: "127.0.0.1:0".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() });
    c.validate("t").unwrap();
    c.target.cores = vec![0, 1000];
    let e = c.validate("t").unwrap_err().to_string();
    assert!(e.contains("core 1000 is not available"), "{e}");
}

#[test]
fn listen_addresses_say_what_is_wrong() {
    assert_eq!(parse_listen_addr("127.0.0.1:4420").unwrap(), "127.0.0.1:4420".parse().unwrap());
    assert_eq!(parse_listen_addr("[::1]:4420").unwrap(), "[::1]:4420".parse().unwrap());
    assert!(parse_listen_addr("127.0.0.1:70000").unwrap_err().contains("out of range"));
    assert!(parse_listen_addr("localhost:4420").unwrap_err().contains("host names are not resolved"));
    assert!(parse_listen_addr("127.0.0.1").unwrap_err().contains("port is missing"));
    assert!(parse_listen_addr("127.0.0.1:x").unwrap_err().contains("not a number"));
    assert!(parse_listen_addr("::1:4420").unwrap_err().contains("brackets"));
}

#[test]
fn two_ports_on_one_address_are_refused_but_port_zero_may_repeat() {
    let port = |a: &str| PortConfig { addr: a.parse().unwrap(), portid: None, subsystems: None, tls: Default::default() };
    let mut c = TargetConfig::empty();
    c.ports = vec![port("127.0.0.1:4420"), port("127.0.0.1:4421"), port("127.0.0.1:4420")];
    let e = c.validate("t").unwrap_err().to_string();
    assert!(e.contains("port[2]") && e.contains("same address as port[0]"), "{e}");
    c.ports = vec![port("127.0.0.1:0"), port("127.0.0.1:0")];
    c.validate("t").unwrap();
}

#[test]
fn ram_namespaces_beyond_the_memory_share_are_refused() {
    let gib = 1u64 << 30;
    assert!(check_ram_namespaces(gib, 10 * gib, 90).is_ok());
    assert!(check_ram_namespaces(9 * gib, 10 * gib, 90).is_ok());
    let e = check_ram_namespaces(64 * gib, 10 * gib, 90).unwrap_err();
    assert!(e.contains("64.0 GiB") && e.contains("MemAvailable 10.0 GiB"), "{e}");
    assert!(check_ram_namespaces(6 * gib, 10 * gib, 50).is_err());
    // Through validate, with this machine's own MemAvailable: 1 PiB never fits.
    let mut c = TargetConfig::empty();
    c.ports.push(PortConfig { addr: "127.0.0.1:0".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() });
    let mut s = SubsystemConfig::new("nqn.2024-01.io.nvmflab:t");
    s.namespaces.push(NamespaceConfig {
        nsid: 1,
        backend: BackendConfig::Ram { size: 1 << 50 },
        block_size: 512,
        nguid: None,
        uuid: None,
    });
    c.subsystems.push(s);
    let e = c.validate("t").unwrap_err().to_string();
    assert!(e.contains("RAM namespaces need 1024.0 TiB"), "{e}");
    c.target.ram_limit_percent = 0;
    assert!(c.validate("t").unwrap_err().to_string().contains("ram_limit_percent"));
}

#[test]
fn validate_rejects_bad_maxh2cdata_and_reactor() {
    let mut c = TargetConfig::empty();
    c.ports.push(PortConfig { addr: "127.0.0.1:0".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() });
    c.target.maxh2cdata = 1000;
    let e = c.validate("x").unwrap_err().to_string();
    assert!(e.contains("maxh2cdata"), "{e}");
    c.target.maxh2cdata = 4096;
    let mut s = SubsystemConfig::new("nqn.a");
    s.reactor = Some(3);
    c.subsystems.push(s);
    let e = c.validate("x").unwrap_err().to_string();
    assert!(e.contains("reactor = 3"), "{e}");
}
