//! Property tests of the client API's requests as the daemon decodes them
//! (prost, `ringraft_client::proto`), on stable (`fuzz/`'s
//! `client_requests` target runs the same under libFuzzer): arbitrary
//! bytes and mutated valid encodings never panic, and what decodes encodes
//! to bytes that decode to an equal request; valid requests round-trip.

use proptest::prelude::*;
use prost::Message;
use ringraft_client::proto::{
    AddLearnerRequest, AppendRequest, FollowRequest, MembersRequest, PromoteRequest, ReadRequest,
    RemoveRequest, StatusRequest, TransferLeaderRequest, TrimRequest,
};

/// Decodes `bytes` as an `M`; if it decodes, checks that it encodes (to
/// its `encoded_len`) to bytes that decode to an equal message.
fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(
    bytes: &[u8],
) -> Result<Option<M>, TestCaseError> {
    let Ok(message) = M::decode(bytes) else {
        return Ok(None);
    };
    let canonical = message.encode_to_vec();
    prop_assert_eq!(canonical.len(), message.encoded_len());
    prop_assert_eq!(&M::decode(canonical.as_slice()).unwrap(), &message);
    Ok(Some(message))
}

/// Every request type over `bytes`.
fn all_requests(bytes: &[u8]) -> Result<(), TestCaseError> {
    round_trip::<AppendRequest>(bytes)?;
    round_trip::<ReadRequest>(bytes)?;
    round_trip::<FollowRequest>(bytes)?;
    round_trip::<StatusRequest>(bytes)?;
    round_trip::<MembersRequest>(bytes)?;
    round_trip::<AddLearnerRequest>(bytes)?;
    round_trip::<PromoteRequest>(bytes)?;
    round_trip::<RemoveRequest>(bytes)?;
    round_trip::<TransferLeaderRequest>(bytes)?;
    round_trip::<TrimRequest>(bytes)?;
    Ok(())
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_a_request_decoder(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        all_requests(&bytes)?;
    }

    #[test]
    fn valid_requests_round_trip_and_mutations_never_panic(
        client_id in any::<u64>(),
        first_seq in any::<u64>(),
        records in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..32), 0..6),
        from in any::<u64>(),
        to in any::<u64>(),
        consistency in any::<i32>(),
        addr in ".{0,40}",
        ids in proptest::collection::vec(any::<u64>(), 0..6),
        (at, flip, keep) in (any::<usize>(), 1u8.., any::<usize>()),
    ) {
        let append = AppendRequest { client_id, first_seq, records };
        let read = ReadRequest { from, to, consistency };
        let learner = AddLearnerRequest { id: from, addr };
        let promote = PromoteRequest { ids };
        let trim = TrimRequest { before: to };
        let encodings = [
            append.encode_to_vec(),
            read.encode_to_vec(),
            learner.encode_to_vec(),
            promote.encode_to_vec(),
            trim.encode_to_vec(),
        ];
        prop_assert_eq!(round_trip::<AppendRequest>(&encodings[0])?, Some(append));
        prop_assert_eq!(round_trip::<ReadRequest>(&encodings[1])?, Some(read));
        prop_assert_eq!(round_trip::<AddLearnerRequest>(&encodings[2])?, Some(learner));
        prop_assert_eq!(round_trip::<PromoteRequest>(&encodings[3])?, Some(promote));
        prop_assert_eq!(round_trip::<TrimRequest>(&encodings[4])?, Some(trim));
        for bytes in &encodings {
            let mut mutated = bytes.clone();
            if !mutated.is_empty() {
                let at = at % mutated.len();
                mutated[at] ^= flip;
            }
            mutated.truncate(keep % (bytes.len() + 1));
            all_requests(&mutated)?;
        }
    }
}
