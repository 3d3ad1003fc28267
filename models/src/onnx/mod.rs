//! The ONNX IR: decode, encode (lossless), inspect, validate.
