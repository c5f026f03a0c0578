//! Errors, named as verbs names them.
//!
//! A work request completes with a [`WcError`] exactly where verbs would
//! report a work completion status other than success; everything else
//! (handshake, registration, limits, configuration) is a [`TransportError`].

use serde::{Deserialize, Serialize};

/// Why a work request failed (verbs' `ibv_wc_status`, the ones that matter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
pub enum WcError {
    /// The peer refused the access: unknown or revoked rkey, out of the
    /// registration's bounds, or a permission the registration lacks
    /// (`IBV_WC_REM_ACCESS_ERR`).
    #[error("remote access error (bad or revoked rkey, out of bounds, or missing permission)")]
    RemoteAccess,
    /// The peer's queue pair does not allow the operation (its access flags
    /// were changed, e.g. REMOTE_WRITE dropped), or the request is malformed
    /// (misaligned atomic) (`IBV_WC_REM_INV_REQ_ERR`).
    #[error(
        "remote invalid request (operation not allowed on the peer's queue pair, or malformed)"
    )]
    RemoteInvalidRequest,
    /// The peer had no receive posted, after every receiver-not-ready retry
    /// (`IBV_WC_RNR_RETRY_EXC_ERR`).
    #[error("receiver not ready: no receive posted at the peer after all retries")]
    RnrRetryExceeded,
    /// No answer from the peer after every transport retry
    /// (`IBV_WC_RETRY_EXC_ERR`): partition, dead or paused peer.
    #[error("transport retries exceeded: no answer from the peer")]
    RetryExceeded,
    /// The connection went to the error state before this request
    /// completed (`IBV_WC_WR_FLUSH_ERR`).
    #[error("flushed: the connection is in the error state")]
    Flushed,
    /// The local side refused the request (`IBV_WC_LOC_*`): a local buffer
    /// or key problem.
    #[error("local protection or length error")]
    LocalError,
    /// Any other completion status (its numeric code).
    #[error("work completion failed with status {0}")]
    Other(u32),
}

impl WcError {
    /// True for the errors a revoked or missing permission produces
    /// (revoked rkey, or REMOTE_WRITE dropped from the queue pair).
    pub fn is_access_denied(&self) -> bool {
        matches!(self, WcError::RemoteAccess | WcError::RemoteInvalidRequest)
    }
}

/// Errors outside work completions.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A work request failed.
    #[error("{op} on connection to {peer}: {error}")]
    Completion {
        /// What was posted.
        op: &'static str,
        /// The peer.
        peer: String,
        /// How it failed.
        error: WcError,
    },
    /// The connection is in the error state: destroy it and reconnect.
    #[error("connection to {peer} is in the error state ({cause}); reconnect")]
    Broken {
        /// The peer.
        peer: String,
        /// What put it there.
        cause: String,
    },
    /// A limit was reached (outstanding requests, message size,
    /// registrations, connections).
    #[error("limit reached: {what} ({limit})")]
    Limit {
        /// Which limit.
        what: &'static str,
        /// Its value.
        limit: u64,
    },
    /// The peer could not prove the cluster secret, or we could not.
    #[error("authentication with {peer} failed: {reason}")]
    Auth {
        /// The peer address.
        peer: String,
        /// What went wrong.
        reason: String,
    },
    /// The peer speaks something else, or sent malformed bytes.
    #[error("protocol error with {peer}: {reason}")]
    Protocol {
        /// The peer address.
        peer: String,
        /// What went wrong.
        reason: String,
    },
    /// A socket or device operation failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The device cannot be used.
    #[error("device: {0}")]
    Device(String),
    /// A configuration value is out of bounds.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A local argument is wrong (a range outside a local buffer, say).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The operation timed out locally.
    #[error("{what} timed out after {after_ms} ms")]
    Timeout {
        /// What timed out.
        what: String,
        /// After how long.
        after_ms: u64,
    },
}

impl TransportError {
    /// The work completion error, if this is one.
    pub fn wc(&self) -> Option<WcError> {
        match self {
            TransportError::Completion { error, .. } => Some(*error),
            TransportError::Broken { .. } => Some(WcError::Flushed),
            _ => None,
        }
    }

    pub(crate) fn io(op: impl Into<String>) -> impl FnOnce(std::io::Error) -> TransportError {
        let op = op.into();
        move |source| TransportError::Io { op, source }
    }
}

/// Result of transport operations.
pub type Result<T, E = TransportError> = std::result::Result<T, E>;
