//! What a transport tells the command layer and the discovery log about itself: its kind and
//! [`Capabilities`]. A leaf module, so that the command layer (`command`, `admin`, `discovery`)
//! and the target's core name transports without importing `transport`, which imports them.

use crate::config::TargetSettings;
use nvmf_proto::discovery::{ADRFAM_IPV4, ADRFAM_IPV6, TRTYPE_TCP};
use nvmf_proto::nvme::SGL_TRANSPORT_DATA_BLOCK;
use nvmf_proto::rdma::SGL_KEYED_DATA_BLOCK;
use std::net::SocketAddr;

/// The SGL type RDMA moves itself: a keyed data block (type << 4, subtype 0).
pub const RDMA_TRANSFER_SGL: u8 = SGL_KEYED_DATA_BLOCK << 4;

/// Which transport serves a port (and every queue accepted on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    Tcp,
    Rdma,
    /// In-process queues (`transport/loopback.rs`, nvmet's loop.c): tests of the command layer.
    Loop,
}

/// Discovery TRTYPE of RDMA (NVMe over Fabrics, "Transport Type").
const TRTYPE_RDMA: u8 = 1;
/// RDMA's TSAS as nvmet reports it: QP type reliable connected, no provider type, RDMA CM.
const RDMA_TSAS: [u8; 3] = [1, 1, 1];
/// Discovery TRTYPE of the loop transport (nvmet's NVMF_TRTYPE_LOOP).
pub const TRTYPE_LOOP: u8 = 254;
/// Identify Controller SGLS bit 2: Keyed SGL Data Block descriptors supported.
pub const SGLS_KEYED_DATA_BLOCK: u32 = 1 << 2;

/// What a transport tells the command layer and the discovery log about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub kind: TransportKind,
    /// Discovery log TRTYPE.
    pub trtype: u8,
    /// SGL descriptor type (type << 4 | subtype) of data the transport moves itself: NVMe/TCP's
    /// transport data block (R2T/H2CData, C2HData); RDMA's keyed data block (READ/WRITE).
    pub transfer_sgl: u8,
    /// The host may name its memory by keyed SGLs (Identify Controller SGLS bit 2). Linux's
    /// RDMA host refuses a controller without it.
    pub keyed_sgls: bool,
    /// In-capsule data an I/O queue's capsule may carry (IOCCSZ's share).
    pub in_capsule_data_size: u32,
    /// The port's TLS setting is reported (TREQ secure channel, TSAS SECTYPE): TCP only.
    pub secure_channel: bool,
    /// TSAS bytes 0..3 discovery reports when there is no secure channel to report.
    pub tsas: [u8; 3],
}

impl TransportKind {
    /// The transport's name in /stats and logs.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Rdma => "rdma",
            TransportKind::Loop => "loop",
        }
    }

    /// The transport's capabilities under `settings` (the ops table's one entry per transport).
    pub fn capabilities(self, settings: &TargetSettings) -> Capabilities {
        let in_capsule_data_size = settings.in_capsule_data_size;
        match self {
            TransportKind::Tcp => Capabilities {
                kind: self,
                trtype: TRTYPE_TCP,
                transfer_sgl: SGL_TRANSPORT_DATA_BLOCK,
                keyed_sgls: false,
                in_capsule_data_size,
                secure_channel: true,
                tsas: [0; 3],
            },
            TransportKind::Rdma => Capabilities {
                kind: self,
                trtype: TRTYPE_RDMA,
                transfer_sgl: RDMA_TRANSFER_SGL,
                keyed_sgls: true,
                in_capsule_data_size,
                secure_channel: false,
                tsas: RDMA_TSAS,
            },
            TransportKind::Loop => Capabilities {
                kind: self,
                trtype: TRTYPE_LOOP,
                transfer_sgl: SGL_TRANSPORT_DATA_BLOCK,
                keyed_sgls: false,
                in_capsule_data_size,
                secure_channel: false,
                tsas: [0; 3],
            },
        }
    }
}

impl Capabilities {
    /// Discovery ADRFAM of a port at `addr`: both transports are addressed by IP (RDMA through
    /// the RDMA CM).
    pub fn adrfam(&self, addr: &SocketAddr) -> u8 {
        if addr.is_ipv4() {
            ADRFAM_IPV4
        } else {
            ADRFAM_IPV6
        }
    }
}
