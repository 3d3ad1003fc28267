"""Small models written the ways real exporters write them, for
models/tests/exporter_conventions.rs.

    python tools/convention_models.py OUT_DIR

Writes, deterministically (fixed seed, onnx 1.22 from the pinned venv):
- mlp_opset{7,9,11,13,15,17,19,21}.onnx: MatMul + Add + Relu + Gemm, the
  lowest IR version each opset allows; input x float32 [batch, 16].
- mlp_constants.onnx: the opset 11 MLP with every weight in a Constant node
  and no initializers (PaddlePaddle's habit), input dims `dim_value: -1`.
- mlp_no_shapes.onnx: the opset 13 MLP whose input and output dims are all
  unknown (neither value nor name) and with no value_info anywhere: sizes
  come from shape inference (ONNX Runtime's) or not at all.
- multi_io.onnx: int64 ids (Gather from an embedding), int32 counts (Cast),
  a bool mask (Where) and a float input; two float outputs.
"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((16, 32)).astype(np.float32) * 0.3
B1 = RNG.standard_normal(32).astype(np.float32) * 0.1
W2 = RNG.standard_normal((32, 4)).astype(np.float32) * 0.3
B2 = RNG.standard_normal(4).astype(np.float32) * 0.1


def mlp_nodes():
    return [
        helper.make_node("MatMul", ["x", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="bias1"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("Gemm", ["h2", "w2", "b2"], ["y"], name="fc2"),
    ]


def weights():
    return [
        numpy_helper.from_array(W1, "w1"),
        numpy_helper.from_array(B1, "b1"),
        numpy_helper.from_array(W2, "w2"),
        numpy_helper.from_array(B2, "b2"),
    ]


def save(model, path):
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
    onnx.checker.check_model(model)
    onnx.save(model, path)


def mlp(opset, batch="batch"):
    inits = weights()
    # IR < 4 (opsets 7 and 8): every initializer must also be a graph input.
    extra_inputs = []
    if opset < 9:
        extra_inputs = [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.dims)) for t in inits]
    graph = helper.make_graph(
        mlp_nodes(),
        f"mlp_opset{opset}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 16])] + extra_inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="edgeloop-conventions")


def mlp_constants():
    consts = [
        helper.make_node("Constant", [], [t.name], value=t, name=f"const_{t.name}") for t in weights()
    ]
    graph = helper.make_graph(
        consts + mlp_nodes(),
        "mlp_constants",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4])],
        [],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], producer_name="PaddlePaddle-style")


def mlp_no_shapes():
    graph = helper.make_graph(
        mlp_nodes(),
        "mlp_no_shapes",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])],
        weights(),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="edgeloop-conventions")


def multi_io():
    emb = numpy_helper.from_array(RNG.standard_normal((50, 8)).astype(np.float32), "emb")
    w = numpy_helper.from_array(RNG.standard_normal((8, 3)).astype(np.float32) * 0.5, "w")
    zero = numpy_helper.from_array(np.zeros((1,), dtype=np.float32), "zero")
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
        helper.make_node("Cast", ["counts"], ["c"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Mul", ["e", "c"], ["ec"], name="scale"),
        helper.make_node("Where", ["mask", "ec", "zero"], ["masked"], name="mask"),
        helper.make_node("Add", ["masked", "bias"], ["feats"], name="add_bias"),
        helper.make_node("MatMul", ["feats", "w"], ["scores"], name="head"),
        helper.make_node("ReduceSum", ["feats", "axes"], ["total"], keepdims=0, name="sum"),
    ]
    graph = helper.make_graph(
        nodes,
        "multi_io",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 8]),
            helper.make_tensor_value_info("counts", TensorProto.INT32, ["batch", 8, 1]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", 8, 1]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["batch", 8, 8]),
        ],
        [
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 8, 3]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch", 8]),
        ],
        [emb, w, zero, numpy_helper.from_array(np.array([2], dtype=np.int64), "axes")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="edgeloop-conventions")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for opset in (7, 9, 11, 13, 15, 17, 19, 21):
        save(mlp(opset), os.path.join(out, f"mlp_opset{opset}.onnx"))
    save(mlp_constants(), os.path.join(out, "mlp_constants.onnx"))
    save(mlp_no_shapes(), os.path.join(out, "mlp_no_shapes.onnx"))
    save(multi_io(), os.path.join(out, "multi_io.onnx"))


if __name__ == "__main__":
    main()
