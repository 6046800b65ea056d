//! nvmf-target's runtime control surface end to end: our host connected over loopback while the
//! target's hosts, keys, subsystems and namespaces change through its control socket. The live
//! connection must keep working through every change; new connections must see the changes.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nvmf_host::{ConnectOptions, Controller, Error, IoQueue};
use nvmf_proto::auth::{HashId, Secret};

const NQN: &str = "nqn.2024-01.io.nvmflab:control-a";
const ADDED: &str = "nqn.2024-01.io.nvmflab:control-b";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:7c1e5a10-control-host";
const T: Duration = Duration::from_secs(5);

/// A control socket path in a fresh temporary directory, removed when the guard drops.
fn socket_path() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new().prefix("nvmflab-control-").tempdir().unwrap();
    let sock = dir.path().join("control.sock");
    (dir, sock)
}

/// Only HOST may connect to NQN; no host authenticates; control on `sock`.
fn start_target(sock: &Path) -> nvmf_target::RunningTarget {
    let cfg = format!(
        r#"
[target]
control = "{sock}"

[[port]]
addr = "127.0.0.1:0"

[[subsystem]]
nqn = "{NQN}"
allow_any_host = false
hosts = ["{HOST}"]
  [[subsystem.namespace]]
  nsid = 1
  backend = "ram"
  size = "1MiB"
"#,
        sock = sock.display()
    );
    let config = nvmf_target::config::toml::parse(&cfg, Path::new("control.toml")).expect("config");
    nvmf_target::start(config).expect("target starts")
}

/// One request over the socket, as a client would send it; the reply.
fn request(sock: &Path, json: &str) -> serde_json::Value {
    let mut s = UnixStream::connect(sock).expect("control socket");
    writeln!(s, "{json}").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("reply {line:?}: {e}"))
}

fn ok(sock: &Path, json: &str) {
    let r = request(sock, json);
    assert_eq!(r["ok"], true, "{json} -> {r}");
}

fn options(target: &nvmf_target::RunningTarget, key: Option<&Secret>) -> ConnectOptions {
    let mut o = ConnectOptions::new(target.listen_addrs()[0].to_string(), HOST);
    o.dhchap_secret = key.cloned();
    o.kato_ms = 0;
    o.timeout = T;
    o
}

fn io_round(q: &mut IoQueue, lba: u64, seed: u8) -> Result<(), Error> {
    let data: Vec<u8> = (0..512).map(|i| (i as u8).wrapping_mul(seed)).collect();
    q.write(lba, &data, T)?;
    let mut back = vec![0u8; 512];
    q.read(lba, &mut back, T)?;
    assert_eq!(back, data);
    Ok(())
}

fn active_nsids(ctrl: &Controller) -> Vec<u32> {
    let raw = ctrl.identify_raw(0x02, 0).expect("active namespace list");
    raw.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).take_while(|n| *n != 0).collect()
}

#[test]
fn a_live_connection_survives_every_kind_of_change() {
    let (_dir, sock) = socket_path();
    let target = start_target(&sock);
    let live = Controller::connect(&options(&target, None), NQN).expect("connect before any change");
    live.set_number_of_queues(1).unwrap();
    let mut q = IoQueue::connect(&live.io_queue_params(), 1, 4, 4096).unwrap();
    q.set_namespace(1, 512);
    io_round(&mut q, 1, 3).unwrap();

    // The host must now authenticate, with sha512 and ffdhe2048.
    let key = Secret { key: (0..32).map(|i| i as u8 * 5 + 1).collect(), transform: None };
    ok(&sock, &format!(r#"{{"op":"set_host","nqn":"{HOST}","dhchap_key":"{}"}}"#, key.encode()));
    ok(&sock, &format!(r#"{{"op":"set_host","nqn":"{HOST}","dhchap_hash":"hmac(sha512)","dhchap_dhgroup":"ffdhe2048"}}"#));
    ok(&sock, &format!(r#"{{"op":"add_subsystem","nqn":"{ADDED}","allow_any_host":false,"hosts":["{HOST}"]}}"#));
    ok(&sock, &format!(r#"{{"op":"add_namespace","subsystem":"{ADDED}","nsid":7,"backend":"ram","size":65536}}"#));
    ok(&sock, &format!(r#"{{"op":"add_namespace","subsystem":"{NQN}","nsid":2,"backend":"ram","size":65536}}"#));
    let bad = request(&sock, r#"{"op":"add_namespace","subsystem":"nqn.none","nsid":1,"backend":"ram","size":4096}"#);
    assert_eq!(bad["ok"], false);
    assert!(bad["error"].as_str().unwrap().contains("no subsystem \"nqn.none\""), "{bad}");

    // The connection made before all this still works: admin and I/O queue.
    io_round(&mut q, 2, 5).expect("I/O on the live queue after the changes");
    live.keep_alive().expect("admin queue after the changes");
    assert_eq!(active_nsids(&live), vec![1, 2], "a namespace added at run time is active for connected controllers too");

    // New connections: refused without the key, accepted with it; they see namespace 2.
    match Controller::connect(&options(&target, None), NQN) {
        Err(e) => assert!(e.to_string().contains("requires DH-HMAC-CHAP"), "{e}"),
        Ok(_) => panic!("a host that now has a key connected without authenticating"),
    }
    let fresh = Controller::connect(&options(&target, Some(&key)), NQN).expect("connect with the new key");
    assert_eq!(active_nsids(&fresh), vec![1, 2]);
    let added = Controller::connect(&options(&target, Some(&key)), ADDED).expect("connect to the added subsystem");
    assert_eq!(active_nsids(&added), vec![7]);

    // Disable namespace 1: the live queue's I/O to it fails at once; enable: it works again.
    ok(&sock, &format!(r#"{{"op":"disable_namespace","subsystem":"{NQN}","nsid":1}}"#));
    match io_round(&mut q, 3, 7) {
        Err(Error::Status { status, .. }) => assert_eq!((status.sct, status.sc), (0, 0x0B), "Invalid Namespace or Format: {status}"),
        other => panic!("I/O to a disabled namespace: {other:?}"),
    }
    assert_eq!(active_nsids(&fresh), vec![2]);
    ok(&sock, &format!(r#"{{"op":"enable_namespace","subsystem":"{NQN}","nsid":1}}"#));
    io_round(&mut q, 3, 9).expect("I/O after the namespace is enabled again");

    // Disallowing the host gates the next Connect only.
    ok(&sock, &format!(r#"{{"op":"disallow_host","subsystem":"{NQN}","host":"{HOST}"}}"#));
    assert!(Controller::connect(&options(&target, Some(&key)), NQN).is_err(), "a disallowed host connected");
    io_round(&mut q, 4, 11).expect("the live connection outlives its host's removal from the list");

    // Removing a subsystem ends its controllers, as nvmet's does.
    ok(&sock, &format!(r#"{{"op":"remove_subsystem","nqn":"{ADDED}"}}"#));
    // The reactor looks at its queues' controllers on its timer tick: allow it a few (and a
    // loaded machine's delays).
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while added.keep_alive().is_ok() {
        assert!(std::time::Instant::now() < deadline, "a controller of a removed subsystem still answers");
        std::thread::sleep(Duration::from_millis(50));
    }
    let show = request(&sock, r#"{"op":"show"}"#);
    assert_eq!(show["subsystems"].as_array().unwrap().len(), 1, "{show}");
    assert!(!show.to_string().contains(&key.encode()), "show must not print keys");
    drop(q);
    live.shutdown().unwrap();
    target.shutdown();
    assert!(!sock.exists(), "the socket is removed at shutdown");
}

#[test]
fn key_hash_and_group_changes_apply_to_the_next_authentication() {
    let (_dir, sock) = socket_path();
    let target = start_target(&sock);
    // blktests' nvme/042-045 order: a key, then each hash and group, connecting after each.
    for (i, (hash, group)) in [("hmac(sha256)", "null"), ("hmac(sha384)", "ffdhe2048"), ("hmac(sha512)", "ffdhe3072")]
        .into_iter()
        .enumerate()
    {
        let key = Secret { key: vec![i as u8 + 40; 48], transform: Some(HashId::Sha384) };
        let set = format!(
            r#"{{"op":"set_host","nqn":"{HOST}","dhchap_key":"{}","dhchap_hash":"{hash}","dhchap_dhgroup":"{group}"}}"#,
            key.encode()
        );
        ok(&sock, &set);
        let c = Controller::connect(&options(&target, Some(&key)), NQN).unwrap_or_else(|e| panic!("{hash}/{group}: {e}"));
        c.shutdown().unwrap();
        let old = Secret { key: vec![i as u8 + 90; 48], transform: Some(HashId::Sha384) };
        assert!(Controller::connect(&options(&target, Some(&old)), NQN).is_err(), "a wrong key was accepted");
    }
    // Clearing the key ends the need to authenticate.
    ok(&sock, &format!(r#"{{"op":"set_host","nqn":"{HOST}","dhchap_key":""}}"#));
    Controller::connect(&options(&target, None), NQN).expect("no key, no authentication").shutdown().unwrap();
    target.shutdown();
}
