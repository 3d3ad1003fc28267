//! Generates the ONNX IR types with rust-protobuf's pure-Rust parser (no
//! `protoc`). rust-protobuf rather than prost because it keeps unknown fields
//! on every message, which a lossless ONNX round trip needs.

fn main() {
    println!("cargo:rerun-if-changed=proto/onnx_ir.proto");
    protobuf_codegen::Codegen::new()
        .pure()
        .includes(["proto"])
        .input("proto/onnx_ir.proto")
        .cargo_out_dir("onnx_ir")
        .run_from_script();
}
