//! Command buffers are aligned only as far as the namespaces' backends need (a cache line for
//! null and ram, what O_DIRECT asks for a file), which halves their resident memory against
//! page alignment. A file namespace must still read back what was written through them: a
//! buffer less aligned than O_DIRECT needs fails the I/O with EINVAL.

use crate::common;

use common::Queue;
use nvmf_proto::nvme::{io_opcode, SglDescriptor};
use nvmf_proto::{Sqe, Status};
use nvmf_target::backend::Backend;
use nvmf_target::config::BackendConfig;

#[test]
fn null_and_ram_namespaces_align_buffers_to_a_cache_line() {
    for backend in [BackendConfig::Null { size: 1 << 20 }, BackendConfig::Ram { size: 1 << 20 }] {
        let t = common::target(backend, |_| {});
        assert_eq!(t.buffer_align, 64);
    }
}

#[test]
fn a_file_namespace_reads_back_what_was_written_through_its_buffers() {
    let (t, dir) = common::file_target("align");
    let subs = t.subsystems();
    let Backend::File(f) = &subs[0].namespaces[0].backend else { panic!("file namespace") };
    assert!(f.memory_align().is_power_of_two());
    assert!(t.buffer_align >= f.memory_align().max(64), "{} < {}", t.buffer_align, f.memory_align());
    if !f.is_direct() {
        eprintln!("note: this filesystem refused O_DIRECT, so buffer alignment was not exercised");
    }
    let (_admin, mut q) = Queue::admin_and_io(&t);
    // Several sizes, so buffers of different capacities (and allocator bins) are used.
    for (i, (slba, len)) in [(0u64, 4096usize), (64, 512), (128, 8192), (200, 1024)].into_iter().enumerate() {
        let pattern: Vec<u8> = (0..len).map(|b| (b * 7 + i * 31) as u8 | 1).collect();
        let nlb = (len / 512 - 1) as u16;
        let mut w = Sqe::new(io_opcode::WRITE, 0);
        w.set_nsid(1);
        w.set_slba(slba);
        w.set_nlb(nlb);
        w.set_sgl(SglDescriptor::in_capsule(0, len as u32));
        assert_eq!(q.command(w, &pattern).status, Status::SUCCESS, "write of {len} bytes");
        let mut r = Sqe::new(io_opcode::READ, 0);
        r.set_nsid(1);
        r.set_slba(slba);
        r.set_nlb(nlb);
        r.set_sgl(SglDescriptor::transport(len as u32));
        let (data, cqe) = q.command_with_data(r, &[]);
        assert_eq!(cqe.status, Status::SUCCESS, "read of {len} bytes");
        assert!(data == pattern, "read of {len} bytes at LBA {slba} returned other data");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
