//! The control surface without a host: every refusal names its reason and changes nothing, the
//! socket survives hostile clients, and `nvmf-target-ctl` reports replies by exit status.
//! (A live connection through changes: crates/nvmf-host/tests/it/control.rs.)

use crate::common;

use nvmf_target::config::{PortConfig, TargetConfig};
use nvmf_target::control::Control;
use nvmf_target::core::Target;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const SUB: &str = "nqn.2024-01.io.nvmflab:ctl";
const HOST: &str = "nqn.2024-01.io.nvmflab:ctl-host";
const KEY: &str = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

fn config() -> TargetConfig {
    common::loopback_config(SUB)
}

fn control() -> (Control, Arc<Target>) {
    let c = config();
    let t = Arc::new(Target::new(c.target.clone(), &c.subsystems, &c.ports).unwrap());
    (Control::new(t.clone(), c), t)
}

fn err(c: &Control, json: &str) -> String {
    let r = c.handle_json(json);
    assert_eq!(r["ok"], false, "{json} was accepted: {r}");
    r["error"].as_str().unwrap().to_string()
}

#[test]
fn refusals_name_the_reason_and_change_nothing() {
    let (c, t) = control();
    let before = c.handle_json(r#"{"op":"show"}"#);
    let e = err(&c, &format!(r#"{{"op":"add_namespace","subsystem":"{SUB}","nsid":1,"backend":"ram","size":4096}}"#));
    assert!(e.contains("nsid") && e.contains('1'), "duplicate nsid: {e}");
    let e = err(&c, &format!(r#"{{"op":"add_namespace","subsystem":"{SUB}","nsid":0,"backend":"ram","size":4096}}"#));
    assert!(e.contains("nsid"), "nsid 0: {e}");
    let e = err(&c, &format!(r#"{{"op":"add_namespace","subsystem":"{SUB}","nsid":3,"backend":"ram","size":4096,"block_size":1000}}"#));
    assert!(e.contains("block_size"), "{e}");
    let e = err(&c, &format!(r#"{{"op":"add_namespace","subsystem":"{SUB}","nsid":3,"backend":"file","path":"/nonexistent/nvmflab/img"}}"#));
    assert!(e.contains("/nonexistent/nvmflab/img"), "a backend that does not open: {e}");
    assert!(err(&c, &format!(r#"{{"op":"add_subsystem","nqn":"{SUB}"}}"#)).contains("exists already"));
    assert!(err(&c, r#"{"op":"remove_subsystem","nqn":"nqn.other"}"#).contains("no subsystem"));
    assert!(err(&c, &format!(r#"{{"op":"enable_namespace","subsystem":"{SUB}","nsid":9}}"#)).contains("no namespace 9"));
    assert!(err(&c, &format!(r#"{{"op":"disallow_host","subsystem":"{SUB}","host":"{HOST}"}}"#)).contains("not in the allowed hosts"));
    let e = err(&c, &format!(r#"{{"op":"set_host","nqn":"{HOST}","dhchap_key":"DHHC-1:00:bm90IGEga2V5:"}}"#));
    assert!(e.contains("dhchap_key"), "{e}");
    let e = err(&c, &format!(r#"{{"op":"set_host","nqn":"{HOST}","dhchap_ctrl_key":"{KEY}"}}"#));
    assert!(e.contains("needs dhchap_key"), "{e}");
    assert!(err(&c, &format!(r#"{{"op":"set_host","nqn":"{HOST}","dhchap_hash":"md5"}}"#)).contains("dhchap_hash"));
    assert!(err(&c, &format!(r#"{{"op":"set_host","nqn":"{HOST}","dhchap_dhgroup":"modp"}}"#)).contains("dhchap_dhgroup"));
    assert!(err(&c, r#"{"op":"remove_host","nqn":"nqn.nobody"}"#).contains("no host"));
    assert!(err(&c, &format!(r#"{{"op":"add_subsystem","nqn":"{}"}}"#, "n".repeat(300))).contains("NQN"));
    assert_eq!(c.handle_json(r#"{"op":"show"}"#), before, "a refused request changed the target");
    assert!(t.host_auth(HOST).is_none());
    assert_eq!(t.generation(), 1);
}

#[test]
fn hash_and_group_set_before_the_key_are_kept() {
    let (c, t) = control();
    let r = c.handle_json(&format!(r#"{{"op":"set_host","nqn":"{HOST}","dhchap_hash":"hmac(sha384)","dhchap_dhgroup":"ffdhe4096"}}"#));
    assert_eq!(r["ok"], true, "{r}");
    assert!(t.host_auth(HOST).is_none(), "no key yet: the host need not authenticate");
    assert_eq!(c.handle_json(&format!(r#"{{"op":"set_host","nqn":"{HOST}","dhchap_key":"{KEY}"}}"#))["ok"], true);
    let a = t.host_auth(HOST).expect("now it must");
    assert_eq!((a.dhchap_hash.name(), a.dhchap_dhgroup.name()), ("sha384", "ffdhe4096"));
    assert_eq!(c.handle_json(&format!(r#"{{"op":"remove_host","nqn":"{HOST}"}}"#))["ok"], true);
    assert!(t.host_auth(HOST).is_none());
}

#[test]
fn namespaces_and_subsystems_change_the_running_target() {
    let (c, t) = control();
    let ok = |json: String| assert_eq!(c.handle_json(&json)["ok"], true, "{json}");
    ok(format!(r#"{{"op":"add_namespace","subsystem":"{SUB}","nsid":4,"backend":"null","size":8192,"uuid":"91fdba0d-f87b-4c25-b80f-db7be1418b9e","enabled":false}}"#));
    let s = t.subsystem(SUB).unwrap();
    assert_eq!(s.namespaces.len(), 2);
    assert!(s.namespace(4).is_none(), "added disabled: inactive");
    ok(format!(r#"{{"op":"enable_namespace","subsystem":"{SUB}","nsid":4}}"#));
    assert_eq!(t.subsystem(SUB).unwrap().namespace(4).unwrap().1.uuid[..2], [0x91, 0xfd]);
    ok(format!(r#"{{"op":"remove_namespace","subsystem":"{SUB}","nsid":4}}"#));
    assert!(!s.namespaces[1].enabled(), "a removed namespace is inactive for controllers holding the old list");
    assert_eq!(t.subsystem(SUB).unwrap().namespaces.len(), 1);
    ok(format!(r#"{{"op":"set_allow_any_host","subsystem":"{SUB}","allow":false}}"#));
    assert!(!t.subsystem(SUB).unwrap().allows(HOST));
    ok(format!(r#"{{"op":"allow_host","subsystem":"{SUB}","host":"{HOST}"}}"#));
    assert!(t.subsystem(SUB).unwrap().allows(HOST));
    let g = t.generation();
    ok(r#"{"op":"add_subsystem","nqn":"nqn.2024-01.io.nvmflab:ctl2"}"#.into());
    assert!(t.generation() > g, "the discovery log's GENCTR moves");
    ok(r#"{"op":"remove_subsystem","nqn":"nqn.2024-01.io.nvmflab:ctl2"}"#.into());
    assert!(t.subsystem("nqn.2024-01.io.nvmflab:ctl2").is_none());
}

/// A target with its control socket in a fresh temporary directory (removed when the guard drops).
fn start_with_socket() -> (nvmf_target::RunningTarget, PathBuf, tempfile::TempDir) {
    let dir = tempfile::Builder::new().prefix("nvmflab-ctl-").tempdir().unwrap();
    let sock = dir.path().join("c.sock");
    let mut c = config();
    c.target.control = Some(sock.clone());
    (nvmf_target::start(c).expect("start"), sock, dir)
}

fn reply(r: &mut BufReader<UnixStream>) -> Value {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

#[test]
fn the_socket_survives_hostile_clients() {
    let (t, sock, _dir) = start_with_socket();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&sock).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    // Several requests on one connection, a non-UTF-8 one among them.
    let s = UnixStream::connect(&sock).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    w.write_all(b"{\"op\":\"show\"}\n\xff\xfe\n{\"op\":\"nope\"}\n").unwrap();
    assert_eq!(reply(&mut r)["ok"], true);
    assert_eq!(reply(&mut r)["error"], "request is not UTF-8");
    assert!(reply(&mut r)["error"].as_str().unwrap().contains("unknown variant"));
    drop((w, r));
    // A line beyond the limit: refused, then the connection is closed.
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(&vec![b' '; 70_000]).unwrap();
    let mut all = String::new();
    s.read_to_string(&mut all).unwrap();
    assert!(all.contains("longer than 65536 bytes"), "{all}");
    // A client that connects and says nothing is dropped (after 5 s) without blocking others
    // forever; meanwhile the next client is served once it is.
    let _silent = UnixStream::connect(&sock).unwrap();
    let s = UnixStream::connect(&sock).unwrap();
    let mut w = s.try_clone().unwrap();
    w.write_all(b"{\"op\":\"show\"}\n").unwrap();
    assert_eq!(reply(&mut BufReader::new(s))["ok"], true);
    t.shutdown();
    assert!(!sock.exists());
}

#[test]
fn a_stale_socket_is_replaced_and_another_file_refused() {
    let tmp = tempfile::Builder::new().prefix("nvmflab-ctl-").tempdir().unwrap();
    let dir = tmp.path();
    let sock = dir.join("c.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap()); // leaves the file behind
    let mut c = config();
    c.target.control = Some(sock.clone());
    nvmf_target::start(c.clone()).expect("a stale socket is replaced").shutdown();
    let plain = dir.join("plain");
    std::fs::write(&plain, "keep me").unwrap();
    c.target.control = Some(plain.clone());
    let e = nvmf_target::start(c).err().expect("a regular file is not replaced").to_string();
    assert!(e.contains("not a socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&plain).unwrap(), "keep me");
}

fn ctl(sock: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nvmf-target-ctl")).arg("--socket").arg(sock).args(args).output().unwrap();
    (out.status.code().unwrap(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn the_ctl_client_exits_by_reply() {
    let (t, sock, _dir) = start_with_socket();
    let (rc, out, _) = ctl(&sock, &[r#"{"op":"show"}"#, &format!(r#"{{"op":"disable_namespace","subsystem":"{SUB}","nsid":1}}"#)]);
    assert_eq!((rc, out.lines().count()), (0, 2), "{out}");
    let (rc, out, _) = ctl(&sock, &[r#"{"op":"remove_subsystem","nqn":"nqn.x"}"#]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("no subsystem"), "{out}");
    t.shutdown();
    let (rc, _, err) = ctl(&sock, &[r#"{"op":"show"}"#]);
    assert_eq!(rc, 2);
    assert!(err.contains("c.sock"), "{err}");
}

fn ctl_stdin(sock: &Path, input: &[u8]) -> (i32, String, String) {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvmf-target-ctl"))
        .arg("--socket")
        .arg(sock)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// Issue 41: a non-UTF-8 stdin line stopped the input silently (exit 0, later requests never
/// sent); an empty argument waited 5 s for a reply and exited as if the socket were unreachable.
#[test]
fn the_ctl_client_refuses_bad_input_by_name_and_sends_the_rest() {
    let (t, sock, _dir) = start_with_socket();
    let disable = format!(r#"{{"op":"disable_namespace","subsystem":"{SUB}","nsid":1}}"#);
    let input = [b"{\"op\":\"show\"}\n\xff\xfe\n".as_slice(), disable.as_bytes(), b"\n"].concat();
    let (rc, out, err) = ctl_stdin(&sock, &input);
    assert_eq!(rc, 2, "bad input: {out} {err}");
    assert!(err.contains("stdin line 2: not UTF-8"), "{err}");
    assert_eq!(out.lines().count(), 2, "both good lines sent: {out}");
    let shown = t.control().handle_json(r#"{"op":"show"}"#);
    assert_eq!(shown["subsystems"][0]["namespaces"][0]["enabled"], false, "the line after the bad one took effect: {shown}");

    let started = std::time::Instant::now();
    let (rc, out, err) = ctl(&sock, &[r#"{"op":"show"}"#, " "]);
    assert_eq!(rc, 2, "{out} {err}");
    assert!(err.contains("request 2 is empty"), "{err}");
    assert!(out.is_empty(), "nothing sent: {out}");
    // The old client waited for the server's 5 s read timeout; this one never connects.
    assert!(started.elapsed() < std::time::Duration::from_secs(4), "{:?}", started.elapsed());

    let (rc, out, _) = ctl(&sock, &[r#"{"op":"show","extra":1}"#]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("unknown field `extra`"), "{out}");
    t.shutdown();
}

/// Issue 41: add_namespace exported /etc/shadow to any allowed host. Only files under the
/// configured directories (by default those of the configured file namespaces) are opened.
#[test]
fn add_namespace_opens_only_files_under_the_allowed_directories() {
    let dir = tempfile::Builder::new().prefix("nvmflab-ctl-").tempdir().unwrap();
    let img = dir.path().join("ns1.img");
    std::fs::File::create(&img).unwrap().set_len(1 << 20).unwrap();
    std::fs::File::create(dir.path().join("ns2.img")).unwrap().set_len(1 << 20).unwrap();
    let mut c = config();
    c.subsystems[0].namespaces[0].backend = nvmf_target::config::BackendConfig::File { path: img };
    let t = Arc::new(Target::new(c.target.clone(), &c.subsystems, &c.ports).unwrap());
    let ctl = Control::new(t, c);
    let add = |nsid: u32, path: &str| format!(r#"{{"op":"add_namespace","subsystem":"{SUB}","nsid":{nsid},"backend":"file","path":"{path}"}}"#);
    let before = ctl.handle_json(r#"{"op":"show"}"#);
    let e = err(&ctl, &add(2, "/etc/shadow"));
    assert!(e.contains("/etc/shadow is outside the directories allowed"), "{e}");
    let e = err(&ctl, &add(2, &format!("{}/../../../etc/passwd", dir.path().display())));
    assert!(e.contains("outside"), "{e}");
    assert_eq!(ctl.handle_json(r#"{"op":"show"}"#), before, "refusals change nothing");
    let r = ctl.handle_json(&add(2, &dir.path().join("ns2.img").display().to_string()));
    assert_eq!(r["ok"], true, "a file beside the configured one: {r}");
}

/// Found by blktests' bed: a target started with no namespace chose 64-byte buffer alignment, so
/// the first O_DIRECT file namespace added at run time was refused. With `control` set, buffers
/// are page aligned from the start.
#[test]
fn a_file_namespace_can_be_added_to_a_target_started_without_one() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ctl-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("ns.img");
    std::fs::File::create(&img).unwrap().set_len(1 << 20).unwrap();
    let mut c = TargetConfig::empty();
    c.ports.push(PortConfig { addr: "127.0.0.1:0".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() });
    c.target.control = Some(dir.join("c.sock"));
    c.target.control_allow_paths = Some(vec![dir.clone()]);
    let t = nvmf_target::start(c).expect("start with no subsystem");
    let ctl = t.control();
    assert_eq!(ctl.handle_json(&format!(r#"{{"op":"add_subsystem","nqn":"{SUB}"}}"#))["ok"], true);
    let add = format!(r#"{{"op":"add_namespace","subsystem":"{SUB}","nsid":1,"backend":"file","path":"{}"}}"#, img.display());
    let r = ctl.handle_json(&add);
    assert_eq!(r["ok"], true, "{r}");
    t.shutdown();
    std::fs::remove_dir_all(&dir).unwrap();
}
