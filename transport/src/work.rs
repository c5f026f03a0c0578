//! The backend-neutral work requests and their results: what
//! [`crate::Connection`]'s `post_*` methods hand to a backend, and what a
//! backend's completion resolves with.
//!
//! The software backends also put them on the wire (bincode, inside the
//! frames of [`crate::soft`]); the rdma backend turns them into verbs work
//! requests. Owns only these two types. Never: check limits (that is
//! [`crate::limits`]), execute anything, or know a backend.

use serde::{Deserialize, Serialize};

/// A one-sided or two-sided request as it crosses the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Request {
    Write {
        addr: u64,
        rkey: u32,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        imm: Option<u32>,
    },
    Read {
        addr: u64,
        rkey: u32,
        len: u32,
    },
    CompareSwap {
        addr: u64,
        rkey: u32,
        expected: u64,
        new: u64,
    },
    FetchAdd {
        addr: u64,
        rkey: u32,
        add: u64,
    },
    Send {
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
}

/// What a completed request returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Done {
    Ok,
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    Word(u64),
}
