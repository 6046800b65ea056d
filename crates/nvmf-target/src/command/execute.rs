//! I/O execution of the command layer: an I/O plan becomes backend requests, which wait here
//! until the reactor submits them; their completions come back as statuses and byte counts.

use super::{BackendRequest, Commands, Queued};
use crate::backend::{AlignedBuf, IoOp, IoRequest};
use crate::io::{self, IoPlan};
use crate::stats::NsStats;
use nvmf_proto::Status;
use std::sync::Arc;

impl Commands {
    /// Whether `plan` writes to a namespace that keeps nothing (null): its data need not be
    /// copied anywhere, so in-capsule data is not moved into a command buffer. False for every
    /// other plan, and for a namespace that is not there (execute answers that).
    pub fn discards_data(&self, plan: IoPlan) -> bool {
        let IoPlan::Write { nsid, .. } = plan else { return false };
        self.subsys.as_ref().and_then(|s| s.namespace(nsid)).is_some_and(|(_, n)| n.backend.discards_writes())
    }

    /// Queues the backend requests of `plan`, whose data (if any) is in `buf`, under `tag`.
    /// `Ok(n)`: `n` completions will come back with `tag` (0: the command is done, successfully);
    /// `Err`: it fails with that status. `buf` must stay valid and unmoved until they have.
    pub fn execute(&mut self, plan: IoPlan, buf: &mut AlignedBuf, tag: u64) -> Result<u32, Status> {
        let subsys = self.subsys.clone().ok_or(Status::INTERNAL_ERROR)?;
        // The plan names its namespace by nsid: the subsystem may have been taken again since
        // (a namespace added or removed), and that nsid may be gone or another namespace now.
        let resolve = |nsid: u32, end: u64| -> Result<usize, Status> {
            let (i, n) = subsys.namespace(nsid).ok_or(Status::INVALID_NS.with_dnr())?;
            if end > n.nlb << n.lbads {
                return Err(Status::LBA_OUT_OF_RANGE.with_dnr());
            }
            Ok(i)
        };
        let plan_ns = match plan {
            IoPlan::Read { nsid, offset, len } | IoPlan::Write { nsid, offset, len, .. } => resolve(nsid, offset + len as u64)?,
            IoPlan::WriteZeroes { nsid, offset, len } => resolve(nsid, offset + len)?,
            IoPlan::Dsm { nsid, .. } | IoPlan::Flush { nsid: Some(nsid) } => resolve(nsid, 0)?,
            IoPlan::Flush { nsid: None } => 0,
        };
        if let IoPlan::Read { len, .. } = plan {
            if subsys.namespaces[plan_ns].backend.reads_zeroes() {
                // A null read: the buffer is written only if something wrote it since the last.
                buf.zero_prefix(len as usize);
                return Ok(self.queue_request(Queued::Done(tag)));
            }
        }
        let ptr = buf.as_mut_ptr();
        let req = |op, offset, len| IoRequest { op, offset, len, buf: ptr, tag };
        let one = |ns, r| Queued::Submit(ns, r);
        let ns = plan_ns;
        let n = match plan {
            IoPlan::Read { offset, len, .. } => self.queue_request(one(ns, req(IoOp::Read, offset, len as u64))),
            IoPlan::Write { offset, len, fua, .. } => {
                let op = if fua { IoOp::WriteFua } else { IoOp::Write };
                self.queue_request(one(ns, req(op, offset, len as u64)))
            }
            IoPlan::WriteZeroes { offset, len, .. } => self.queue_request(one(ns, req(IoOp::WriteZeroes, offset, len))),
            IoPlan::Flush { nsid: Some(_) } => self.queue_request(one(ns, req(IoOp::Flush, 0, 0))),
            IoPlan::Flush { nsid: None } => {
                (0..subsys.namespaces.len()).map(|ns| self.queue_request(one(ns, req(IoOp::Flush, 0, 0)))).sum()
            }
            IoPlan::Dsm { deallocate, .. } => {
                let mut ranges = std::mem::take(&mut self.ranges);
                ranges.clear();
                let r = io::dsm_ranges(&subsys.namespaces[ns], buf.as_slice(), &mut ranges);
                let n = match r {
                    Ok(()) if deallocate => {
                        ranges.iter().map(|&(o, l)| self.queue_request(one(ns, req(IoOp::Deallocate, o, l)))).sum()
                    }
                    Ok(()) => 0,
                    Err(status) => {
                        self.ranges = ranges;
                        return Err(status);
                    }
                };
                self.ranges = ranges;
                n
            }
        };
        Ok(n)
    }

    fn queue_request(&mut self, q: Queued) -> u32 {
        self.queued.push(q);
        self.in_flight += 1;
        1
    }

    /// The backend requests queued since the last call, for the reactor to submit. Each
    /// request's buffer stays valid and unmoved until its completion is handed back
    /// ([`Commands::request_done`]): the transport reuses a buffer only after that, and the
    /// reactor keeps a closed connection until [`Commands::in_flight`] is 0.
    pub fn backend_requests(&mut self) -> impl Iterator<Item = BackendRequest<'_>> {
        // `execute` queues requests only on a queue with a subsystem, and a connected queue never
        // changes: `subsys` is there whenever a request is.
        let subsys = self.subsys.as_deref();
        self.queued.drain(..).filter_map(move |q| match q {
            Queued::Submit(ns, req) => Some(BackendRequest::Submit(&subsys?.namespaces[ns].backend, req)),
            Queued::Done(tag) => Some(BackendRequest::Done(tag)),
        })
    }

    /// Backend requests queued or submitted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// A backend request finished: the status it gives its command.
    pub fn request_done(&mut self, result: Result<(), i32>, cid: u16) -> Status {
        self.in_flight -= 1;
        match result {
            Ok(()) => Status::SUCCESS,
            Err(errno) => {
                tracing::warn!(errno, cid, "backend I/O failed");
                Status::DATA_TRANSFER_ERROR
            }
        }
    }

    /// An I/O command completes with `status`: counts its bytes, and returns the bytes it
    /// read for the host (0 unless a successful read).
    pub fn io_done(&self, plan: IoPlan, status: Status) -> u64 {
        let (nsid, read, written) = match plan {
            IoPlan::Read { nsid, len, .. } if status.is_success() => (nsid, len as u64, 0),
            IoPlan::Write { nsid, len, .. } if status.is_success() => (nsid, 0, len as u64),
            _ => return 0,
        };
        if let Some(q) = &self.queue {
            q.stats.bytes_read.add(read);
            q.stats.bytes_written.add(written);
            if let Some(n) = self.ns_stats(nsid) {
                n.bytes_read.add(read);
                n.bytes_written.add(written);
            }
        }
        read
    }
}

impl Commands {
    pub(super) fn ns_stats(&self, nsid: u32) -> Option<&Arc<NsStats>> {
        self.ns_stats.iter().find(|(id, _)| *id == nsid).map(|(_, s)| s)
    }
}
