//! # ringraft_client
//!
//! The Rust client of ringraft's client API (gRPC, `proto/ringraft/v1/log.proto`,
//! version 1), used by the `ringraft` command-line client and by tests.
//! Plaintext by default; over TLS with [`Client::with_tls`] and a
//! [`ClientTls`] (the nodes' CA, and a client certificate for nodes that
//! require one).
//!
//! ```no_run
//! # async fn demo() -> Result<(), ringraft_client::ClientError> {
//! use std::time::Duration;
//! use ringraft_client::Client;
//! let mut client = Client::new(vec!["127.0.0.1:7001".into(), "127.0.0.1:7002".into()], Duration::from_secs(2));
//! let indexes = client.append(vec![b"hello".to_vec()]).await?;
//! let records = client.read(indexes[0], indexes[0], ringraft_client::Consistency::Linearizable).await?;
//! # Ok(()) }
//! ```

pub mod client;
pub mod tls;

/// The generated protobuf and gRPC code.
pub mod proto {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("ringraft.v1");
}

pub use client::{Client, ClientError};
pub use proto::Consistency;
pub use tls::ClientTls;

/// The API version this crate speaks (request metadata `ringraft-api`).
pub const API_VERSION: &str = "1";

/// `message` as a request of this API version (metadata `ringraft-api`:
/// [`API_VERSION`]), for the [`Client`] and for callers that drive the
/// generated [`proto`] clients themselves.
pub fn api_request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "ringraft-api",
        tonic::metadata::MetadataValue::from_static(API_VERSION),
    );
    request
}
