//! The `rdma` backend: real reliable-connected queue pairs through
//! libibverbs (rdma-sys 0.3 raw bindings), on RNICs and Soft-RoCE (rxe).
//!
//! Layers, bottom up:
//! - a safe RAII layer over the verbs objects, one object per module:
//!   `context` (device list, opened device, port and GID queries),
//!   `pd` (protection domain), `mr` (memory registration and typed
//!   access flags), `cq` (completion channel and completion queue),
//!   `qp` (queue pair). Each releases its object on drop and holds an
//!   `Arc` of its parent, so a parent can never be freed under a child.
//!   Every `unsafe` block says why it is sound; posting is `unsafe` with its
//!   memory contract spelled out.
//! - plain logic tested on any host: `staging` (the staging ring),
//!   `endpoint` (the bootstrap wire format), the status and timer
//!   encodings.
//! - the backend: `device` ([`RdmaDevice`], [`RdmaRegion`]), `conn`
//!   ([`RdmaConnection`]: posting, the completion driver, receives, the
//!   error state) and `bootstrap` ([`RdmaListener`], connection setup over
//!   an authenticated TCP handshake).
//!
//! Soft-RoCE notes: `retry_count` and `rnr_retry` are capped at 6 (rxe
//! retries forever at 7), and our own deadline (`ConnConfig::op_deadline`)
//! sits above the verbs' timeouts; the GID used is the IPv4-mapped one
//! (index 1 on rxe), found with `ibv_query_gid`, never by reading the sysfs
//! GID table; rxe reports `IBV_ATOMIC_HCA`, and returns the original value
//! of an atomic in host byte order.
//!
//! This module never panics on anything the network or the device reports,
//! never reuses a queue pair in error, and never frees memory the device
//! may still use.

mod bootstrap;
mod buffer;
mod conn;
mod context;
mod cq;
mod device;
mod endpoint;
mod mr;
mod pd;
mod qp;
mod staging;

pub use bootstrap::RdmaListener;
pub use conn::RdmaConnection;
pub use device::{RdmaDevice, RdmaRegion};
