//! The PDU framer and the structure decoders of nvmf-proto on arbitrary bytes.
//!
//! Input: one byte choosing the receiver (role, negotiated digests, data limit), then the
//! stream. The stream is framed PDU after PDU as a connection would; every accepted frame must
//! lie inside the buffer, respect the data limit, be "incomplete" (not an error) for every
//! shorter prefix, and survive encode → decode unchanged. The same bytes then go through every
//! decoder that reads host- or target-supplied structures.

use crate::script::Script;
use nvmf_proto::discovery::DiscoveryLogPage;
use nvmf_proto::fabrics::{ConnectCmd, ConnectData, PropertyGet, PropertySet};
use nvmf_proto::identify::{decode_ns_descriptors, decode_ns_list, IdentifyController, IdentifyNamespace};
use nvmf_proto::nvme::{Cqe, Sqe, Status, CQE_LEN};
use nvmf_proto::pdu::{encode_pdu, COMMON_HEADER_LEN, TERM_REQ_MAX_HEADER};
use nvmf_proto::{Digests, Frame, Framer, Role};

const DATA_LIMITS: [u32; 4] = [0, 512, 4096, 65536];

pub fn run(input: &[u8]) {
    let mut s = Script::new(input);
    let sel = s.u8();
    let framer = Framer {
        role: if sel & 1 == 0 { Role::Target } else { Role::Host },
        digests: Digests { header: sel & 2 != 0, data: sel & 4 != 0 },
        max_data_len: DATA_LIMITS[(sel >> 3) as usize & 3],
    };
    let stream = s.rest();
    frame_stream(&framer, stream);
    decode_structures(stream);
}

fn frame_stream(framer: &Framer, stream: &[u8]) {
    let mut pos = 0;
    loop {
        let buf = &stream[pos..];
        match framer.next(buf) {
            Ok(None) => return,
            Err(e) => {
                assert!(e.hlen <= TERM_REQ_MAX_HEADER, "TermReq would echo {} header bytes", e.hlen);
                return;
            }
            Ok(Some(f)) => {
                check_frame(framer, buf, &f);
                pos += f.len;
            }
        }
    }
}

fn check_frame(framer: &Framer, buf: &[u8], f: &Frame) {
    assert!(f.len >= COMMON_HEADER_LEN && f.len <= buf.len(), "frame length {} outside 8..={}", f.len, buf.len());
    assert!(f.data.start <= f.data.end && f.data.end <= f.len, "data {:?} outside the {}-byte PDU", f.data, f.len);
    assert!(f.data.len() <= framer.max_data_len as usize, "data beyond the negotiated limit");
    // A receiver that has only part of this PDU must wait, not fail: errors come from the header.
    for cut in [COMMON_HEADER_LEN, f.len / 2, f.len - 1] {
        if cut < f.len {
            assert_eq!(framer.next(&buf[..cut]), Ok(None), "prefix of {cut} bytes of a valid {}-byte PDU", f.len);
        }
    }
    // What was decoded encodes to a PDU that decodes to the same header and data.
    let data = &buf[f.data.clone()];
    let mut again = Vec::new();
    encode_pdu(&mut again, &f.header, data, framer.digests);
    let g = match framer.next(&again) {
        Ok(Some(g)) => g,
        other => panic!("re-encoded {:?} does not frame: {other:?}", f.header),
    };
    assert_eq!(g.header, f.header, "header changed through encode/decode");
    assert_eq!(&again[g.data.clone()], data, "data changed through encode/decode");
    assert!(g.data_digest_ok && g.len == again.len());
}

/// Decoders for structures a peer sends: none may panic on any length or content.
fn decode_structures(b: &[u8]) {
    let _ = ConnectData::decode(b);
    let _ = IdentifyController::decode(b);
    let _ = IdentifyNamespace::decode(b);
    let _ = decode_ns_descriptors(b);
    let _ = decode_ns_list(b);
    let _ = DiscoveryLogPage::decode(b);
    let _ = DiscoveryLogPage::numrec(b);
    if let Some(sqe) = Sqe::from_bytes(b) {
        let _ = (ConnectCmd::from_sqe(&sqe), PropertyGet::from_sqe(&sqe), PropertySet::from_sqe(&sqe), sqe.sgl());
    }
    if let Some(c) = b.get(..CQE_LEN) {
        let _ = Cqe::decode(c.try_into().expect("16 bytes"));
    }
    if let Some(v) = b.get(..2) {
        let _ = Status::from_u16(u16::from_le_bytes([v[0], v[1]]));
    }
}
