//! Flush and FUA through the whole command path (capsule → plan → backend): a Flush of a file
//! namespace must complete only after an fdatasync, a write with FUA only after a RWF_DSYNC
//! write. The file backend counts both when the kernel completes them, so a Flush answered
//! without syncing, or FUA ignored, fails these tests.

use crate::common;

use common::{file_target, Queue};
use nvmf_proto::nvme::{io_opcode, SglDescriptor};
use nvmf_proto::{Cqe, Sqe, Status};
use nvmf_target::backend::Backend;
use nvmf_target::core::Target;
use std::sync::atomic::Ordering::Relaxed;

/// (fdatasyncs, RWF_DSYNC writes) of the namespace.
fn counts(t: &Target) -> (u64, u64) {
    let subs = t.subsystems();
    let Backend::File(f) = &subs[0].namespaces[0].backend else { panic!("file namespace") };
    (f.counters().fdatasyncs.load(Relaxed), f.counters().dsync_writes.load(Relaxed))
}

fn write(q: &mut Queue, fua: bool) -> Cqe {
    let mut w = Sqe::new(io_opcode::WRITE, 0);
    w.set_nsid(1);
    w.set_nlb(7);
    if fua {
        w.set_cdw(12, w.cdw(12) | 1 << 30);
    }
    w.set_sgl(SglDescriptor::in_capsule(0, 4096));
    q.command(w, &[0xA5; 4096])
}

#[test]
fn flush_of_a_file_namespace_completes_after_fdatasync() {
    let (t, dir) = file_target("durable-flush");
    let (_admin, mut q) = Queue::admin_and_io(&t);
    assert_eq!(write(&mut q, false).status, Status::SUCCESS);
    assert_eq!(counts(&t), (0, 0));
    for (nsid, n) in [(1u32, 1u64), (u32::MAX, 2)] {
        let mut f = Sqe::new(io_opcode::FLUSH, 0);
        f.set_nsid(nsid);
        assert_eq!(q.command(f, &[]).status, Status::SUCCESS);
        assert_eq!(counts(&t).0, n, "Flush nsid {nsid:#x} ran fdatasync before completing");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn fua_write_completes_after_a_dsync_write() {
    let (t, dir) = file_target("durable-fua");
    let (_admin, mut q) = Queue::admin_and_io(&t);
    assert_eq!(write(&mut q, true).status, Status::SUCCESS);
    assert_eq!(counts(&t), (0, 1), "FUA: one RWF_DSYNC write, no separate fdatasync");
    assert_eq!(write(&mut q, false).status, Status::SUCCESS);
    assert_eq!(counts(&t), (0, 1), "no FUA: a plain write");
    std::fs::remove_dir_all(dir).unwrap();
}
