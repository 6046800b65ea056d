//! NVMe over RDMA (the NVMe over Fabrics RDMA transport binding; Linux's `nvme-rdma.h`).
//!
//! This file holds the binding's encodings, which need no RDMA library and are tested
//! everywhere: the RDMA CM private data of a connect request, its accept and its reject, and
//! the keyed SGL data block descriptor through which the host names its memory. The transport
//! itself (`rdma/queue.rs`, `rdma/listener.rs`) is built with the `rdma` cargo feature, on
//! rdma-core through the `nvmf-rdma` crate.
//!
//! Per command: the host SENDs a capsule (SQE plus in-capsule data up to IOCCSZ) into a receive
//! buffer we posted; read data goes to the host by RDMA WRITE, write data comes by RDMA READ of
//! the host's keyed SGL, and the 16-byte completion goes by SEND, posted after the WRITE on the
//! same queue pair so that the host sees the data before the completion.

use nvmf_proto::nvme::SglDescriptor;
use nvmf_proto::Sqe;

#[cfg(feature = "rdma")]
mod listener;
#[cfg(feature = "rdma")]
mod queue;
#[cfg(feature = "rdma")]
pub use listener::{spawn, RdmaListenerHandle};

/// Length of `struct nvme_rdma_cm_req` (recfmt, qid, hrqsize, hsqsize, cntlid, reserved).
pub const CM_REQ_LEN: usize = 32;
/// Length of `struct nvme_rdma_cm_rep` (recfmt, crqsize, reserved).
pub const CM_REP_LEN: usize = 32;
/// Largest queue a host may ask for: MQES (1023) + 1 entries.
pub const MAX_QUEUE_SIZE: u32 = 1024;

/// SGL descriptor type 4h, Keyed SGL Data Block, subtype 0h (address) or Fh (invalidate key).
const SGL_KEYED_DATA_BLOCK: u8 = 0x4;
const SGL_SUBTYPE_ADDRESS: u8 = 0x0;
const SGL_SUBTYPE_INVALIDATE: u8 = 0xF;

/// The SGL type the command layer is told this transport moves itself: a keyed data block.
/// The command layer compares types only, so the keyed descriptor's 24-bit length is handed
/// over in a normalized SQE (see [`normalize_sqe`]).
pub const TRANSFER_SGL: u8 = SGL_KEYED_DATA_BLOCK << 4;

/// Reject status codes (`enum nvme_rdma_cm_status`).
pub mod cm_status {
    pub const INVALID_LEN: u16 = 0x01;
    pub const INVALID_RECFMT: u16 = 0x02;
    pub const INVALID_QID: u16 = 0x03;
    pub const INVALID_HSQSIZE: u16 = 0x04;
    pub const INVALID_HRQSIZE: u16 = 0x05;
    pub const NO_RESOURCES: u16 = 0x06;
}

/// A connect request's private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmRequest {
    pub qid: u16,
    /// Host receive queue size: responses the host can take at once.
    pub hrqsize: u16,
    /// Host send queue size, 0's based (the Connect command's SQSIZE).
    pub hsqsize: u16,
    pub cntlid: u16,
}

impl CmRequest {
    /// Parses and checks the private data; `Err` holds the reject status.
    pub fn parse(data: &[u8]) -> Result<CmRequest, u16> {
        if data.len() < CM_REQ_LEN {
            return Err(cm_status::INVALID_LEN);
        }
        let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]);
        if u16_at(0) != 0 {
            return Err(cm_status::INVALID_RECFMT);
        }
        let req = CmRequest { qid: u16_at(2), hrqsize: u16_at(4), hsqsize: u16_at(6), cntlid: u16_at(8) };
        if req.qid == u16::MAX {
            return Err(cm_status::INVALID_QID);
        }
        if req.hsqsize == 0 || req.hsqsize as u32 + 1 > MAX_QUEUE_SIZE {
            return Err(cm_status::INVALID_HSQSIZE);
        }
        if req.hrqsize == 0 || req.hrqsize as u32 > MAX_QUEUE_SIZE {
            return Err(cm_status::INVALID_HRQSIZE);
        }
        Ok(req)
    }

    /// Commands the host may have outstanding: our receive queue's depth.
    pub fn depth(&self) -> u32 {
        self.hsqsize as u32 + 1
    }

    pub fn encode(&self) -> [u8; CM_REQ_LEN] {
        let mut b = [0u8; CM_REQ_LEN];
        for (o, v) in [(2, self.qid), (4, self.hrqsize), (6, self.hsqsize), (8, self.cntlid)] {
            b[o..o + 2].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
}

/// The accept's private data: record format 0 and our receive queue size.
pub fn cm_reply(crqsize: u16) -> [u8; CM_REP_LEN] {
    let mut b = [0u8; CM_REP_LEN];
    b[2..4].copy_from_slice(&crqsize.to_le_bytes());
    b
}

/// The reject's private data (`struct nvme_rdma_cm_rej`): record format 0 and the status.
pub fn cm_reject(status: u16) -> [u8; 4] {
    let mut b = [0u8; 4];
    b[2..4].copy_from_slice(&status.to_le_bytes());
    b
}

/// A keyed SGL data block descriptor: host memory at `addr`, `len` bytes, remote key `key`;
/// `invalidate`: the host asks us to invalidate the key with the response (SEND with
/// Invalidate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyedSgl {
    pub addr: u64,
    pub len: u32,
    pub key: u32,
    pub invalidate: bool,
}

/// The keyed SGL of an SQE's DPTR, if SGL1 is one (bytes 24..40: address 8 bytes, length 3,
/// key 4, type 1).
pub fn keyed_sgl(sqe: &Sqe) -> Option<KeyedSgl> {
    let d = &sqe.0[24..40];
    let (kind, subtype) = (d[15] >> 4, d[15] & 0xF);
    if kind != SGL_KEYED_DATA_BLOCK || !matches!(subtype, SGL_SUBTYPE_ADDRESS | SGL_SUBTYPE_INVALIDATE) {
        return None;
    }
    Some(KeyedSgl {
        addr: u64::from_le_bytes(d[0..8].try_into().expect("8 bytes")),
        len: u32::from_le_bytes([d[8], d[9], d[10], 0]),
        key: u32::from_le_bytes(d[11..15].try_into().expect("4 bytes")),
        invalidate: subtype == SGL_SUBTYPE_INVALIDATE,
    })
}

/// The SQE the command layer sees: a keyed SGL becomes a [`TRANSFER_SGL`] descriptor with its
/// length (the key and address stay with the transport); any other SGL is left as it is, and
/// an unsupported one is refused there with SGL Descriptor Type Invalid.
pub fn normalize_sqe(sqe: &Sqe) -> (Sqe, Option<KeyedSgl>) {
    let Some(k) = keyed_sgl(sqe) else { return (*sqe, None) };
    let mut n = *sqe;
    n.set_sgl(SglDescriptor { addr: 0, length: k.len, sgl_type: TRANSFER_SGL });
    (n, Some(k))
}

/// Identify Controller's SGLS (bytes 539:536) bit 2, Keyed SGL Data Block supported: set on
/// RDMA controllers (nvmet's NVMF_KEYED_SGLS transport flag). Linux's host refuses a controller
/// without it. `data` is an Identify Controller reply.
pub fn mark_keyed_sgls(data: &mut [u8]) {
    if let Some(b) = data.get_mut(536) {
        *b |= 1 << 2;
    }
}

/// Whether `sqe` is Identify with CNS 01h (Identify Controller).
pub fn is_identify_controller(sqe: &Sqe) -> bool {
    sqe.opcode() == nvmf_proto::nvme::admin_opcode::IDENTIFY && sqe.cdw(10) & 0xFF == 0x01
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(recfmt: u16, qid: u16, hrqsize: u16, hsqsize: u16) -> Vec<u8> {
        let mut b = CmRequest { qid, hrqsize, hsqsize, cntlid: 0xFFFF }.encode().to_vec();
        b[0..2].copy_from_slice(&recfmt.to_le_bytes());
        b
    }

    #[test]
    fn connect_request_private_data_round_trips_and_is_checked() {
        let r = CmRequest::parse(&req(0, 3, 128, 127)).unwrap();
        assert_eq!(r, CmRequest { qid: 3, hrqsize: 128, hsqsize: 127, cntlid: 0xFFFF });
        assert_eq!(r.depth(), 128);
        assert_eq!(CmRequest::parse(&req(0, 3, 128, 127)[..31]), Err(cm_status::INVALID_LEN));
        assert_eq!(CmRequest::parse(&req(1, 3, 128, 127)), Err(cm_status::INVALID_RECFMT));
        assert_eq!(CmRequest::parse(&req(0, 0xFFFF, 128, 127)), Err(cm_status::INVALID_QID));
        assert_eq!(CmRequest::parse(&req(0, 1, 128, 0)), Err(cm_status::INVALID_HSQSIZE));
        assert_eq!(CmRequest::parse(&req(0, 1, 128, 1024)), Err(cm_status::INVALID_HSQSIZE));
        assert_eq!(CmRequest::parse(&req(0, 1, 0, 31)), Err(cm_status::INVALID_HRQSIZE));
        assert_eq!(CmRequest::parse(&req(0, 1, 1025, 31)), Err(cm_status::INVALID_HRQSIZE));
        assert!(CmRequest::parse(&req(0, 0, 1024, 1023)).is_ok());
    }

    #[test]
    fn accept_and_reject_carry_record_format_zero() {
        let rep = cm_reply(128);
        assert_eq!(&rep[..4], &[0, 0, 128, 0]);
        assert_eq!(cm_reject(cm_status::INVALID_HSQSIZE), [0, 0, 4, 0]);
    }

    fn sqe_with_dptr(d: [u8; 16]) -> Sqe {
        let mut s = Sqe::new(0x02, 7);
        s.0[24..40].copy_from_slice(&d);
        s
    }

    #[test]
    fn keyed_sgl_is_parsed_with_its_24_bit_length_and_key() {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
        d[8..11].copy_from_slice(&[0x00, 0x00, 0x10]); // 1 MiB
        d[11..15].copy_from_slice(&0xAABB_CCDDu32.to_le_bytes());
        d[15] = 0x4F;
        let (n, k) = normalize_sqe(&sqe_with_dptr(d));
        let k = k.unwrap();
        assert_eq!(k, KeyedSgl { addr: 0x1122_3344_5566_7788, len: 1 << 20, key: 0xAABB_CCDD, invalidate: true });
        let sgl = n.sgl();
        assert_eq!((sgl.sgl_type, sgl.length), (TRANSFER_SGL, 1 << 20));
        d[15] = 0x40;
        assert!(!keyed_sgl(&sqe_with_dptr(d)).unwrap().invalidate);
    }

    #[test]
    fn other_sgl_types_are_left_for_the_command_layer() {
        let mut d = [0u8; 16];
        d[15] = 0x01; // in-capsule data block, offset
        let s = sqe_with_dptr(d);
        assert_eq!(normalize_sqe(&s), (s, None));
        d[15] = 0x42; // keyed, unknown subtype
        assert!(keyed_sgl(&sqe_with_dptr(d)).is_none());
    }

    #[test]
    fn discovery_reports_rdma_ports_with_trtype_rdma_and_their_tsas() {
        use crate::config::{PortConfig, SubsystemConfig, TargetSettings};
        let sub = SubsystemConfig::new("nqn.2024-01.io.nvmflab:r");
        let tcp = PortConfig { addr: "127.0.0.1:4420".parse().unwrap(), portid: None, subsystems: None, tls: Default::default() };
        let mut t = crate::core::Target::new(TargetSettings::default(), &[sub], &[tcp]).unwrap();
        t.ports.push(crate::core::Port {
            portid: 2,
            addr: "10.0.0.1:4421".parse().unwrap(),
            subsystems: None,
            tls: Default::default(),
            tls_stats: Default::default(),
            rdma: true,
        });
        let page = crate::discovery::log_page(&t, "nqn.host");
        assert_eq!(u64::from_le_bytes(page[8..16].try_into().unwrap()), 2, "one record per port");
        let (tcp, rdma) = (&page[1024..2048], &page[2048..3072]);
        assert_eq!((tcp[0], tcp[768], tcp[769], tcp[770]), (3, 0, 0, 0), "TCP: trtype 3, no security");
        assert_eq!(rdma[0], 1, "TRTYPE rdma");
        assert_eq!(&rdma[768..771], &[1, 1, 1], "QP connected, provider not specified, RDMA CM");
        assert_eq!(u16::from_le_bytes([rdma[4], rdma[5]]), 2);
        assert!(rdma[512..].starts_with(b"10.0.0.1 ") && rdma[32..].starts_with(b"4421 "));
    }

    #[test]
    fn listen_rdma_and_trtype_rdma_make_rdma_ports_and_a_tcp_only_build_refuses_them() {
        use clap::Parser;
        let args = ["nvmf-target", "--listen", "rdma:10.0.0.1:4420", "--listen", "127.0.0.1:0", "--ns", "ram:1MiB"];
        let c = crate::config::cli::Cli::try_parse_from(args).unwrap().into_config().unwrap();
        assert_eq!(c.rdma_ports.iter().map(|p| p.addr).collect::<Vec<_>>(), vec!["10.0.0.1:4420".parse().unwrap()]);
        assert_eq!(c.ports.len(), 1, "the TCP port stays a TCP port");
        let bad = crate::config::cli::Cli::try_parse_from(["nvmf-target", "--listen", "rdma:10.0.0.1"]).unwrap().into_config();
        assert!(bad.unwrap_err().to_string().contains("--listen"));

        let toml = |trtype: &str| format!("[[port]]\naddr = \"10.0.0.1:4420\"\ntrtype = \"{trtype}\"\n");
        let t = crate::config::toml::parse(&toml("rdma"), std::path::Path::new("r.toml")).unwrap();
        assert_eq!((t.ports.len(), t.rdma_ports.len()), (0, 1));
        let e = crate::config::toml::parse(&toml("ib"), std::path::Path::new("r.toml")).unwrap_err().to_string();
        assert!(e.contains("trtype") && e.contains("\"rdma\""), "{e}");

        #[cfg(not(feature = "rdma"))]
        {
            let e = crate::start(c).err().expect("a TCP-only build refuses RDMA ports");
            assert!(matches!(e, crate::StartError::NoRdma(_)) && e.is_config_error());
            assert!(e.to_string().contains("--features rdma") && e.to_string().contains("librdmacm-dev"), "{e}");
        }
    }

    #[test]
    fn identify_controller_gets_keyed_sgl_support() {
        let mut id = vec![0u8; 4096];
        id[536] = 0x01;
        mark_keyed_sgls(&mut id);
        assert_eq!(id[536], 0x05);
        let mut s = Sqe::new(nvmf_proto::nvme::admin_opcode::IDENTIFY, 1);
        s.set_cdw(10, 1);
        assert!(is_identify_controller(&s));
        s.set_cdw(10, 0);
        assert!(!is_identify_controller(&s));
        mark_keyed_sgls(&mut [0u8; 8]); // short data: nothing to mark, no panic
    }
}
