//! Generates the server side of the client API (the `Log` service trait
//! and `LogServer`) from `../client/proto/ringraft/v1/log.proto`, the file
//! `ringraft-client` builds its messages and client from. The messages are
//! not generated again: they map to `ringraft_client::proto`, so the daemon
//! and its clients share one set of types.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the
    // environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=../client/proto/ringraft/v1/log.proto");
    tonic_prost_build::configure()
        .build_client(false)
        .extern_path(".ringraft.v1", "::ringraft_client::proto")
        .compile_protos(
            &["../client/proto/ringraft/v1/log.proto"],
            &["../client/proto"],
        )?;
    Ok(())
}
