//! Errors of the host library. Each says what the target answered or did, never just "failed".

use nvmf_proto::Status;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },
    #[error("socket error: {0}")]
    Io(#[from] std::io::Error),
    #[error("the target closed the connection")]
    Closed,
    /// The target broke the NVMe/TCP protocol (bad PDU, unexpected CID, digest mismatch ...).
    #[error("protocol error from the target: {0}")]
    Protocol(String),
    /// The target ended the connection with a C2HTermReq.
    #[error("the target terminated the connection (C2HTermReq): {reason} (FES {fes:#x}, FEI {fei:#x})")]
    TermReq { fes: u16, fei: u32, reason: &'static str },
    /// A command completed with a non-success NVMe status.
    #[error("{command} failed: the target answered {status}")]
    Status { command: &'static str, status: Status },
    #[error("{what}: {detail}")]
    Decode { what: &'static str, detail: String },
    /// `--verify` found a block without the expected pattern (the message names the LBA).
    #[error("{0}")]
    Verify(String),
    #[error("timed out: {0}")]
    Timeout(String),
    /// The request cannot be carried out with what the controller advertised.
    #[error("{0}")]
    Unsupported(String),
    /// DH-HMAC-CHAP failed: the controller refused our secret, or we refused the controller.
    #[error("authentication failed: {0}")]
    Auth(String),
    /// Reconnecting failed for longer than `--ctrl-loss-tmo`: the controller is gone for good.
    #[error("controller lost: {0}")]
    ControllerLost(String),
}

impl Error {
    /// The connection is gone or silent (closed, reset, refused, timed out): reconnecting may
    /// help. Protocol errors, TermReqs and NVMe status codes are answers, not losses: retrying
    /// the same thing on a new connection would get the same answer.
    pub fn is_connection_loss(&self) -> bool {
        matches!(self, Error::Connect { .. } | Error::Io(_) | Error::Closed | Error::Timeout(_))
    }

    pub(crate) fn decode(what: &'static str, e: impl std::fmt::Display) -> Self {
        Error::Decode { what, detail: e.to_string() }
    }
}

/// Name of a TermReq Fatal Error Status (NVMe/TCP 1.0, figure 26).
pub fn fes_name(fes: u16) -> &'static str {
    use nvmf_proto::pdu::fes;
    match fes {
        fes::INVALID_PDU_HDR => "Invalid PDU Header Field",
        fes::PDU_SEQ_ERR => "PDU Sequence Error",
        fes::HDR_DIGEST_ERR => "Header Digest Error",
        fes::DATA_OUT_OF_RANGE => "Data Transfer Out of Range",
        fes::DATA_LIMIT_EXCEEDED => "Data Transfer Limit Exceeded",
        fes::UNSUPPORTED_PARAM => "Unsupported Parameter",
        _ => "Unknown Fatal Error Status",
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
