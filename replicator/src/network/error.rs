//! How openraft is told that an exchange with a peer failed.

use openraft::error::{NetworkError, RPCError, StreamingError, Unreachable};

pub use crate::replication::ReplicationError;
use crate::types::TypeConfig;

pub(super) fn rpc_error(f: ReplicationError) -> RPCError<TypeConfig> {
    if f.is_unreachable() {
        RPCError::Unreachable(Unreachable::new(&f))
    } else {
        RPCError::Network(NetworkError::new(&f))
    }
}

pub(super) fn streaming_error(f: ReplicationError) -> StreamingError<TypeConfig> {
    StreamingError::Unreachable(Unreachable::new(&f))
}
