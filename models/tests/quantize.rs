//! Quantizers on small models built here, run through the real ONNX Runtime:
//! outputs stay close to float, weights become int8, unsupported ops stay
//! float, and external data is read from beside the model.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;

use edgeloop_models::dataset::{Dataset, DatasetError};
use edgeloop_models::npz::Npz;
use edgeloop_models::onnx::{self, ir};
use edgeloop_models::quantize::{
    calibrate, calibration_targets, convert_fp16, quantize_dynamic, quantize_static,
    CalibrationMethod, DynamicOptions, Fp16Options, StaticOptions,
};
use edgeloop_models::runtime::{OrtRuntime, SessionOptions};
use edgeloop_models::Tensor;
use ndarray::{ArrayD, IxDyn};

fn runtime() -> OrtRuntime {
    let path = OrtRuntime::resolve_library_path(None).expect("a library location");
    assert!(
        path.is_file(),
        "ONNX Runtime not found at {}: run scripts/fetch-onnxruntime.sh",
        path.display()
    );
    OrtRuntime::load(None).expect("load ONNX Runtime")
}

/// Deterministic pseudo-random floats in [-1, 1).
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn f32_tensor(shape: &[usize], values: Vec<f32>) -> Tensor {
    Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), values).unwrap())
}

fn value(name: &str, dims: &[i64]) -> ir::ValueInfoProto {
    let mut v = ir::ValueInfoProto::new();
    v.set_name(name.into());
    let mut t = ir::type_proto::Tensor::new();
    t.set_elem_type(1);
    let shape = t.shape.mut_or_insert_default();
    for &d in dims {
        let mut dim = ir::tensor_shape_proto::Dimension::new();
        dim.value = Some(if d < 0 {
            ir::tensor_shape_proto::dimension::Value::DimParam("N".into())
        } else {
            ir::tensor_shape_proto::dimension::Value::DimValue(d)
        });
        shape.dim.push(dim);
    }
    v.type_.mut_or_insert_default().value = Some(ir::type_proto::Value::TensorType(t));
    v
}

fn node(op: &str, inputs: &[&str], outputs: &[&str], ints: &[(&str, Vec<i64>)]) -> ir::NodeProto {
    let mut n = ir::NodeProto::new();
    n.set_op_type(op.into());
    n.set_name(format!("{op}_{}", outputs[0]));
    n.input = inputs.iter().map(|s| s.to_string()).collect();
    n.output = outputs.iter().map(|s| s.to_string()).collect();
    for (name, v) in ints {
        let mut a = ir::AttributeProto::new();
        a.set_name(name.to_string());
        if v.len() == 1 && *name == "transB" {
            a.set_i(v[0]);
            a.set_type(ir::attribute_proto::AttributeType::INT);
        } else {
            a.ints = v.clone();
            a.set_type(ir::attribute_proto::AttributeType::INTS);
        }
        n.attribute.push(a);
    }
    n
}

/// input [N,1,8,8] -> Conv(4,3x3,pad1)+bias -> Relu -> MaxPool 2 -> Flatten
/// -> Gemm(64->10, transB)+bias -> Tanh -> logits [N,10]. Tanh has no
/// int8 kernel here and must stay float.
fn small_cnn() -> ir::ModelProto {
    let mut m = ir::ModelProto::new();
    m.set_ir_version(8);
    let mut o = ir::OperatorSetIdProto::new();
    o.set_version(17);
    m.opset_import.push(o);
    let g = m.graph.mut_or_insert_default();
    g.set_name("small_cnn".into());
    g.input.push(value("input", &[-1, 1, 8, 8]));
    g.output.push(value("logits", &[-1, 10]));
    g.initializer.push(onnx::from_tensor(
        "conv_w",
        &f32_tensor(&[4, 1, 3, 3], noise(36, 1)),
    ));
    g.initializer
        .push(onnx::from_tensor("conv_b", &f32_tensor(&[4], noise(4, 2))));
    g.initializer.push(onnx::from_tensor(
        "fc_w",
        &f32_tensor(&[10, 64], noise(640, 3).iter().map(|v| v * 0.3).collect()),
    ));
    g.initializer
        .push(onnx::from_tensor("fc_b", &f32_tensor(&[10], noise(10, 4))));
    g.node = vec![
        node(
            "Conv",
            &["input", "conv_w", "conv_b"],
            &["conv"],
            &[("pads", vec![1, 1, 1, 1]), ("kernel_shape", vec![3, 3])],
        ),
        node("Relu", &["conv"], &["relu"], &[]),
        node(
            "MaxPool",
            &["relu"],
            &["pool"],
            &[("kernel_shape", vec![2, 2]), ("strides", vec![2, 2])],
        ),
        node("Flatten", &["pool"], &["flat"], &[]),
        node(
            "Gemm",
            &["flat", "fc_w", "fc_b"],
            &["fc"],
            &[("transB", vec![1])],
        ),
        node("Tanh", &["fc"], &["logits"], &[]),
    ];
    onnx::validate(&m, None).unwrap();
    m
}

fn batches(n_batches: usize, seed: u64) -> Vec<Vec<(String, Tensor)>> {
    (0..n_batches)
        .map(|b| {
            vec![(
                "input".to_string(),
                f32_tensor(&[16, 1, 8, 8], noise(16 * 64, seed + b as u64)),
            )]
        })
        .collect()
}

fn run(rt: &OrtRuntime, model: &ir::ModelProto, batch: &[(String, Tensor)]) -> Vec<f32> {
    let mut s = rt
        .session(&onnx::encode(model).unwrap(), &SessionOptions::default())
        .expect("model loads in ORT");
    let inputs: Vec<(&str, &Tensor)> = batch.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let out = s.run(&inputs).expect("model runs");
    match &out[0].1 {
        Tensor::F32(a) => a.iter().copied().collect(),
        other => panic!("unexpected output {:?}", other.dtype()),
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn ops(model: &ir::ModelProto) -> HashMap<String, usize> {
    let mut h = HashMap::new();
    for n in &model.graph.node {
        *h.entry(n.op_type().to_string()).or_default() += 1;
    }
    h
}

#[test]
fn static_qdq_is_close_to_float_and_leaves_unsupported_ops_in_float() {
    let rt = runtime();
    let model = small_cnn();
    let calib = batches(4, 100);
    let eval = batches(1, 999);
    let want = run(&rt, &model, &eval[0]);
    for method in [
        CalibrationMethod::MinMax,
        CalibrationMethod::Percentile(99.99),
        CalibrationMethod::Entropy,
    ] {
        let opts = StaticOptions::default();
        let targets = calibration_targets(&model, &opts);
        assert!(
            targets.contains(&"input".to_string()) && targets.contains(&"relu".to_string()),
            "{targets:?}"
        );
        assert!(
            !targets.contains(&"conv".to_string()),
            "Q/DQ goes after the Relu, not between Conv and Relu"
        );
        let observed = calibrate(&rt, &model, &targets, &calib, method).unwrap();
        let ranges: HashMap<String, (f32, f32)> = observed
            .iter()
            .map(|(k, o)| (k.clone(), o.range(method)))
            .collect();
        let (q, report) = quantize_static(&model, &ranges, &opts).unwrap();
        onnx::validate(&q, None).unwrap();
        let h = ops(&q);
        assert!(
            h["QuantizeLinear"] >= 3 && h["DequantizeLinear"] >= 5,
            "{method}: {h:?}"
        );
        // Weights are stored as int8, biases as int32; the float copies are gone.
        let inits: HashMap<&str, i32> = q
            .graph
            .initializer
            .iter()
            .map(|t| (t.name(), t.data_type()))
            .collect();
        assert_eq!(inits.get("conv_w_quantized"), Some(&3));
        assert_eq!(inits.get("conv_b_quantized"), Some(&6));
        assert!(!inits.contains_key("conv_w") && !inits.contains_key("fc_w"));
        assert_eq!(report.quantized_nodes.len(), 2, "{report:?}");
        assert_eq!(report.left_in_float.len(), 1, "{report:?}");
        assert_eq!(report.left_in_float[0].op_type, "Tanh");
        let got = run(&rt, &q, &eval[0]);
        let err = max_abs_diff(&want, &got);
        // Entropy clips tails by design, which costs more on random weights
        // than on trained ones; its accuracy on a trained model is checked
        // by the MNIST gate test.
        let tolerance = if method == CalibrationMethod::Entropy {
            0.5
        } else {
            0.08
        };
        assert!(err < tolerance, "{method}: max |float - int8| = {err}");
        assert!(onnx::encode(&q).unwrap().len() < onnx::encode(&model).unwrap().len());
    }
}

#[test]
fn dynamic_int8_quantizes_gemm_weights_per_column() {
    let rt = runtime();
    let model = small_cnn();
    let (q, report) = quantize_dynamic(&model, &DynamicOptions::default()).unwrap();
    onnx::validate(&q, None).unwrap();
    let h = ops(&q);
    assert_eq!(h.get("DynamicQuantizeLinear"), Some(&1));
    assert_eq!(h.get("MatMulInteger"), Some(&1));
    assert!(!h.contains_key("Gemm"));
    assert_eq!(report.quantized_nodes.len(), 1);
    let eval = batches(1, 7);
    let err = max_abs_diff(&run(&rt, &model, &eval[0]), &run(&rt, &q, &eval[0]));
    assert!(err < 0.05, "max |float - dynamic| = {err}");
}

#[test]
fn fp16_keeps_io_types_and_stays_close() {
    let rt = runtime();
    let model = small_cnn();
    let (h, report) = convert_fp16(&model, &Fp16Options::default()).unwrap();
    onnx::validate(&h, None).unwrap();
    assert!(
        h.graph.initializer.iter().all(|t| t.data_type() == 10),
        "weights are float16"
    );
    assert!(report.left_in_float.is_empty(), "{report:?}");
    let eval = batches(1, 8);
    let err = max_abs_diff(&run(&rt, &model, &eval[0]), &run(&rt, &h, &eval[0]));
    assert!(err < 0.01, "max |float - fp16| = {err}");
    let keep = Fp16Options {
        keep_io_types: false,
        ..Fp16Options::default()
    };
    let (h, _) = convert_fp16(&model, &keep).unwrap();
    let summary = onnx::inspect(&h);
    assert_eq!(summary.inputs[0].dtype, "float16");
    assert_eq!(summary.outputs[0].dtype, "float16");
}

#[test]
fn a_mismatched_calibration_set_is_named() {
    let model = small_cnn();
    let inputs = onnx::inspect(&model).inputs;
    let mut npz = Npz::new();
    npz.insert("input", f32_tensor(&[4, 1, 9, 9], noise(4 * 81, 1)));
    match Dataset::from_npz(&npz, "calib.npz", &inputs, false) {
        Err(DatasetError::Shape { input, found, .. }) => {
            assert_eq!((input.as_str(), found), ("input", vec![4, 1, 9, 9]))
        }
        other => panic!("{other:?}"),
    }
    let mut wrong_key = Npz::new();
    wrong_key.insert("image", f32_tensor(&[4, 1, 8, 8], noise(256, 1)));
    let err = Dataset::from_npz(&wrong_key, "calib.npz", &inputs, false).unwrap_err();
    assert!(
        matches!(&err, DatasetError::MissingInput { input, available, .. } if input == "input" && available == "image"),
        "{err}"
    );
    let mut wrong_type = Npz::new();
    wrong_type.insert("input", Tensor::F64(ArrayD::zeros(IxDyn(&[4, 1, 8, 8]))));
    assert!(matches!(
        Dataset::from_npz(&wrong_type, "c.npz", &inputs, false),
        Err(DatasetError::DType { .. })
    ));
    let mut no_labels = Npz::new();
    no_labels.insert("input", f32_tensor(&[4, 1, 8, 8], noise(256, 1)));
    assert!(matches!(
        Dataset::from_npz(&no_labels, "eval.npz", &inputs, true),
        Err(DatasetError::Label { .. })
    ));
    no_labels.insert("label", Tensor::I64(ArrayD::zeros(IxDyn(&[4]))));
    let ok = Dataset::from_npz(&no_labels, "eval.npz", &inputs, true).unwrap();
    assert_eq!((ok.samples, ok.labels.unwrap().len()), (4, 4));
}

/// Exporters (PaddlePaddle, some tf2onnx) write `dim_value: -1` or `0` for
/// an unknown size. Read as a fixed batch of -1 it left the dataset with no
/// batches, and the gate indexed the first one: a panic from a user's file.
#[test]
fn dim_value_minus_one_or_zero_is_a_dynamic_size() {
    for unknown in [-1i64, 0] {
        let inputs = vec![edgeloop_models::onnx::ValueSummary {
            name: "input".into(),
            dtype: "float32".into(),
            shape: Some(vec![
                edgeloop_models::onnx::Dim::Fixed(unknown),
                edgeloop_models::onnx::Dim::Fixed(3),
                edgeloop_models::onnx::Dim::Fixed(unknown),
                edgeloop_models::onnx::Dim::Symbolic("w".into()),
            ]),
        }];
        let mut npz = Npz::new();
        npz.insert("input", f32_tensor(&[5, 3, 4, 4], noise(5 * 48, 2)));
        let d = Dataset::from_npz(&npz, "calib.npz", &inputs, false).unwrap();
        assert_eq!((d.samples, d.batches.len()), (5, 1), "dim_value {unknown}");
    }
    // A real fixed batch larger than the file is an error naming both.
    let inputs = vec![edgeloop_models::onnx::ValueSummary {
        name: "input".into(),
        dtype: "float32".into(),
        shape: Some(vec![
            edgeloop_models::onnx::Dim::Fixed(8),
            edgeloop_models::onnx::Dim::Fixed(3),
        ]),
    }];
    let mut npz = Npz::new();
    npz.insert("input", f32_tensor(&[5, 3], noise(15, 2)));
    let err = Dataset::from_npz(&npz, "calib.npz", &inputs, false).unwrap_err();
    assert!(
        err.to_string()
            .contains("batches of exactly 8 samples, the file has 5"),
        "{err}"
    );
}

#[test]
fn a_model_with_external_data_is_inspected_and_quantized() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let mut model = small_cnn();
    // Move the Gemm weight out into weights.bin, as large models do.
    let fc = model
        .graph
        .mut_or_insert_default()
        .initializer
        .iter_mut()
        .find(|t| t.name() == "fc_w")
        .unwrap();
    let raw = fc.raw_data.take().unwrap();
    std::fs::write(dir.path().join("weights.bin"), &raw).unwrap();
    fc.set_data_location(ir::tensor_proto::DataLocation::EXTERNAL);
    for (k, v) in [
        ("location", "weights.bin".to_string()),
        ("offset", "0".into()),
        ("length", raw.len().to_string()),
    ] {
        let mut e = ir::StringStringEntryProto::new();
        e.set_key(k.into());
        e.set_value(v);
        fc.external_data.push(e);
    }
    let summary = onnx::inspect(&model);
    assert_eq!(summary.external_data.len(), 1);
    assert_eq!(summary.external_data[0].location, "weights.bin");
    onnx::validate(&model, Some(dir.path())).unwrap();
    assert_eq!(
        onnx::internalize_external_data(&mut model, dir.path()).unwrap(),
        1
    );
    let (q, _) = quantize_dynamic(&model, &DynamicOptions::default()).unwrap();
    let eval = batches(1, 3);
    assert_eq!(run(&rt, &q, &eval[0]).len(), 160);
}

/// ONNX's LSTM conformance models feed W, R (and B) as inputs; a deployed
/// model has them as constants. Make them initializers, then quantize.
fn lstm_case(name: &str) -> (ir::ModelProto, Vec<(String, Tensor)>, Vec<Tensor>) {
    use protobuf::Message;
    let dir = edgeloop_models::deps::dir()
        .unwrap()
        .join("onnx-1.22.0/node")
        .join(name);
    assert!(
        dir.exists(),
        "{}: run scripts/fetch-onnx-node-tests.sh",
        dir.display()
    );
    let mut model = onnx::read(&dir.join("model.onnx")).unwrap();
    let load = |f: &str| {
        onnx::to_tensor(
            &ir::TensorProto::parse_from_bytes(
                &std::fs::read(dir.join("test_data_set_0").join(f)).unwrap(),
            )
            .unwrap(),
            None,
        )
        .unwrap()
    };
    let g = model.graph.mut_or_insert_default();
    let names: Vec<String> = g.input.iter().map(|i| i.name().to_string()).collect();
    let mut feeds = vec![];
    for (k, n) in names.iter().enumerate() {
        let t = load(&format!("input_{k}.pb"));
        if k == 0 {
            feeds.push((n.clone(), t));
        } else {
            g.initializer.push(onnx::from_tensor(n, &t));
        }
    }
    g.input.truncate(1);
    let outputs = (0..g.output.len())
        .map(|k| load(&format!("output_{k}.pb")))
        .collect();
    (model, feeds, outputs)
}

#[test]
fn dynamic_int8_runs_lstm_on_onnx_runtime_contrib_kernel() {
    let rt = runtime();
    for case in [
        "test_lstm_defaults",
        "test_lstm_with_initial_bias",
        "test_lstm_with_peepholes",
    ] {
        let (model, feeds, expected) = lstm_case(case);
        let (q, report) = quantize_dynamic(&model, &DynamicOptions::default()).unwrap();
        assert_eq!(report.quantized_nodes.len(), 1, "{case}: {report:?}");
        assert_eq!(ops(&q).get("DynamicQuantizeLSTM"), Some(&1), "{case}");
        assert!(
            q.graph.initializer.iter().any(|t| t.data_type() == 3),
            "{case}: int8 weights"
        );
        let float_out = run(&rt, &model, &feeds);
        let got = run(&rt, &q, &feeds);
        let Tensor::F32(want) = &expected[0] else {
            panic!()
        };
        let want: Vec<f32> = want.iter().copied().collect();
        assert!(
            max_abs_diff(&want, &float_out) < 1e-4,
            "{case}: float matches the reference"
        );
        let err = max_abs_diff(&float_out, &got);
        assert!(err < 0.02, "{case}: max |float - int8| = {err}");
    }
}

/// Per-call sets (one axis more than the input: scalars, state tensors,
/// sequences) and labelled boxes, with each bad file named.
#[test]
fn per_call_layouts_and_labelled_boxes_are_read_and_checked() {
    use edgeloop_models::dataset::Layout;
    use edgeloop_models::onnx::{Dim, ValueSummary};
    let input = |name: &str, dims: Vec<Dim>| ValueSummary {
        name: name.into(),
        dtype: if name == "sr" {
            "int64".into()
        } else {
            "float32".into()
        },
        shape: Some(dims),
    };
    let inputs = vec![
        input("x", vec![Dim::Symbolic("batch".into()), Dim::Fixed(4)]),
        input(
            "state",
            vec![Dim::Fixed(2), Dim::Symbolic("batch".into()), Dim::Fixed(3)],
        ),
        input("sr", vec![]),
    ];
    let mut npz = Npz::new();
    npz.insert("x", f32_tensor(&[5, 1, 4], noise(20, 1)));
    npz.insert("state", f32_tensor(&[5, 2, 1, 3], noise(30, 2)));
    npz.insert("sr", Tensor::I64(ArrayD::from_elem(IxDyn(&[5]), 16000)));
    let d = Dataset::from_npz(&npz, "steps.npz", &inputs, false).unwrap();
    assert_eq!(
        (d.layout, d.samples, d.batches.len()),
        (Layout::PerCall, 5, 5)
    );
    assert_eq!(d.batches[3][1].1.shape(), &[2, 1, 3]);
    assert_eq!(d.batches[3][2].1.shape(), &[] as &[usize]);
    // One array batched, another per call: refused, both named.
    let mut mixed = npz.clone();
    mixed.insert("x", f32_tensor(&[5, 4], noise(20, 1)));
    let err = Dataset::from_npz(&mixed, "steps.npz", &inputs, false).unwrap_err();
    assert!(
        err.to_string()
            .contains("\"x\" is batched, \"state\" is per call"),
        "{err}"
    );
    // A fixed dim checked inside each call.
    let mut wrong = npz.clone();
    wrong.insert("state", f32_tensor(&[5, 3, 1, 3], noise(45, 2)));
    assert!(Dataset::from_npz(&wrong, "steps.npz", &inputs, false).is_err());

    let image = vec![input(
        "images",
        vec![Dim::Symbolic("batch".into()), Dim::Fixed(3)],
    )];
    let with_boxes = |boxes: Tensor| {
        let mut n = Npz::new();
        n.insert("images", f32_tensor(&[2, 3], noise(6, 3)));
        n.insert("boxes", boxes);
        Dataset::from_npz(&n, "eval.npz", &image, false)
    };
    let good = with_boxes(f32_tensor(
        &[2, 2, 5],
        vec![
            0.0, 0.0, 10.0, 10.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 5.0, 5.0, 6.0, 7.0, 0.0, 0.0,
            0.0, 0.0, 0.0, -1.0,
        ],
    ))
    .unwrap();
    let boxes = good.boxes.unwrap();
    assert_eq!(
        (boxes[0].len(), boxes[1].len()),
        (1, 1),
        "padding rows dropped"
    );
    assert_eq!(boxes[0][0].class, 1);
    for (bad, want) in [
        (
            f32_tensor(&[3, 1, 5], vec![0.0; 15]),
            "must have shape [2, max_boxes, 5]",
        ),
        (f32_tensor(&[2, 1, 4], vec![0.0; 8]), "must have shape"),
        (
            f32_tensor(
                &[2, 1, 5],
                vec![5.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0],
            ),
            "x2 >= x1",
        ),
        (
            f32_tensor(
                &[2, 1, 5],
                vec![0.0, 0.0, 1.0, 1.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.0],
            ),
            "whole number",
        ),
        (
            f32_tensor(
                &[2, 1, 5],
                vec![0.0, 0.0, f32::NAN, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0],
            ),
            "is not x1",
        ),
        (
            Tensor::I64(ArrayD::zeros(IxDyn(&[2, 1, 5]))),
            "must be float32",
        ),
    ] {
        let err = with_boxes(bad).unwrap_err().to_string();
        assert!(err.contains(want), "{err} lacks {want}");
    }
}
