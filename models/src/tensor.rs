//! Dense tensors as they cross the boundaries of this crate: read from
//! `.npz` files, fed to and read from ONNX Runtime, stored in ONNX
//! initializers. One enum, one variant per element type we support.

use ndarray::ArrayD;

/// An element type, with its ONNX `TensorProto.DataType` code and NumPy name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    F16,
    I8,
    U8,
    I32,
    I64,
    Bool,
}

impl DType {
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::Bool,
    ];

    /// The `TensorProto.DataType` code.
    pub fn onnx_code(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
        }
    }

    pub fn from_onnx_code(code: i32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.onnx_code() == code)
    }

    /// NumPy's name for it (`float32`, `int64`, ...).
    pub fn numpy_name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::F16 => "float16",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::Bool => "bool",
        }
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.numpy_name())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Tensor {
    F32(ArrayD<f32>),
    F64(ArrayD<f64>),
    F16(ArrayD<half::f16>),
    I8(ArrayD<i8>),
    U8(ArrayD<u8>),
    I32(ArrayD<i32>),
    I64(ArrayD<i64>),
    Bool(ArrayD<bool>),
}

/// Applies `$body` to the array inside any variant.
#[macro_export]
macro_rules! with_array {
    ($tensor:expr, $a:ident => $body:expr) => {
        match $tensor {
            $crate::tensor::Tensor::F32($a) => $body,
            $crate::tensor::Tensor::F64($a) => $body,
            $crate::tensor::Tensor::F16($a) => $body,
            $crate::tensor::Tensor::I8($a) => $body,
            $crate::tensor::Tensor::U8($a) => $body,
            $crate::tensor::Tensor::I32($a) => $body,
            $crate::tensor::Tensor::I64($a) => $body,
            $crate::tensor::Tensor::Bool($a) => $body,
        }
    };
}

impl Tensor {
    pub fn dtype(&self) -> DType {
        match self {
            Tensor::F32(_) => DType::F32,
            Tensor::F64(_) => DType::F64,
            Tensor::F16(_) => DType::F16,
            Tensor::I8(_) => DType::I8,
            Tensor::U8(_) => DType::U8,
            Tensor::I32(_) => DType::I32,
            Tensor::I64(_) => DType::I64,
            Tensor::Bool(_) => DType::Bool,
        }
    }

    pub fn shape(&self) -> &[usize] {
        with_array!(self, a => a.shape())
    }

    pub fn len(&self) -> usize {
        with_array!(self, a => a.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn onnx_codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_onnx_code(d.onnx_code()), Some(d));
        }
        assert_eq!(DType::from_onnx_code(0), None);
        assert_eq!(DType::from_onnx_code(999), None);
    }

    #[test]
    fn shape_and_dtype() {
        let t = Tensor::F32(ArrayD::zeros(vec![2, 3]));
        assert_eq!(
            (t.dtype(), t.shape(), t.len()),
            (DType::F32, &[2usize, 3][..], 6)
        );
    }
}
