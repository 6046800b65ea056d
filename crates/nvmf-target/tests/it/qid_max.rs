//! The control surface's `set_qid_max` (nvmet's `attr_qid_max`, blktests nvme/048): the
//! subsystem's controllers end so their hosts reconnect, and a controller connected after the
//! change is granted at most that many I/O queues and may not connect a higher QID.

use crate::common;

use common::{Queue, SUB};
use nvmf_proto::nvme::{admin_opcode, feature};
use nvmf_proto::{Sqe, Status};
use nvmf_target::config::{BackendConfig, NamespaceConfig, PortConfig, SubsystemConfig, TargetConfig};
use nvmf_target::control::Control;
use nvmf_target::core::Target;
use std::sync::Arc;
use std::time::Duration;

fn controlled() -> (Arc<Target>, Control) {
    let mut c = TargetConfig::empty();
    c.ports.push(PortConfig { addr: "127.0.0.1:0".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() });
    let mut s = SubsystemConfig::new(SUB);
    s.namespaces.push(NamespaceConfig { nsid: 1, backend: BackendConfig::Ram { size: 1 << 20 }, block_size: 512, nguid: None, uuid: None });
    c.subsystems.push(s);
    let t = Arc::new(Target::new(c.target.clone(), &c.subsystems, &c.ports).unwrap());
    (t.clone(), Control::new(t, c))
}

fn set_qid_max(c: &Control, n: i64) -> serde_json::Value {
    c.handle_json(&format!(r#"{{"op":"set_qid_max","subsystem":"{SUB}","qid_max":{n}}}"#))
}

/// Set Features Number of Queues asking for `n` submission and completion queues; DW0.
fn ask_queues(admin: &mut Queue, n: u32) -> (Status, u64) {
    let mut s = Sqe::new(admin_opcode::SET_FEATURES, 0);
    s.set_cdw(10, feature::NUMBER_OF_QUEUES as u32);
    s.set_cdw(11, (n - 1) << 16 | (n - 1));
    let cqe = admin.command(s, &[]);
    (cqe.status, cqe.result)
}

#[test]
fn a_new_qid_max_ends_the_controllers_and_bounds_the_next_ones() {
    let (t, c) = controlled();
    let (mut admin, _io) = Queue::admin_and_io(&t);
    assert_eq!(ask_queues(&mut admin, 4), (Status::SUCCESS, 0x0003_0003), "default: up to 128");

    assert_eq!(set_qid_max(&c, 1)["ok"], true);
    assert_eq!(t.controller_count(), 0, "the subsystem's controllers end, as nvmet's");
    admin.advance(Duration::from_millis(20));
    assert!(admin.conn.should_close(), "the ended controller's admin queue closes: the host reconnects");
    assert_eq!(c.handle_json(r#"{"op":"show"}"#)["subsystems"][0]["qid_max"], 1);

    let (mut admin, cntlid) = Queue::admin(&t);
    assert_eq!(ask_queues(&mut admin, 4), (Status::SUCCESS, 0), "one I/O queue granted (0's based)");
    let (_q1, cqe) = Queue::open(&t, 1, cntlid);
    assert_eq!(cqe.status, Status::SUCCESS);
    let (_q2, cqe) = Queue::open(&t, 2, cntlid);
    assert_eq!(cqe.status, Status::CONNECT_INVALID_PARAM.with_dnr(), "QID 2 is over qid_max");

    assert_eq!(set_qid_max(&c, 2)["ok"], true);
    let (mut admin, _) = Queue::admin(&t);
    assert_eq!(ask_queues(&mut admin, 4), (Status::SUCCESS, 0x0001_0001));
    assert_eq!(ask_queues(&mut admin, 1), (Status::SUCCESS, 0), "never more than asked for");
}

#[test]
fn qid_max_out_of_range_or_for_no_subsystem_is_refused_and_changes_nothing() {
    let (t, c) = controlled();
    let (_admin, _io) = Queue::admin_and_io(&t);
    for (n, why) in [(0, "1..=128"), (129, "1..=128")] {
        let r = set_qid_max(&c, n);
        assert_eq!(r["ok"], false);
        assert!(r["error"].as_str().unwrap().contains(why), "{r}");
    }
    assert_eq!(set_qid_max(&c, 70000)["ok"], false, "not a u16");
    let r = c.handle_json(r#"{"op":"set_qid_max","subsystem":"nqn.none","qid_max":2}"#);
    assert!(r["error"].as_str().unwrap().contains("no subsystem"), "{r}");
    assert_eq!(t.controller_count(), 1, "a refused request ends no controller");
}
