//! Generates the client API's Rust code (messages and the gRPC client, no
//! server) from `proto/ringraft/v1/log.proto` with a vendored protoc, so that
//! a fresh machine needs no protobuf compiler installed. The daemon
//! (`ringraft-cli`) generates the server side from the same file.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the
    // environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto/ringraft/v1/log.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&["proto/ringraft/v1/log.proto"], &["proto"])?;
    Ok(())
}
