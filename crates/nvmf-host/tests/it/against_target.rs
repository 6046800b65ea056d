//! The library API against the real target, in process on an ephemeral loopback port: connect,
//! identify, every I/O command (with and without SQ flow control), discovery and shutdown.

use std::path::Path;
use std::time::Duration;

use nvmf_host::{default_hostnqn, discover, Completion, ConnectOptions, Controller, Error, IoQueue};

const NQN: &str = "nqn.2024-01.io.nvmflab:host-lib";
const T: Duration = Duration::from_secs(5);

fn start_target() -> nvmf_target::RunningTarget {
    let cfg = format!(
        r#"
[target]
cores = [0]
in_capsule_data_size = 4096
maxh2cdata = 16384

[[port]]
addr = "127.0.0.1:0"

[[subsystem]]
nqn = "{NQN}"
allow_any_host = true
  [[subsystem.namespace]]
  nsid = 1
  backend = "ram"
  size = "4MiB"
  block_size = 512
"#
    );
    let config = nvmf_target::config::toml::parse(&cfg, Path::new("test.toml")).expect("config");
    nvmf_target::start(config).expect("target starts")
}

/// Waits (5 s at most) until `n` commands completed; one poll may return several.
fn wait_for(q: &mut IoQueue, n: usize) -> Vec<Completion> {
    let deadline = std::time::Instant::now() + T;
    let mut all = Vec::new();
    let mut done = Vec::new();
    while all.len() < n {
        assert!(std::time::Instant::now() < deadline, "{} of {n} completions within {T:?}", all.len());
        q.poll(Duration::from_millis(100), &mut done).expect("poll");
        all.append(&mut done);
    }
    all
}

#[test]
fn connect_identify_io_discover_and_shutdown() {
    let target = start_target();
    let addr = target.listen_addrs()[0];
    // With SQ flow control disabled the target ends reads with a C2HData SUCCESS flag.
    for (digests, disable_sqflow) in [(false, false), (true, false), (false, true), (true, true)] {
        let mut opts = ConnectOptions::new(addr.to_string(), default_hostnqn());
        opts.hdr_digest = digests;
        opts.data_digest = digests;
        opts.disable_sqflow = disable_sqflow;
        opts.kato_ms = 2000;
        let ctrl = Controller::connect(&opts, NQN).expect("connect");
        assert_eq!(ctrl.identity().subnqn, NQN);
        assert_eq!(ctrl.active_namespaces().unwrap(), vec![1]);
        let ns = ctrl.identify_namespace(1).unwrap();
        assert_eq!(ns.nsze * ns.block_size(), 4 << 20);
        assert!(ctrl.set_number_of_queues(2).unwrap().0 >= 1);

        let params = ctrl.io_queue_params();
        assert_eq!(params.in_capsule, 4096);
        let mut q = IoQueue::connect(&params, 1, 8, 64 << 10).expect("I/O queue");
        q.set_namespace(1, 512);

        // 2 KiB in the capsule, 64 KiB through R2T in 16 KiB H2CData chunks.
        for len in [2048usize, 64 << 10] {
            let data: Vec<u8> = (0..len).map(|i| (i * 13 + len) as u8).collect();
            q.write(8, &data, T).unwrap();
            let mut back = vec![0u8; len];
            q.read(8, &mut back, T).unwrap();
            assert!(back == data, "{len} bytes read back differ");
        }

        q.submit_write_zeroes(1, 8, 4).unwrap();
        q.commit().unwrap();
        wait_for(&mut q, 1).pop().unwrap().result.expect("write zeroes");
        let mut back = vec![0xFFu8; 2048];
        q.read(8, &mut back, T).unwrap();
        assert!(back.iter().all(|&b| b == 0), "write zeroes zeroed");

        q.submit_flush(2).unwrap();
        q.submit_deallocate(3, &[(0, 8), (100, 8)]).unwrap();
        q.commit().unwrap();
        let mut tags = Vec::new();
        for c in wait_for(&mut q, 2) {
            c.result.expect("flush / deallocate");
            tags.push(c.tag);
        }
        tags.sort();
        assert_eq!(tags, vec![2, 3]);

        let mut buf = vec![0u8; 512];
        let err = q.read(1 << 30, &mut buf, T).unwrap_err();
        assert!(matches!(err, Error::Status { .. }), "{err}");
        assert!(err.to_string().contains("LBA Out of Range"), "{err}");

        drop(q);
        ctrl.shutdown().expect("shutdown");
    }

    let page = discover(&ConnectOptions::new(addr.to_string(), default_hostnqn())).expect("discover");
    assert!(page.entries.iter().any(|e| e.subnqn == NQN && e.trsvcid == addr.port().to_string()));
    target.shutdown();
}

#[test]
fn unknown_subsystem_is_refused_by_name() {
    let target = start_target();
    let opts = ConnectOptions::new(target.listen_addrs()[0].to_string(), default_hostnqn());
    let err = Controller::connect(&opts, "nqn.2024-01.io.nvmflab:nope").err().expect("refused");
    assert!(err.to_string().starts_with("Connect failed: the target answered"), "{err}");
}

#[test]
fn keep_alive_holds_an_idle_controller_past_its_timeout() {
    let target = start_target();
    let mut opts = ConnectOptions::new(target.listen_addrs()[0].to_string(), default_hostnqn());
    opts.kato_ms = 1000;
    let ctrl = Controller::connect(&opts, NQN).expect("connect");
    // No command of ours for 2.5 timeouts: only the Keep Alive thread talks to the target.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(ctrl.active_namespaces().expect("controller still alive"), vec![1]);
    ctrl.shutdown().expect("shutdown");
    target.shutdown();
}
