//! Generates the gRPC code. Uses `$PROTOC` when set, else the protoc vendored as a crate, so a
//! fresh machine needs no system protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut config = prost_build::Config::new();
    match std::env::var_os("PROTOC") {
        Some(protoc) => config.protoc_executable(protoc),
        None => config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?),
    };
    // JSON bytes (payload parts, results, manifests) are shared, not copied: a part goes to
    // every worker that needs it, and a received part is a slice of the frame it came in.
    config.bytes([".baton.v1.Json.json"]);
    let descriptor =
        std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("baton_descriptor.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(&descriptor)
        .compile_with_config(config, &["baton/v1/baton.proto"], &["."])?;
    println!("cargo:rerun-if-changed=baton/v1/baton.proto");
    println!("cargo:rerun-if-env-changed=PROTOC");
    Ok(())
}
