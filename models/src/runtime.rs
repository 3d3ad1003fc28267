//! ONNX Runtime, loaded at run time from a path (never downloaded at build time).
