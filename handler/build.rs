//! Compiles `proto/deviceplugin.proto` with protox (pure Rust; no system `protoc`) and
//! generates prost messages plus tonic client and server code into OUT_DIR.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/deviceplugin.proto");
    let fds = protox::compile(["deviceplugin.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
