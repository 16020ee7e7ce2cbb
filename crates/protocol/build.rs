//! Generates the service-protocol types from `proto/protocol.proto` with protox (a pure-Rust
//! protobuf compiler), so building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/protocol.proto");
    let descriptors = protox::compile(["protocol.proto"], ["proto"])?;
    prost_build::Config::new()
        .bytes(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
