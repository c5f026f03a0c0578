//! The client API's requests (`ringraft_client::proto`, prost), what any
//! client sends the daemon's gRPC service: `input[0]` picks the request
//! message, the rest is its protobuf encoding.
//!
//! Must hold: no panic; a request that decodes encodes (to its
//! `encoded_len`) to bytes that decode to an equal request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use ringraft_client::proto::{
    AddLearnerRequest, AppendRequest, FollowRequest, MembersRequest, PromoteRequest, ReadRequest,
    RemoveRequest, StatusRequest, TransferLeaderRequest, TrimRequest,
};

fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(bytes: &[u8]) {
    let Ok(message) = M::decode(bytes) else {
        return;
    };
    let canonical = message.encode_to_vec();
    assert_eq!(canonical.len(), message.encoded_len());
    let again = M::decode(canonical.as_slice()).expect("canonical bytes decode");
    assert_eq!(again, message);
}

fuzz_target!(|input: &[u8]| {
    let Some((kind, bytes)) = input.split_first() else {
        return;
    };
    match kind % 10 {
        0 => round_trip::<AppendRequest>(bytes),
        1 => round_trip::<ReadRequest>(bytes),
        2 => round_trip::<FollowRequest>(bytes),
        3 => round_trip::<StatusRequest>(bytes),
        4 => round_trip::<MembersRequest>(bytes),
        5 => round_trip::<AddLearnerRequest>(bytes),
        6 => round_trip::<PromoteRequest>(bytes),
        7 => round_trip::<RemoveRequest>(bytes),
        8 => round_trip::<TransferLeaderRequest>(bytes),
        _ => round_trip::<TrimRequest>(bytes),
    }
});
