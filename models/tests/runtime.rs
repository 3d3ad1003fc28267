//! ONNX Runtime integration: these tests load the real library, so they need
//! `scripts/fetch-onnxruntime.sh` to have been run (or `ORT_DYLIB_PATH` set). They
//! fail, never skip, when it is missing.
//!
//! All tests share one process, and ONNX Runtime can be loaded only once per
//! process, so every test that loads it uses the same path, and the "not found" and
//! "not a library" cases are ones `OrtRuntime::load` decides before looking at what
//! is already loaded.

use std::path::PathBuf;

use edgeloop_models::runtime::{
    ExecutionProvider, GraphOptimization, IoInfo, OrtRuntime, RuntimeError, SessionOptions,
    CPU_PROVIDER, LIBRARY_FILE_NAME, ORT_VERSION,
};
use edgeloop_models::{DType, Tensor};
use ndarray::ArrayD;

fn default_install_dir() -> PathBuf {
    edgeloop_models::deps::dir()
        .expect("HOME or EDGELOOP_DEPS is set")
        .join(format!("onnxruntime-{ORT_VERSION}"))
}

fn library_path() -> PathBuf {
    let path = match std::env::var_os("ORT_DYLIB_PATH").filter(|v| !v.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => default_install_dir().join(LIBRARY_FILE_NAME),
    };
    assert!(
        path.is_file(),
        "ONNX Runtime {ORT_VERSION} not found at {}: run scripts/fetch-onnxruntime.sh \
         (or set ORT_DYLIB_PATH to the library)",
        path.display()
    );
    path
}

fn runtime() -> OrtRuntime {
    let path = library_path();
    // With ORT_DYLIB_PATH set, let `load` find it itself, so that the variable's
    // part in the resolution is exercised too.
    let explicit = std::env::var_os("ORT_DYLIB_PATH")
        .is_none()
        .then_some(path.as_path());
    OrtRuntime::load(explicit)
        .unwrap_or_else(|e| panic!("loading ONNX Runtime from {}: {e}", path.display()))
}

/// One of the wheel's test models, next to the library or in the default install.
fn dataset(name: &str) -> Vec<u8> {
    let file = format!("{name}.onnx");
    let beside_library = library_path()
        .parent()
        .map(|d| d.join("datasets").join(&file));
    let candidates = beside_library
        .into_iter()
        .chain([default_install_dir().join("datasets").join(&file)]);
    for path in candidates {
        if let Ok(bytes) = std::fs::read(&path) {
            return bytes;
        }
    }
    panic!("test model {file} not found: run scripts/fetch-onnxruntime.sh");
}

fn session(model: &[u8]) -> edgeloop_models::runtime::ModelSession {
    runtime()
        .session(model, &SessionOptions::default())
        .unwrap_or_else(|e| panic!("creating the session: {e}"))
}

fn f32_tensor(shape: &[usize], values: Vec<f32>) -> Tensor {
    Tensor::F32(ArrayD::from_shape_vec(shape.to_vec(), values).expect("values fit the shape"))
}

/// Deterministic pseudo-random bytes (xorshift64), so failures reproduce.
fn noise(len: usize, mut state: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}

fn expect_input_error(
    result: Result<Vec<(String, Tensor)>, RuntimeError>,
    input: &str,
    reason_part: &str,
) {
    match result {
        Err(RuntimeError::Input { name, reason }) => {
            assert_eq!(name, input, "reason: {reason}");
            assert!(
                reason.contains(reason_part),
                "{reason:?} lacks {reason_part:?}"
            );
        }
        other => panic!("expected RuntimeError::Input for `{input}`, got {other:?}"),
    }
}

#[test]
fn loads_once_and_shares_the_environment() {
    let path = library_path();
    let first = runtime();
    assert_eq!(first.library_path(), std::fs::canonicalize(&path).unwrap());
    assert_eq!(
        OrtRuntime::resolve_library_path(Some(&path)).unwrap(),
        path,
        "an explicit path wins"
    );

    // Concurrent loads of the same library all get the one environment.
    let handles: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                OrtRuntime::load(Some(&library_path())).map(|r| r.library_path().to_path_buf())
            })
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.join().unwrap().unwrap(), first.library_path());
    }

    // Another spelling of the same file (a symlink) is the same library...
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("libonnxruntime.so");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert_eq!(
        OrtRuntime::load(Some(&link)).unwrap().library_path(),
        first.library_path()
    );

    // ...but another file is refused: ONNX Runtime is initialised once per process.
    // The test binary is an ELF file that exists, so only the "already loaded" rule
    // can refuse it.
    let other = std::env::current_exe().unwrap();
    match OrtRuntime::load(Some(&other)) {
        Err(RuntimeError::AlreadyLoaded { loaded, requested }) => {
            assert_eq!(loaded, first.library_path());
            assert_eq!(requested, std::fs::canonicalize(&other).unwrap());
        }
        other => panic!("expected AlreadyLoaded, got {other:?}"),
    }
}

#[test]
fn missing_library_is_library_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir
        .path()
        .join("onnxruntime-1.31.1")
        .join(LIBRARY_FILE_NAME);
    match OrtRuntime::load(Some(&missing)) {
        Err(RuntimeError::LibraryNotFound { path, hint }) => {
            assert_eq!(path, missing);
            assert!(hint.contains("scripts/fetch-onnxruntime.sh"), "{hint}");
        }
        other => panic!("expected LibraryNotFound, got {other:?}"),
    }
}

#[test]
fn a_file_that_is_not_a_library_is_load_failed() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join(LIBRARY_FILE_NAME);
    std::fs::write(&garbage, noise(4096, 0x5eed)).unwrap();
    match OrtRuntime::load(Some(&garbage)) {
        Err(RuntimeError::LoadFailed { path, reason }) => {
            assert_eq!(path, std::fs::canonicalize(&garbage).unwrap());
            assert!(reason.contains("not a shared library"), "{reason}");
        }
        other => panic!("expected LoadFailed, got {other:?}"),
    }
}

#[test]
fn mul_1_multiplies_by_its_weights() {
    // mul_1.onnx: Y = X * W, with the initializer W = [[1, 2], [3, 4], [5, 6]].
    let mut session = session(&dataset("mul_1"));
    assert_eq!(session.provider(), CPU_PROVIDER);
    let io = |name: &str| IoInfo {
        name: name.to_string(),
        dtype: Some(DType::F32),
        shape: vec![Some(3), Some(2)],
    };
    assert_eq!(session.inputs(), [io("X")]);
    assert_eq!(session.outputs(), [io("Y")]);

    let x = [0.5f32, -1.0, 2.0, 0.25, -3.5, 10.0];
    let weights = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let outputs = session
        .run(&[("X", &f32_tensor(&[3, 2], x.to_vec()))])
        .unwrap();

    let expected: Vec<f32> = x.iter().zip(weights).map(|(x, w)| x * w).collect();
    assert_eq!(outputs.len(), 1);
    assert_eq!(outputs[0].0, "Y");
    assert_eq!(outputs[0].1, f32_tensor(&[3, 2], expected));
}

#[test]
fn sigmoid_matches_rust() {
    let mut session = session(&dataset("sigmoid"));
    let shape = [3usize, 4, 5];
    let x: Vec<f32> = (0..60).map(|i| (i as f32 - 30.0) / 4.0).collect();
    let outputs = session
        .run(&[("x", &f32_tensor(&shape, x.clone()))])
        .unwrap();

    let [(name, Tensor::F32(y))] = outputs.as_slice() else {
        panic!("expected one f32 output, got {outputs:?}");
    };
    assert_eq!(name, "y");
    assert_eq!(y.shape(), shape);
    for (x, y) in x.iter().zip(y.iter()) {
        let want = 1.0 / (1.0 + (-x).exp());
        assert!((y - want).abs() <= 1e-6, "sigmoid({x}) = {y}, want {want}");
    }

    // The session stays usable after a refused run.
    assert!(session.run(&[]).is_err());
    assert!(session.run(&[("x", &f32_tensor(&shape, x))]).is_ok());
}

#[test]
fn logreg_iris_labels_and_its_non_tensor_output() {
    let mut session = session(&dataset("logreg_iris"));
    assert_eq!(
        session.inputs(),
        [IoInfo {
            name: "float_input".into(),
            dtype: Some(DType::F32),
            shape: vec![Some(3), Some(2)]
        }]
    );
    assert_eq!(
        session.outputs(),
        [
            IoInfo {
                name: "label".into(),
                dtype: Some(DType::I64),
                shape: vec![Some(3)]
            },
            // A ZipMap output: a sequence of maps, which is no Tensor.
            IoInfo {
                name: "probabilities".into(),
                dtype: None,
                shape: vec![]
            },
        ]
    );

    let x = [5.1f32, 3.5, 1.0, -3.0, -3.0, 0.0];
    let input = f32_tensor(&[3, 2], x.to_vec());
    match session.run(&[("float_input", &input)]) {
        Err(RuntimeError::Output { name, reason }) => {
            assert_eq!(name, "probabilities");
            assert!(reason.contains("Sequence"), "{reason}");
        }
        other => panic!("expected an Output error for `probabilities`, got {other:?}"),
    }

    // The model's LinearClassifier: 3 classes over the 2 declared features (ONNX
    // Runtime reads the first 3 x 2 of its coefficients), label = argmax of the
    // scores (the LOGISTIC post-transform is monotonic).
    let coefficients = [
        [0.385_741_14f32, 1.380_540_6],
        [-2.131_45, -0.992_804_8],
        [0.642_774_5, -1.748_938_8],
    ];
    let intercepts = [0.249_629_2f32, 0.582_027_8, -0.941_616_65];
    let expected: Vec<i64> = x
        .chunks(2)
        .map(|row| {
            let scores = coefficients
                .iter()
                .zip(intercepts)
                .map(|(c, b)| c[0] * row[0] + c[1] * row[1] + b);
            scores
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(i, _)| i as i64)
                .unwrap()
        })
        .collect();
    assert_eq!(
        expected,
        [0, 2, 1],
        "the inputs were chosen to hit every class"
    );

    let outputs = session
        .run_outputs(&[("float_input", &input)], &["label"])
        .unwrap();
    assert_eq!(
        outputs,
        [(
            "label".to_string(),
            Tensor::I64(ArrayD::from_shape_vec(vec![3], expected).unwrap())
        )]
    );
}

#[test]
fn wrong_inputs_name_the_input() {
    let mut session = session(&dataset("sigmoid"));
    let good = f32_tensor(&[3, 4, 5], vec![0.0; 60]);

    expect_input_error(session.run(&[("X", &good)]), "X", "no such input");
    expect_input_error(session.run(&[]), "x", "missing");
    expect_input_error(
        session.run(&[("x", &Tensor::F64(ArrayD::zeros(vec![3, 4, 5])))]),
        "x",
        "expects dtype float32, got float64",
    );
    expect_input_error(
        session.run(&[("x", &f32_tensor(&[60], vec![0.0; 60]))]),
        "x",
        "rank 3",
    );
    expect_input_error(
        session.run(&[("x", &f32_tensor(&[3, 4, 6], vec![0.0; 72]))]),
        "x",
        "dimension 2 must be 5",
    );
    expect_input_error(
        session.run(&[("x", &good), ("x", &good)]),
        "x",
        "more than once",
    );

    match session.run_outputs(&[("x", &good)], &["z"]) {
        Err(RuntimeError::Output { name, .. }) => assert_eq!(name, "z"),
        other => panic!("expected an Output error for `z`, got {other:?}"),
    }
}

#[test]
fn garbage_models_are_session_errors() {
    let runtime = runtime();
    for model in [noise(1000, 42), Vec::new(), b"\x08\x07garbage".to_vec()] {
        match runtime.session(&model, &SessionOptions::default()) {
            Err(RuntimeError::Session(message)) => assert!(!message.is_empty()),
            other => panic!("expected RuntimeError::Session, got {other:?}"),
        }
    }
}

#[test]
fn unavailable_gpu_providers_fall_back_to_cpu() {
    let options = SessionOptions {
        intra_op_threads: 1,
        optimization: GraphOptimization::Basic,
        providers: vec![
            ExecutionProvider::TensorRt {
                device_id: 0,
                engine_cache: None,
                fp16: false,
            },
            ExecutionProvider::Cuda {
                device_id: 0,
                mem_limit_bytes: Some(1 << 30),
            },
            ExecutionProvider::Cpu,
        ],
    };
    let mut session = runtime().session(&dataset("mul_1"), &options).unwrap();
    if std::env::var_os("ORT_DYLIB_PATH").is_none() {
        // The fetched library is the CPU-only wheel's.
        assert_eq!(session.provider(), CPU_PROVIDER);
    }
    let outputs = session
        .run(&[("X", &f32_tensor(&[3, 2], vec![1.0; 6]))])
        .unwrap();
    assert_eq!(
        outputs[0].1,
        f32_tensor(&[3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    );
}

/// Minimal protobuf writer for building ONNX test models without the ONNX tooling.
mod onnx_bytes {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    pub fn int(out: &mut Vec<u8>, field: u32, v: u64) {
        varint(out, u64::from(field) << 3);
        varint(out, v);
    }

    pub fn bytes(out: &mut Vec<u8>, field: u32, v: &[u8]) {
        varint(out, (u64::from(field) << 3) | 2);
        varint(out, v.len() as u64);
        out.extend_from_slice(v);
    }

    pub enum Dim {
        Fixed(u64),
        Symbolic(&'static str),
    }

    /// ValueInfoProto { name, type: TypeProto { tensor_type { elem_type, shape } } }.
    fn value_info(name: &str, elem_type: i32, dims: &[Dim]) -> Vec<u8> {
        let mut shape = Vec::new();
        for dim in dims {
            let mut d = Vec::new();
            match dim {
                Dim::Fixed(n) => int(&mut d, 1, *n),
                Dim::Symbolic(s) => bytes(&mut d, 2, s.as_bytes()),
            }
            bytes(&mut shape, 1, &d);
        }
        let mut tensor_type = Vec::new();
        int(&mut tensor_type, 1, elem_type as u64);
        bytes(&mut tensor_type, 2, &shape);
        let mut type_proto = Vec::new();
        bytes(&mut type_proto, 1, &tensor_type);
        let mut info = Vec::new();
        bytes(&mut info, 1, name.as_bytes());
        bytes(&mut info, 2, &type_proto);
        info
    }

    /// A model computing `y = Identity(x)` for tensors of one element type.
    pub fn identity_model(elem_type: i32, dims: &[Dim]) -> Vec<u8> {
        let mut node = Vec::new();
        bytes(&mut node, 1, b"x");
        bytes(&mut node, 2, b"y");
        bytes(&mut node, 4, b"Identity");
        let mut graph = Vec::new();
        bytes(&mut graph, 1, &node);
        bytes(&mut graph, 2, b"identity");
        bytes(&mut graph, 11, &value_info("x", elem_type, dims));
        bytes(&mut graph, 12, &value_info("y", elem_type, dims));
        let mut opset = Vec::new();
        bytes(&mut opset, 1, b"");
        int(&mut opset, 2, 17);
        let mut model = Vec::new();
        int(&mut model, 1, 8); // IR version 8
        bytes(&mut model, 8, &opset);
        bytes(&mut model, 7, &graph);
        model
    }
}

#[test]
fn every_dtype_round_trips_through_identity() {
    use onnx_bytes::Dim;

    let runtime = runtime();
    let shape = vec![2usize, 3];
    let tensors = [
        Tensor::F32(ArrayD::from_shape_fn(shape.clone(), |i| {
            i[0] as f32 - 0.5 * i[1] as f32
        })),
        Tensor::F64(ArrayD::from_shape_fn(shape.clone(), |i| {
            1e-300 * (i[0] + i[1]) as f64
        })),
        Tensor::F16(ArrayD::from_shape_fn(shape.clone(), |i| {
            half::f16::from_f32(i[1] as f32 * 0.25)
        })),
        Tensor::I8(ArrayD::from_shape_fn(shape.clone(), |i| -128 + i[1] as i8)),
        Tensor::U8(ArrayD::from_shape_fn(shape.clone(), |i| 255 - i[0] as u8)),
        Tensor::I32(ArrayD::from_shape_fn(shape.clone(), |i| {
            i32::MIN + i[1] as i32
        })),
        Tensor::I64(ArrayD::from_shape_fn(shape.clone(), |i| {
            i64::MAX - i[0] as i64
        })),
        Tensor::Bool(ArrayD::from_shape_fn(shape.clone(), |i| {
            (i[0] + i[1]) % 2 == 0
        })),
    ];
    assert_eq!(tensors.len(), DType::ALL.len());

    for tensor in tensors {
        let dtype = tensor.dtype();
        let model =
            onnx_bytes::identity_model(dtype.onnx_code(), &[Dim::Symbolic("batch"), Dim::Fixed(3)]);
        let mut session = runtime
            .session(&model, &SessionOptions::default())
            .unwrap_or_else(|e| panic!("{dtype}: {e}"));
        assert_eq!(session.inputs()[0].dtype, Some(dtype));
        assert_eq!(
            session.inputs()[0].shape,
            [None, Some(3)],
            "a symbolic dimension is None"
        );

        let outputs = session
            .run(&[("x", &tensor)])
            .unwrap_or_else(|e| panic!("{dtype}: {e}"));
        assert_eq!(outputs, [("y".to_string(), tensor.clone())], "{dtype}");

        // Any batch size fits the symbolic dimension; the fixed one still binds.
        let Tensor::F32(_) = tensor else { continue };
        let batch5 = f32_tensor(&[5, 3], (0..15).map(|v| v as f32).collect());
        assert_eq!(session.run(&[("x", &batch5)]).unwrap()[0].1, batch5);
        expect_input_error(
            session.run(&[("x", &f32_tensor(&[5, 2], vec![0.0; 10]))]),
            "x",
            "dimension 1 must be 3",
        );
    }
}

#[test]
fn non_contiguous_inputs_are_read_in_logical_order() {
    use onnx_bytes::Dim;

    let model = onnx_bytes::identity_model(DType::F32.onnx_code(), &[Dim::Fixed(3), Dim::Fixed(2)]);
    let mut session = runtime()
        .session(&model, &SessionOptions::default())
        .unwrap();
    // A 2x3 array transposed in place: shape [3, 2] with column-major strides.
    let transposed = ArrayD::from_shape_vec(vec![2, 3], (0..6).map(|v| v as f32).collect())
        .unwrap()
        .reversed_axes();
    assert!(!transposed.is_standard_layout());
    let input = Tensor::F32(transposed);
    let outputs = session.run(&[("x", &input)]).unwrap();
    assert_eq!(
        outputs[0].1,
        f32_tensor(&[3, 2], vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0])
    );
}
