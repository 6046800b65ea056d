//! Property tests: hostile bytes never panic the decoders, and what we encode we decode.

use nvmf_proto::discovery::DiscoveryLogPage;
use nvmf_proto::identify::{decode_ns_descriptors, IdentifyController, IdentifyNamespace};
use nvmf_proto::pdu::{encode_pdu, C2HData, H2CData, R2T};
use nvmf_proto::{Digests, Framer, PduHeader, Role};
use proptest::prelude::*;

fn any_digests() -> impl Strategy<Value = Digests> {
    (any::<bool>(), any::<bool>()).prop_map(|(header, data)| Digests { header, data })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn framer_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), dg in any_digests(), host in any::<bool>()) {
        let role = if host { Role::Host } else { Role::Target };
        let framer = Framer { role, digests: dg, max_data_len: 256 };
        if let Ok(Some(frame)) = framer.next(&bytes) {
            prop_assert!(frame.len <= bytes.len());
            prop_assert!(frame.data.end <= frame.len);
        }
    }

    #[test]
    fn framer_survives_mutated_valid_pdus(pos in 0usize..60, val in any::<u8>(), dg in any_digests()) {
        let mut bytes = Vec::new();
        let h2c = H2CData { cccid: 1, ttag: 2, datao: 0, datal: 32, last: true };
        encode_pdu(&mut bytes, &PduHeader::H2CData(h2c), &[9u8; 32], dg);
        let pos = pos % bytes.len();
        bytes[pos] = val;
        let framer = Framer { role: Role::Target, digests: dg, max_data_len: 4096 };
        let _ = framer.next(&bytes);
    }

    #[test]
    fn data_pdus_round_trip(cccid in any::<u16>(), datao in 0u32..1 << 20, len in 1usize..2048, dg in any_digests(), last in any::<bool>(), success in any::<bool>()) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        let hdr = PduHeader::C2HData(C2HData { cccid, datao, datal: len as u32, last, success });
        let mut bytes = Vec::new();
        encode_pdu(&mut bytes, &hdr, &data, dg);
        let framer = Framer { role: Role::Host, digests: dg, max_data_len: 4096 };
        let frame = framer.next(&bytes).unwrap().unwrap();
        prop_assert_eq!(&frame.header, &hdr);
        prop_assert_eq!(&bytes[frame.data.clone()], &data[..]);
        prop_assert!(frame.data_digest_ok);

        let r2t = PduHeader::R2T(R2T { cccid, ttag: cccid ^ 1, r2to: datao, r2tl: len as u32 });
        bytes.clear();
        encode_pdu(&mut bytes, &r2t, &[], dg);
        prop_assert_eq!(framer.next(&bytes).unwrap().unwrap().header, r2t);
    }

    #[test]
    fn structure_decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
        let _ = IdentifyController::decode(&bytes);
        let _ = IdentifyNamespace::decode(&bytes);
        let _ = decode_ns_descriptors(&bytes);
        let _ = DiscoveryLogPage::decode(&bytes);
    }
}
