//! Generates the etcd client code from `proto/etcdserverpb/rpc.proto` (a
//! hand-written subset of etcd 3.4's API) with a vendored protoc, the way
//! `cli/build.rs` does for ringraft's own API.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the
    // environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto/etcdserverpb/rpc.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&["proto/etcdserverpb/rpc.proto"], &["proto"])?;
    Ok(())
}
