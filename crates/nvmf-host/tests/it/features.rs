//! Get/Set Features through the host library against the real target (in process): the
//! features `spdk_nvme_identify`, `nvme id-ctrl` and `nvme get-feature` ask for.

use crate::common;


use nvmf_host::{default_hostnqn, ConnectOptions, Controller, Error};
use nvmf_proto::nvme::feature;
use nvmf_proto::Status;

const NQN: &str = "nqn.2024-01.io.nvmflab:features";

fn start_target() -> nvmf_target::RunningTarget {
    common::start_target(NQN, "null", "16MiB")
}

fn status_of(e: Error) -> Status {
    match e {
        Error::Status { status, .. } => status,
        e => panic!("expected an NVMe status, got {e}"),
    }
}

#[test]
fn features_hosts_ask_for_are_answered() {
    let target = start_target();
    let opts = ConnectOptions::new(target.listen_addrs()[0].to_string(), default_hostnqn());
    let ctrl = Controller::connect(&opts, NQN).expect("connect");

    assert_eq!(ctrl.get_features(feature::ARBITRATION, 0, 0, 0).unwrap() & 0x7, 7);
    assert_eq!(ctrl.get_features(feature::POWER_MANAGEMENT, 0, 0, 0).unwrap() & 0x1F, 0);
    let over = ctrl.get_features(feature::TEMPERATURE_THRESHOLD, 0, 0, 0).unwrap();
    assert!((273..400).contains(&over), "over-temperature threshold in Kelvin: {over}");
    assert_eq!(ctrl.get_features(feature::ERROR_RECOVERY, 0, 0, 1).unwrap(), 0);
    // A null namespace has no volatile cache to flush (docs/reliability.md): both say 0.
    assert_eq!(ctrl.get_features(feature::VOLATILE_WRITE_CACHE, 0, 0, 0).unwrap(), 0);
    assert_eq!(ctrl.identity().vwc & 1, 0, "Identify Controller agrees with Get Features");
    assert_eq!(ctrl.get_features(feature::WRITE_ATOMICITY_NORMAL, 0, 0, 0).unwrap(), 0);

    let (nsq, ncq) = ctrl.set_number_of_queues(4).unwrap();
    assert_eq!((nsq, ncq), (4, 4));
    assert_eq!(ctrl.get_features(feature::NUMBER_OF_QUEUES, 0, 0, 0).unwrap(), 0x0003_0003);
    assert_eq!(
        ctrl.get_features(feature::NUMBER_OF_QUEUES, feature::sel::SUPPORTED_CAPABILITIES, 0, 0).unwrap(),
        feature::capability::CHANGEABLE
    );

    assert_eq!(ctrl.set_features(feature::KEEP_ALIVE_TIMER, 10_000).unwrap(), 10, "seconds in DW0, as nvmet");
    assert_eq!(ctrl.get_features(feature::KEEP_ALIVE_TIMER, 0, 0, 0).unwrap(), 10_000);
    assert_eq!(ctrl.set_features(feature::ASYNC_EVENT_CONFIG, 1 << 8).unwrap(), 1 << 8);
    assert_eq!(ctrl.get_features(feature::ASYNC_EVENT_CONFIG, 0, 0, 0).unwrap(), 1 << 8);

    let hostid = ctrl.get_features_data(feature::HOST_IDENTIFIER, 1, 16).unwrap();
    assert_eq!(hostid, opts.hostid.to_vec(), "the Host Identifier from Connect");

    for fid in [feature::INTERRUPT_COALESCING, feature::INTERRUPT_VECTOR_CONFIG, 0x7F] {
        let st = status_of(ctrl.get_features(fid, 0, 0, 0).unwrap_err());
        assert_eq!((st.sct, st.sc), (Status::INVALID_FIELD.sct, Status::INVALID_FIELD.sc), "{fid:#x}");
    }
    let st = status_of(ctrl.set_features(feature::POWER_MANAGEMENT, 0).unwrap_err());
    assert_eq!((st.sct, st.sc), (Status::INVALID_FIELD.sct, Status::INVALID_FIELD.sc));
    ctrl.shutdown().unwrap();
    target.shutdown();
}
