//! Fabrics commands: Connect (admin and I/O queues), Property Get/Set, Disconnect.

use crate::core::{Controller, Outcome, Port, Target, MAX_IO_QUEUES, MQES};
use nvmf_proto::fabrics::{
    nvme_version, reg, Cap, ConnectCmd, ConnectData, PropertyGet, PropertySet, CONNECT_DATA_LEN, DISCOVERY_NQN,
};
use nvmf_proto::{Sqe, Status};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

/// NVMe version reported in VS and Identify Controller VER.
pub const VERSION: u32 = nvme_version(1, 3, 0);

/// Byte offsets the Connect response names in IPO (with IATTR = 1 for the data).
mod ipo {
    pub const SQE_QID: u64 = 42;
    pub const SQE_SQSIZE: u64 = 44;
    pub const DATA_CNTLID: u64 = (1 << 16) | 16;
    pub const DATA_SUBNQN: u64 = (1 << 16) | 256;
    pub const DATA_HOSTNQN: u64 = (1 << 16) | 512;
}

pub enum ConnectResult {
    Accepted { ctrl: Arc<Controller>, qid: u16, sqsize: u16, hostnqn: String },
    Rejected { status: Status, result: u64 },
}

fn reject(status: Status, result: u64) -> ConnectResult {
    ConnectResult::Rejected { status: status.with_dnr(), result }
}

pub fn connect(target: &Target, port: Option<&Port>, sqe: &Sqe, data: &[u8], now: Instant) -> ConnectResult {
    let cmd = ConnectCmd::from_sqe(sqe);
    if cmd.recfmt != 0 {
        return reject(Status::CONNECT_INCOMPATIBLE_FORMAT, 0);
    }
    if data.len() < CONNECT_DATA_LEN {
        return reject(Status::SGL_INVALID_DATA_LEN, 0);
    }
    let Ok(d) = ConnectData::decode(data) else { return reject(Status::SGL_INVALID_DATA_LEN, 0) };
    if cmd.sqsize == 0 || cmd.sqsize > MQES {
        return reject(Status::CONNECT_INVALID_PARAM, ipo::SQE_SQSIZE);
    }
    let discovery = d.subnqn == DISCOVERY_NQN;
    let subsys = if discovery {
        None
    } else {
        match target.subsystem(&d.subnqn) {
            Some(s) if port.is_none_or(|p| p.exports(&s.nqn)) => Some(s),
            _ => {
                tracing::info!(subnqn = %d.subnqn, hostnqn = %d.hostnqn, "connect to unknown subsystem");
                return reject(Status::CONNECT_INVALID_PARAM, ipo::DATA_SUBNQN);
            }
        }
    };
    if let Some(s) = &subsys {
        if !s.allows(&d.hostnqn) {
            tracing::info!(subnqn = %d.subnqn, hostnqn = %d.hostnqn, "host not allowed");
            return reject(Status::CONNECT_INVALID_HOST, ipo::DATA_HOSTNQN);
        }
    }
    if cmd.qid == 0 {
        // Discovery controllers of hosts that disable keep-alive still expire (Linux nvmet too).
        let kato = if discovery && cmd.kato == 0 { target.settings.kato_default_ms } else { cmd.kato };
        return match target.create_controller(subsys, &d.hostnqn, d.hostid, kato, now) {
            Some(ctrl) => ConnectResult::Accepted { ctrl, qid: 0, sqsize: cmd.sqsize, hostnqn: d.hostnqn },
            None => reject(Status::CONNECT_CTRL_BUSY, 0),
        };
    }
    if discovery || cmd.qid > MAX_IO_QUEUES {
        return reject(Status::CONNECT_INVALID_PARAM, ipo::SQE_QID);
    }
    let ctrl = match target.find_controller(d.cntlid) {
        Some(c)
            if c.hostnqn == d.hostnqn
                && c.subsys.as_ref().map(|s| s.nqn.as_str()) == Some(d.subnqn.as_str())
                && !c.dead.load(Relaxed) =>
        {
            c
        }
        _ => return reject(Status::CONNECT_INVALID_PARAM, ipo::DATA_CNTLID),
    };
    if !ctrl.ready() {
        return reject(Status::CMD_SEQ_ERROR, 0);
    }
    if ctrl.subsys.as_ref().is_some_and(|s| cmd.qid > s.max_qid) {
        return reject(Status::CONNECT_INVALID_PARAM, ipo::SQE_QID);
    }
    if !ctrl.add_io_queue(cmd.qid) {
        return reject(Status::CONNECT_INVALID_PARAM, ipo::SQE_QID);
    }
    ConnectResult::Accepted { ctrl, qid: cmd.qid, sqsize: cmd.sqsize, hostnqn: d.hostnqn }
}

pub fn property_get(ctrl: &Controller, sqe: &Sqe) -> Outcome {
    let p = PropertyGet::from_sqe(sqe);
    let value = match p.offset {
        reg::CAP => Cap { mqes: MQES, to: 15, css_nvm: true }.to_u64(),
        reg::VS => VERSION as u64,
        reg::CC => ctrl.cc.load(Relaxed) as u64,
        reg::CSTS => ctrl.csts.load(Relaxed) as u64,
        _ => return Outcome::status(Status::INVALID_FIELD.with_dnr()),
    };
    Outcome::success(value)
}

pub fn property_set(ctrl: &Controller, sqe: &Sqe) -> Outcome {
    let p = PropertySet::from_sqe(sqe);
    match p.offset {
        reg::CC => {
            ctrl.set_cc(p.value as u32);
            Outcome::success(0)
        }
        _ => Outcome::status(Status::INVALID_FIELD.with_dnr()),
    }
}
