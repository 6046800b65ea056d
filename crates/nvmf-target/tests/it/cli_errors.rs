//! The nvmf-target binary refuses what it cannot serve with a one-line config error and exit 2,
//! before it listens: never an abort, a backtrace or a misleading bind error.

use std::process::Command;

fn target(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nvmf-target")).args(args).output().expect("run nvmf-target");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_ram_namespace_larger_than_memory_is_a_config_error() {
    let (rc, err) = target(&["--listen", "127.0.0.1:0", "--ns", "ram:64TiB"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("config error") && err.contains("RAM namespaces need") && err.contains("MemAvailable"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line, no backtrace: {err}");
}

#[test]
fn a_congestion_control_the_kernel_lacks_is_refused_at_start_with_the_ones_it_allows() {
    let (rc, err) = target(&["--listen", "127.0.0.1:0", "--ns", "null:1GiB", "--tcp-congestion", "nosuchcc"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("\"nosuchcc\" refused") && err.contains("allows:") && err.contains("reno"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line, no backtrace: {err}");
    let (rc, err) = target(&["--listen", "127.0.0.1:0", "--ns", "null:1GiB", "--tcp-congestion", "Reno!"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("expected a kernel name"), "{err}");
}

#[test]
fn listen_errors_name_the_problem() {
    let (rc, err) = target(&["--listen", "127.0.0.1:99999", "--ns", "null:1GiB"]);
    assert_eq!(rc, 2);
    assert!(err.contains("--listen") && err.contains("out of range"), "{err}");
    let (rc, err) = target(&["--listen", "localhost:4420", "--ns", "null:1GiB"]);
    assert_eq!(rc, 2);
    assert!(err.contains("host names are not resolved"), "{err}");
}

#[test]
fn two_listeners_on_one_address_are_refused_before_binding() {
    let (rc, err) = target(&["--listen", "127.0.0.1:4420", "--listen", "127.0.0.1:4420", "--ns", "null:1GiB"]);
    assert_eq!(rc, 2, "{err}");
    assert!(err.contains("same address as port[0]") && !err.contains("in use"), "{err}");
}
