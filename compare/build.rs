//! Generates the etcd client code from
//! `proto/third_party/etcdserverpb/rpc.proto` (a trimmed copy of etcd 3.4's
//! API: third-party, see `proto/third_party/README.md`) with a vendored
//! protoc, the way `cli/build.rs` does for ringraft's own API.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the
    // environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto/third_party/etcdserverpb/rpc.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(
            &["proto/third_party/etcdserverpb/rpc.proto"],
            &["proto/third_party"],
        )?;
    Ok(())
}
