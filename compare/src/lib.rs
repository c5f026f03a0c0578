//! # ringraft_compare
//!
//! The load generator behind `scripts/compare.sh`, which runs ringraft and
//! etcd 3.4 side by side on one machine (3 members each on loopback, in
//! turn, over several rounds) under the same closed-loop workload, measures
//! the physical floor in the same run, and prints one table with
//! ringraft ÷ etcd ratios (issue 11, item 7).
//!
//! - [`load`]: the workload against a running cluster of either system;
//! - [`floor`]: one 4 KiB pwrite+fdatasync and one loopback round trip;
//! - [`report`]: the results file and the table (pure);
//! - [`args`]: the command line and its bounds (pure).
//!
//! It never starts or stops a cluster (the script does) and writes nothing
//! but its results file, its markdown and the floor's scratch files (which
//! it removes).

pub mod args;
pub mod floor;
pub mod load;
pub mod report;

/// The subset of etcd 3.4's gRPC API used here
/// (`proto/third_party/etcdserverpb/rpc.proto`, trimmed from etcd's own).
pub mod etcd_proto {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("etcdserverpb");
}
