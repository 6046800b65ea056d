//! NVMe over RDMA (the NVMe over Fabrics RDMA transport binding; Linux's `nvme-rdma.h`).
//!
//! This file holds what the target adds to the binding's encodings (`nvmf_proto::rdma`: CM
//! private data, keyed SGLs, shared with the host), which need no RDMA library and are tested
//! everywhere. The queue's protocol is a sans-I/O machine (`rdma/machine.rs`), also built and
//! tested everywhere; its driver and the port's CM listener (`rdma/queue.rs`, `rdma/listener.rs`)
//! are built with the `rdma` cargo feature, on rdma-core through the `nvmf-rdma` crate.
//!
//! Per command: the host SENDs a capsule (SQE plus in-capsule data up to IOCCSZ) into a receive
//! buffer we posted; read data goes to the host by RDMA WRITE, write data comes by RDMA READ of
//! the host's keyed SGL, and the 16-byte completion goes by SEND, posted after the WRITE on the
//! same queue pair so that the host sees the data before the completion.

use nvmf_proto::nvme::SglDescriptor;
use nvmf_proto::Sqe;

#[cfg(feature = "rdma")]
mod listener;
pub mod machine;
#[cfg(feature = "rdma")]
mod queue;
#[cfg(feature = "rdma")]
pub use listener::RdmaListener;
#[cfg(feature = "rdma")]
pub use queue::RdmaQueue;

pub use nvmf_proto::rdma::{cm_reject, cm_reply, cm_status, keyed_sgl, CmRequest, KeyedSgl, CM_REP_LEN, CM_REQ_LEN, MAX_QUEUE_SIZE};
/// The SGL type the command layer is told this transport moves itself: a keyed data block.
/// The command layer compares types only, so the keyed descriptor's 24-bit length is handed
/// over in a normalized SQE (see [`normalize_sqe`]).
pub use crate::capabilities::RDMA_TRANSFER_SGL as TRANSFER_SGL;

/// The SQE the command layer sees: a keyed SGL becomes a [`TRANSFER_SGL`] descriptor with its
/// length (the key and address stay with the transport); any other SGL is left as it is, and
/// an unsupported one is refused there with SGL Descriptor Type Invalid.
pub fn normalize_sqe(sqe: &Sqe) -> (Sqe, Option<KeyedSgl>) {
    let Some(k) = keyed_sgl(sqe) else { return (*sqe, None) };
    let mut n = *sqe;
    n.set_sgl(SglDescriptor { addr: 0, length: k.len, sgl_type: TRANSFER_SGL });
    (n, Some(k))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            transport: crate::transport::TransportKind::Rdma,
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
}
