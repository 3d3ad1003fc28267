//! Compiles the gRPC packages with protox (pure Rust), so the build needs no
//! system `protoc` and downloads nothing.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/edgeloop/common/v1/common.proto",
        "proto/edgeloop/agent/v1/agent.proto",
        "proto/edgeloop/bridge/v1/bridge.proto",
        "proto/inference/grpc_service.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Small first buffers per call: see src/codec.rs.
        .codec_path("crate::codec::LeanCodec")
        // Tensor bytes as `Bytes`: decoding slices them out of the
        // received buffer instead of copying each into a Vec.
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        // A model download's chunks as `Bytes`: the control plane slices
        // them out of its cached artifact instead of copying each one.
        .bytes(".edgeloop.agent.v1.ArtifactChunk.data")
        .compile_fds(fds)?;
    Ok(())
}
