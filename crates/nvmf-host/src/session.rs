//! A controller that comes back after its connection is lost, as the Linux host's error recovery
//! does: any queue that loses its connection (closed, reset, or silent so that Keep Alive goes
//! unanswered within KATO) has the whole controller reconnected (admin queue first, with a new
//! controller ID), then joins its I/O queue again and resubmits the commands it had in flight.
//! Attempts follow [`ReconnectPolicy`] (`--reconnect-delay`, `--ctrl-loss-tmo`); each outage
//! is recorded (start, end, attempts, cause) for the run report.
//!
//! [`Session`] is shared by the threads that own one [`SessionQueue`] each. The first thread
//! that notices a loss reconnects the controller under the session's lock; the others find a
//! newer epoch when they get the lock and only rejoin their own queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::controller::LossSignal;
use crate::reconnect::{ReconnectPolicy, Schedule, Step};
use crate::{Completion, ConnectOptions, Controller, Error, IoQueue, IoQueueParams, Result};

/// One time the controller was unreachable.
#[derive(Debug, Clone)]
pub struct Outage {
    /// When the loss was first noticed.
    pub start: Instant,
    /// When the controller and every queue that noticed the loss were back; `None`: never
    /// (ctrl-loss-tmo expired).
    pub end: Option<Instant>,
    /// Connect attempts, the successful one included.
    pub attempts: u32,
    /// What revealed the loss (the first error seen).
    pub cause: String,
    /// The controller epoch this outage ended in (1 for the first reconnect).
    epoch: u64,
}

/// Checks a freshly reconnected controller still is the one the caller planned for (e.g. the
/// namespace kept its size); an error here ends the session.
pub type ReconnectCheck = Box<dyn Fn(&Controller) -> Result<()> + Send + Sync>;

/// What a queue needs to join the current controller.
#[derive(Clone)]
struct Link {
    params: IoQueueParams,
    epoch: u64,
    lost: Arc<LossSignal>,
}

struct State {
    ctrl: Option<Controller>,
    link: Link,
    gave_up: Option<String>,
    outages: Vec<Outage>,
}

pub struct Session {
    opts: ConnectOptions,
    subnqn: String,
    policy: ReconnectPolicy,
    /// Set Features Number of Queues asked again after each reconnect.
    io_queues: Option<u16>,
    check: Option<ReconnectCheck>,
    /// Mirrors `state.link.epoch`, so queues notice a reconnect without taking the lock.
    epoch: AtomicU64,
    state: Mutex<State>,
}

impl Session {
    /// Takes over a connected controller.
    pub fn new(ctrl: Controller, policy: ReconnectPolicy) -> Session {
        let params = ctrl.io_queue_params();
        let link = Link { epoch: 0, lost: ctrl.loss_signal(), params: params.clone() };
        Session {
            opts: params.opts,
            subnqn: params.subnqn,
            policy,
            io_queues: None,
            check: None,
            epoch: AtomicU64::new(0),
            state: Mutex::new(State { ctrl: Some(ctrl), link, gave_up: None, outages: Vec::new() }),
        }
    }

    /// Asks for `n` I/O queues (Set Features Number of Queues) again after every reconnect.
    pub fn with_io_queues(mut self, n: u16) -> Session {
        self.io_queues = Some(n);
        self
    }

    pub fn with_check(mut self, check: ReconnectCheck) -> Session {
        self.check = Some(check);
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Connects I/O queue `qid` to the current controller.
    pub fn io_queue(&self, qid: u16, depth: usize, max_io: usize) -> Result<SessionQueue<'_>> {
        let link = self.lock().link.clone();
        let queue = IoQueue::connect(&link.params, qid, depth, max_io)?;
        Ok(SessionQueue { queue, session: self, epoch: link.epoch, lost: link.lost, retried: 0, recovered: false })
    }

    /// Every outage so far, in time order.
    pub fn outages(&self) -> Vec<Outage> {
        self.lock().outages.clone()
    }

    /// The controller, for a clean shutdown; `None` once reconnecting gave up.
    pub fn into_controller(self) -> Option<Controller> {
        self.state.into_inner().unwrap_or_else(|e| e.into_inner()).ctrl
    }

    /// Called by a queue whose connection to controller `seen_epoch` was lost at `noticed`:
    /// returns the link to a live controller, reconnecting it first if nobody did since.
    fn recover(&self, seen_epoch: u64, noticed: Instant, why: &str) -> Result<Link> {
        let mut st = self.lock();
        if st.link.epoch != seen_epoch {
            return Ok(st.link.clone());
        }
        if let Some(why) = &st.gave_up {
            return Err(Error::ControllerLost(why.clone()));
        }
        // The keep-alive thread may have noticed first (a silent target).
        let (mut lost_at, mut cause) = (noticed, why.to_string());
        if let Some((at, ka_why)) = st.link.lost.detail() {
            if at < lost_at {
                (lost_at, cause) = (at, ka_why);
            }
        }
        // A queue that could not rejoin after the last outage keeps its first time stamp, so
        // ctrl-loss-tmo bounds the whole episode; the reported window does not overlap the last.
        let start = st.outages.last().and_then(|o| o.end).map_or(lost_at, |e| lost_at.max(e));
        tracing::warn!("connection to {} lost ({cause}); reconnecting", self.opts.addr);
        // Dropping the old controller closes its admin queue: the target ends its I/O queues.
        drop(st.ctrl.take());
        let mut schedule = Schedule::new(self.policy, lost_at);
        let mut last_err = String::new();
        loop {
            let now = Instant::now();
            match schedule.step(now) {
                Step::WaitUntil(t) => std::thread::sleep(t - now),
                Step::GiveUp => {
                    let msg = self.give_up_message(&cause, schedule.attempts(), &last_err);
                    st.outages.push(Outage { start, end: None, attempts: schedule.attempts(), cause, epoch: u64::MAX });
                    st.gave_up = Some(msg.clone());
                    return Err(Error::ControllerLost(msg));
                }
                Step::Attempt => match self.connect_once() {
                    Ok(ctrl) => {
                        let epoch = st.link.epoch + 1;
                        st.link = Link { epoch, lost: ctrl.loss_signal(), params: ctrl.io_queue_params() };
                        st.ctrl = Some(ctrl);
                        let attempts = schedule.attempts() + 1;
                        st.outages.push(Outage { start, end: Some(Instant::now()), attempts, cause, epoch });
                        self.epoch.store(epoch, Ordering::Release);
                        tracing::warn!("reconnected to {} after {attempts} attempt(s)", self.opts.addr);
                        return Ok(st.link.clone());
                    }
                    Err(e) if e.is_connection_loss() => {
                        tracing::info!("reconnect attempt to {} failed: {e}", self.opts.addr);
                        last_err = e.to_string();
                        schedule.failed(Instant::now());
                    }
                    Err(e) => {
                        // The target answered, and not as before: retrying would not help.
                        let msg = format!("reconnected to {} but: {e}", self.opts.addr);
                        st.outages.push(Outage {
                            start,
                            end: None,
                            attempts: schedule.attempts() + 1,
                            cause,
                            epoch: u64::MAX,
                        });
                        st.gave_up = Some(msg.clone());
                        return Err(Error::ControllerLost(msg));
                    }
                },
            }
        }
    }

    fn connect_once(&self) -> Result<Controller> {
        let ctrl = Controller::connect(&self.opts, &self.subnqn)?;
        if let Some(n) = self.io_queues {
            let (nsq, ncq) = ctrl.set_number_of_queues(n)?;
            if nsq.min(ncq) < n {
                return Err(Error::Unsupported(format!(
                    "the controller now grants {} I/O queues, {n} needed",
                    nsq.min(ncq)
                )));
            }
        }
        if let Some(check) = &self.check {
            check(&ctrl)?;
        }
        Ok(ctrl)
    }

    fn give_up_message(&self, cause: &str, attempts: u32, last_err: &str) -> String {
        let addr = &self.opts.addr;
        match self.policy.ctrl_loss_tmo {
            Some(t) if t.is_zero() => format!("{addr}: {cause} (reconnecting is off: --ctrl-loss-tmo 0)"),
            Some(t) => {
                let last = if last_err.is_empty() { String::new() } else { format!("; last attempt: {last_err}") };
                format!(
                    "{addr}: {cause}; not back within --ctrl-loss-tmo {} ({attempts} attempt(s) every {}{last})",
                    secs(t),
                    secs(self.policy.reconnect_delay)
                )
            }
            None => format!("{addr}: {cause}"),
        }
    }

    /// A queue rejoined controller `epoch` at `at`: the outage lasts until its last queue is back.
    fn queue_restored(&self, epoch: u64, at: Instant) {
        let mut st = self.lock();
        if let Some(o) = st.outages.iter_mut().rev().find(|o| o.epoch == epoch) {
            o.end = o.end.map(|e| e.max(at));
        }
    }
}

fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// An I/O queue of a [`Session`]: the same calls as [`IoQueue`] (through [`SessionQueue::queue`]
/// for submission and buffers), with `commit` and `poll` riding through a lost connection.
pub struct SessionQueue<'s> {
    queue: IoQueue,
    session: &'s Session,
    epoch: u64,
    lost: Arc<LossSignal>,
    retried: u64,
    recovered: bool,
}

impl SessionQueue<'_> {
    /// Submission, buffers and namespace; commands submitted here are resubmitted after a reconnect.
    pub fn queue(&mut self) -> &mut IoQueue {
        &mut self.queue
    }

    pub fn depth(&self) -> usize {
        self.queue.depth()
    }

    /// Commands resubmitted on new connections so far.
    pub fn retried(&self) -> u64 {
        self.retried
    }

    /// True once after each reconnect (so a caller restarts its stall clock).
    pub fn take_recovered(&mut self) -> bool {
        std::mem::take(&mut self.recovered)
    }

    pub fn commit(&mut self) -> Result<()> {
        match self.queue.commit() {
            Err(e) if e.is_connection_loss() => self.recover(e.to_string()),
            r => r,
        }
    }

    /// As [`IoQueue::poll`]; after a loss, `done` keeps what completed before it and the rest
    /// is resubmitted.
    pub fn poll(&mut self, wait: Duration, done: &mut Vec<Completion>) -> Result<()> {
        if self.lost.is_raised() {
            self.recover("Keep Alive failed".into())?;
        } else if self.session.epoch.load(Ordering::Acquire) != self.epoch {
            // Another queue reconnected the controller; this connection belongs to the old one.
            self.recover("the controller was reconnected".into())?;
        }
        match self.queue.poll(wait, done) {
            Err(e) if e.is_connection_loss() => self.recover(e.to_string()),
            r => r,
        }
    }

    fn recover(&mut self, mut why: String) -> Result<()> {
        let noticed = Instant::now();
        loop {
            let link = self.session.recover(self.epoch, noticed, &why)?;
            (self.epoch, self.lost) = (link.epoch, Arc::clone(&link.lost));
            match self.queue.reconnect(&link.params) {
                Ok(n) => {
                    self.retried += n as u64;
                    self.recovered = true;
                    self.session.queue_restored(link.epoch, Instant::now());
                    return Ok(());
                }
                // Lost again, or the controller it should join is already gone (the target
                // restarted again): reconnect the controller, within the same ctrl-loss-tmo.
                Err(e) if e.is_connection_loss() || matches!(e, Error::Status { .. }) => why = e.to_string(),
                Err(e) => return Err(e),
            }
        }
    }
}
