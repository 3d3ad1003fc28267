#!/usr/bin/env python3
"""Trains the two MNIST evaluation models of the int8 quantizer's accuracy gate.

    python tools/train_mnist.py DIGITS_DIR OUT_DIR [--seed 2024]

Run it with the venv of scripts/python-env.sh (numpy, onnx, onnxruntime);
scripts/fetch-mnist-models.sh does all three steps. DIGITS_DIR is the output of
scripts/fetch-mnist.sh: 0.json ... 9.json, each {"data": [...]} holding that
class's 28x28 digits (784 values in 0..1 each) concatenated.

Writes into OUT_DIR:
  cnn.onnx       input "input" f32 [N,1,28,28] -> Conv(8,3x3,p1) Relu MaxPool2
                 Conv(16,3x3,p1) Relu MaxPool2 Flatten Gemm(784->64) Relu
                 Gemm(64->10) -> "logits" f32 [N,10]
  mlp.onnx       input "input" f32 [N,784] -> Gemm(784->128) Relu
                 Gemm(128->64) Relu Gemm(64->10) -> "logits" f32 [N,10]
  calib_cnn.npz  "input" f32 [256,1,28,28]       (drawn from the train split)
  eval_cnn.npz   "input" f32 [2000,1,28,28], "label" i64 [2000]
  calib_mlp.npz  "input" f32 [256,784]           (the same 256 digits)
  eval_mlp.npz   "input" f32 [2000,784], "label" i64 [2000] (the same 2000)
  metrics.json   float accuracies (numpy and ONNX Runtime), times, seed,
                 split sizes and the sha256 of every file above

Plain numpy, no torch: torch's wheels are hundreds of MB, and models this
small train in about a minute on 2 cores with im2col convolutions on BLAS
(one thread, see below). Everything random derives from --seed, so the same
seed, the same pinned numpy and the same CPU kind give byte-identical model
and data files (metrics.json differs only in its timings).

The models are the last epoch's weights after a fixed number of epochs: the
eval accuracy printed per epoch is for the log only and selects nothing, so
the eval set stays held out.

Inputs stay in 0..1, not standardised: the exported model consumes exactly
what the .npz files hold, so the quantizer's calibration sees real inputs
with no hidden preprocessing step.
"""

import argparse
import hashlib
import json
import os
import sys
import time
import zipfile

# One BLAS thread, set before numpy loads OpenBLAS. The matmuls here are small
# (at most 50k x 72 by 72 x 16), so a second thread gains little, and on a
# 2-core machine shared with cargo builds OpenBLAS's spinning threads made a
# step 4x slower in wall time. One thread also fixes the summation order.
# An explicit setting in the environment still wins.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

N_CLASSES = 10
N_EVAL = 2000
N_CALIB = 256
PIXELS = 28 * 28
F32 = np.float32


# ---------------------------------------------------------------- data


def load_digits(digits_dir):
    """All digits as (x f32 [n,784] in 0..1, y i64 [n]), in file order."""
    xs, ys = [], []
    for digit in range(N_CLASSES):
        with open(os.path.join(digits_dir, f"{digit}.json"), "rb") as f:
            data = np.asarray(json.load(f)["data"], dtype=np.float64)
        if data.size % PIXELS:
            sys.exit(f"{digit}.json: {data.size} values is not a whole number of digits")
        x = data.reshape(-1, PIXELS).astype(F32)
        xs.append(x)
        ys.append(np.full(len(x), digit, dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


def split(y, rng):
    """Stratified train/eval split with exactly N_EVAL eval digits.

    Each class gives eval digits in proportion to its size (largest remainder
    rounding, so the total is exactly N_EVAL): the eval set has the classes in
    the same mix as the data, and every class is well represented.
    """
    counts = np.bincount(y, minlength=N_CLASSES)
    quota = counts * N_EVAL / counts.sum()
    take = np.floor(quota).astype(int)
    short = N_EVAL - take.sum()
    # Ties broken by class index (stable sort): deterministic.
    take[np.argsort(-(quota - take), kind="stable")[:short]] += 1
    train_idx, eval_idx = [], []
    for c in range(N_CLASSES):
        idx = rng.permutation(np.flatnonzero(y == c))
        eval_idx.append(idx[: take[c]])
        train_idx.append(idx[take[c] :])
    # Shuffled so that neither split is grouped by class (a calibration or
    # eval run over a prefix then still sees every class).
    train_idx = rng.permutation(np.concatenate(train_idx))
    eval_idx = rng.permutation(np.concatenate(eval_idx))
    return train_idx, eval_idx


def save_npz(path, **arrays):
    """np.savez's exact layout (stored, `<key>.npy`, zip64 forced), but with a
    fixed timestamp: np.savez stamps each entry with the current time, which
    would make the same data a different file on every run."""
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for key, value in arrays.items():
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o600 << 16  # what zipfile gives np.savez
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(value), allow_pickle=False)
    os.replace(tmp, path)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- layers
#
# The CNN runs in NHWC inside numpy (im2col is then a stack of shifted views
# and one matmul) and is exported in ONNX's NCHW: conv weights are permuted at
# export, and the flatten before the first Gemm goes through NCHW so that its
# feature order is ONNX Flatten's (channel, row, column).


def im2col3x3(x):
    """NHWC [B,H,W,C] -> [B*H*W, 9*C] patches of a 3x3, pad 1, stride 1 conv,
    patch features ordered (kh, kw, c)."""
    b, h, w, c = x.shape
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    cols = np.empty((b, h, w, 3, 3, c), dtype=x.dtype)
    for i in range(3):
        for j in range(3):
            cols[:, :, :, i, j, :] = xp[:, i : i + h, j : j + w, :]
    return cols.reshape(b * h * w, 9 * c)


def col2im3x3(dcols, shape):
    """Adjoint of im2col3x3: scatters patch gradients back onto the input."""
    b, h, w, c = shape
    dcols = dcols.reshape(b, h, w, 3, 3, c)
    dxp = np.zeros((b, h + 2, w + 2, c), dtype=dcols.dtype)
    for i in range(3):
        for j in range(3):
            dxp[:, i : i + h, j : j + w, :] += dcols[:, :, :, i, j, :]
    return dxp[:, 1:-1, 1:-1, :]


def maxpool2(x):
    """2x2 stride 2 max pool on NHWC; returns the output and the argmax mask."""
    b, h, w, c = x.shape
    xr = x.reshape(b, h // 2, 2, w // 2, 2, c)
    out = xr.max(axis=(2, 4))
    # Ties (rare after ReLU except at 0, where ReLU's gradient is 0 anyway)
    # all get the gradient; this does not affect the forward pass we export.
    mask = xr == out[:, :, None, :, None, :]
    return out, mask


def maxpool2_back(dout, mask):
    b, h2, _, w2, _, c = mask.shape
    return (mask * dout[:, :, None, :, None, :]).reshape(b, h2 * 2, w2 * 2, c)


def shift_batch(x, rng, max_shift=2):
    """Random translation by up to max_shift pixels each way, zero filled.

    With 8000 training digits both models overfit within a few epochs; small
    shifts are the cheapest augmentation that keeps digits realistic (MNIST
    digits are centred by mass, so real ones are off by a pixel or two)."""
    shape = x.shape
    imgs = x.reshape(-1, 28, 28)
    m = max_shift
    padded = np.pad(imgs, ((0, 0), (m, m), (m, m)))
    dy, dx = rng.integers(0, 2 * m + 1, size=(2, len(imgs)))
    out = np.empty_like(imgs)
    for i in range(len(imgs)):
        out[i] = padded[i, dy[i] : dy[i] + 28, dx[i] : dx[i] + 28]
    return out.reshape(shape)


def he(rng, fan_in, shape):
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(F32)


def softmax_xent(logits, y):
    """Mean cross-entropy and its gradient w.r.t. the logits."""
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    p = e / e.sum(axis=1, keepdims=True)
    n = len(y)
    loss = -np.log(p[np.arange(n), y] + 1e-12).mean()
    p[np.arange(n), y] -= 1
    return float(loss), (p / n).astype(F32)


class Adam:
    def __init__(self, params, lr):
        self.params, self.lr, self.t = params, lr, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, grads, lr):
        b1, b2, eps = 0.9, 0.999, 1e-8
        self.t += 1
        c1, c2 = 1 - b1**self.t, 1 - b2**self.t
        for k, g in grads.items():
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            step = lr * (self.m[k] / c1) / (np.sqrt(self.v[k] / c2) + eps)
            self.params[k] -= step.astype(F32)


# ---------------------------------------------------------------- models
#
# Weights are kept as numpy matmul operands: conv "w" [9*C, F] in (kh,kw,c)
# order, dense "w" [in, out]. Both forward functions take the model's ONNX
# input layout, so the numpy accuracy and ONNX Runtime's are measured on the
# very same arrays.


def cnn_init(rng):
    return {
        "c1w": he(rng, 9 * 1, (9 * 1, 8)), "c1b": np.zeros(8, F32),
        "c2w": he(rng, 9 * 8, (9 * 8, 16)), "c2b": np.zeros(16, F32),
        "f1w": he(rng, 784, (784, 64)), "f1b": np.zeros(64, F32),
        "f2w": he(rng, 64, (64, 10)), "f2b": np.zeros(10, F32),
    }


def cnn_forward(p, x_nchw, keep=False):
    b = len(x_nchw)
    x = x_nchw.reshape(b, 28, 28, 1)  # C == 1: NCHW and NHWC share the layout
    cols1 = im2col3x3(x)
    a1 = np.maximum(cols1 @ p["c1w"] + p["c1b"], 0).reshape(b, 28, 28, 8)
    p1, m1 = maxpool2(a1)
    cols2 = im2col3x3(p1)
    a2 = np.maximum(cols2 @ p["c2w"] + p["c2b"], 0).reshape(b, 14, 14, 16)
    p2, m2 = maxpool2(a2)
    flat = p2.transpose(0, 3, 1, 2).reshape(b, 784)  # ONNX Flatten order
    h = np.maximum(flat @ p["f1w"] + p["f1b"], 0)
    logits = h @ p["f2w"] + p["f2b"]
    if not keep:
        return logits
    return logits, (cols1, a1, m1, p1, cols2, a2, m2, p2, flat, h)


def cnn_backward(p, cache, dlogits):
    cols1, a1, m1, p1, cols2, a2, m2, p2, flat, h = cache
    b = len(dlogits)
    g = {}
    g["f2w"] = h.T @ dlogits
    g["f2b"] = dlogits.sum(0)
    dh = (dlogits @ p["f2w"].T) * (h > 0)
    g["f1w"] = flat.T @ dh
    g["f1b"] = dh.sum(0)
    dflat = dh @ p["f1w"].T
    dp2 = dflat.reshape(b, 16, 7, 7).transpose(0, 2, 3, 1)
    da2 = maxpool2_back(dp2, m2) * (a2 > 0)
    d2 = da2.reshape(-1, 16)
    g["c2w"] = cols2.T @ d2
    g["c2b"] = d2.sum(0)
    dp1 = col2im3x3(d2 @ p["c2w"].T, p1.shape)
    da1 = maxpool2_back(dp1, m1) * (a1 > 0)
    d1 = da1.reshape(-1, 8)
    g["c1w"] = cols1.T @ d1  # the input needs no gradient
    g["c1b"] = d1.sum(0)
    return g


def mlp_init(rng):
    return {
        "f1w": he(rng, 784, (784, 128)), "f1b": np.zeros(128, F32),
        "f2w": he(rng, 128, (128, 64)), "f2b": np.zeros(64, F32),
        "f3w": he(rng, 64, (64, 10)), "f3b": np.zeros(10, F32),
    }


def mlp_forward(p, x, keep=False):
    h1 = np.maximum(x @ p["f1w"] + p["f1b"], 0)
    h2 = np.maximum(h1 @ p["f2w"] + p["f2b"], 0)
    logits = h2 @ p["f3w"] + p["f3b"]
    return (logits, (x, h1, h2)) if keep else logits


def mlp_backward(p, cache, dlogits):
    x, h1, h2 = cache
    g = {"f3w": h2.T @ dlogits, "f3b": dlogits.sum(0)}
    d2 = (dlogits @ p["f3w"].T) * (h2 > 0)
    g["f2w"], g["f2b"] = h1.T @ d2, d2.sum(0)
    d1 = (d2 @ p["f2w"].T) * (h1 > 0)
    g["f1w"], g["f1b"] = x.T @ d1, d1.sum(0)
    return g


def predict(forward, p, x, batch=500):
    return np.concatenate([forward(p, x[i : i + batch]) for i in range(0, len(x), batch)])


def train(name, init, forward, backward, x, y, x_eval, y_eval, rng, epochs, batch, lr):
    """Adam with a cosine learning-rate decay to zero over all steps (a few
    epochs reach a good optimum without a hand-tuned schedule), on randomly
    shifted copies of each batch (see shift_batch)."""
    p = init(rng)
    opt = Adam(p, lr)
    steps_per_epoch = len(x) // batch  # the ragged tail is dropped each epoch
    total = epochs * steps_per_epoch
    step = 0
    t0 = time.perf_counter()
    for epoch in range(epochs):
        order = rng.permutation(len(x))
        losses = []
        for s in range(steps_per_epoch):
            idx = order[s * batch : (s + 1) * batch]
            logits, cache = forward(p, shift_batch(x[idx], rng), keep=True)
            loss, dlogits = softmax_xent(logits, y[idx])
            opt.step(backward(p, cache, dlogits), lr * 0.5 * (1 + np.cos(np.pi * step / total)))
            step += 1
            losses.append(loss)
        acc = (predict(forward, p, x_eval).argmax(1) == y_eval).mean()
        print(
            f"{name}: epoch {epoch + 1}/{epochs} loss {np.mean(losses):.4f} "
            f"eval acc {acc:.4f} ({time.perf_counter() - t0:.1f}s)",
            file=sys.stderr,
        )
    return p, time.perf_counter() - t0


# ---------------------------------------------------------------- export


def export(path, nodes, inits, input_shape, graph_name):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes,
        graph_name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", N_CLASSES])],
        initializer=[numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in inits.items()],
    )
    # opset 17 / IR 8: what ONNX Runtime 1.31 and most exporters agree on, and
    # recent enough (>= 13) for per-channel QDQ in ORT's python quantizer.
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
        producer_name="edgeloop-train_mnist",
        producer_version="1",
    )
    onnx.checker.check_model(model, full_check=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(model.SerializeToString())
    os.replace(tmp, path)


def gemm(name, x, w, b, out):
    # transB=1 with B as [out, in]: the layout PyTorch's exporter emits, so the
    # quantizer sees Gemm the way it will in the wild.
    from onnx import helper

    return helper.make_node("Gemm", [x, w, b], [out], name=name, transB=1)


def export_cnn(p, path):
    from onnx import helper

    def conv_w(w, c, f):  # [(kh,kw,c), f] -> ONNX OIHW [f, c, kh, kw]
        return w.reshape(3, 3, c, f).transpose(3, 2, 0, 1)

    inits = {
        "conv1.weight": conv_w(p["c1w"], 1, 8), "conv1.bias": p["c1b"],
        "conv2.weight": conv_w(p["c2w"], 8, 16), "conv2.bias": p["c2b"],
        "fc1.weight": p["f1w"].T, "fc1.bias": p["f1b"],
        "fc2.weight": p["f2w"].T, "fc2.bias": p["f2b"],
    }
    conv = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
    pool = dict(kernel_shape=[2, 2], strides=[2, 2])
    nodes = [
        helper.make_node("Conv", ["input", "conv1.weight", "conv1.bias"], ["conv1"], name="conv1", **conv),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("MaxPool", ["relu1"], ["pool1"], name="pool1", **pool),
        helper.make_node("Conv", ["pool1", "conv2.weight", "conv2.bias"], ["conv2"], name="conv2", **conv),
        helper.make_node("Relu", ["conv2"], ["relu2"], name="relu2"),
        helper.make_node("MaxPool", ["relu2"], ["pool2"], name="pool2", **pool),
        helper.make_node("Flatten", ["pool2"], ["flat"], name="flatten", axis=1),
        gemm("fc1", "flat", "fc1.weight", "fc1.bias", "fc1"),
        helper.make_node("Relu", ["fc1"], ["relu3"], name="relu3"),
        gemm("fc2", "relu3", "fc2.weight", "fc2.bias", "logits"),
    ]
    export(path, nodes, inits, ["N", 1, 28, 28], "mnist_cnn")


def export_mlp(p, path):
    from onnx import helper

    inits = {
        "fc1.weight": p["f1w"].T, "fc1.bias": p["f1b"],
        "fc2.weight": p["f2w"].T, "fc2.bias": p["f2b"],
        "fc3.weight": p["f3w"].T, "fc3.bias": p["f3b"],
    }
    nodes = [
        gemm("fc1", "input", "fc1.weight", "fc1.bias", "fc1"),
        helper.make_node("Relu", ["fc1"], ["relu1"], name="relu1"),
        gemm("fc2", "relu1", "fc2.weight", "fc2.bias", "fc2"),
        helper.make_node("Relu", ["fc2"], ["relu2"], name="relu2"),
        gemm("fc3", "relu2", "fc3.weight", "fc3.bias", "logits"),
    ]
    export(path, nodes, inits, ["N", PIXELS], "mnist_mlp")


def ort_logits(path, x):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1  # as for numpy: a fixed reduction order
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    return sess.run(["logits"], {"input": x})[0]


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("digits_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--cnn-epochs", type=int, default=12)
    ap.add_argument("--mlp-epochs", type=int, default=30)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    out = lambda name: os.path.join(args.out_dir, name)  # noqa: E731

    t_start = time.perf_counter()
    x, y = load_digits(args.digits_dir)
    rng = np.random.default_rng(args.seed)
    train_idx, eval_idx = split(y, rng)
    calib_idx = rng.choice(train_idx, size=N_CALIB, replace=False)
    x_tr, y_tr, x_ev, y_ev = x[train_idx], y[train_idx], x[eval_idx], y[eval_idx]
    t_load = time.perf_counter() - t_start
    print(f"data: {len(x_tr)} train, {len(x_ev)} eval, {N_CALIB} calib ({t_load:.1f}s)", file=sys.stderr)

    img = lambda a: a.reshape(-1, 1, 28, 28)  # noqa: E731
    save_npz(out("calib_cnn.npz"), input=img(x[calib_idx]))
    save_npz(out("eval_cnn.npz"), input=img(x_ev), label=y_ev)
    save_npz(out("calib_mlp.npz"), input=x[calib_idx])
    save_npz(out("eval_mlp.npz"), input=x_ev, label=y_ev)

    # Separate generators per model: the MLP's weights do not depend on how
    # many random numbers the CNN drew (e.g. with a different epoch count).
    cnn_rng, mlp_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(args.seed).spawn(2))
    cnn, cnn_time = train("cnn", cnn_init, cnn_forward, cnn_backward, img(x_tr), y_tr,
                          img(x_ev), y_ev, cnn_rng, args.cnn_epochs, batch=64, lr=2e-3)
    mlp, mlp_time = train("mlp", mlp_init, mlp_forward, mlp_backward, x_tr, y_tr,
                          x_ev, y_ev, mlp_rng, args.mlp_epochs, batch=64, lr=1e-3)

    export_cnn(cnn, out("cnn.onnx"))
    export_mlp(mlp, out("mlp.onnx"))

    metrics = {"seed": args.seed, "train": len(x_tr), "eval": len(x_ev), "calib": N_CALIB,
               "eval_class_counts": np.bincount(y_ev, minlength=N_CLASSES).tolist()}
    for name, forward, p, xe, secs, epochs in (
        ("cnn", cnn_forward, cnn, img(x_ev), cnn_time, args.cnn_epochs),
        ("mlp", mlp_forward, mlp, x_ev, mlp_time, args.mlp_epochs),
    ):
        np_logits = predict(forward, p, xe)
        ort_out = ort_logits(out(f"{name}.onnx"), xe)
        np_acc = float((np_logits.argmax(1) == y_ev).mean())
        ort_acc = float((ort_out.argmax(1) == y_ev).mean())
        disagree = int((np_logits.argmax(1) != ort_out.argmax(1)).sum())
        max_diff = float(np.abs(np_logits - ort_out).max())
        print(f"{name}: numpy acc {np_acc:.4f}, onnxruntime acc {ort_acc:.4f}, "
              f"{disagree} predictions differ, max |logit diff| {max_diff:.2e}", file=sys.stderr)
        # The gate compares quantized accuracy against the float model's as ORT
        # runs it, so the exported graph must be the model that was trained.
        if ort_acc != np_acc or max_diff > 1e-3:
            sys.exit(f"{name}: the ONNX model does not reproduce the numpy model")
        metrics[name] = {"accuracy": np_acc, "onnxruntime_accuracy": ort_acc,
                         "max_abs_logit_diff": max_diff, "epochs": epochs,
                         "train_seconds": round(secs, 2)}

    files = ["cnn.onnx", "mlp.onnx", "calib_cnn.npz", "eval_cnn.npz", "calib_mlp.npz", "eval_mlp.npz"]
    metrics["sha256"] = {f: sha256(out(f)) for f in files}
    metrics["total_seconds"] = round(time.perf_counter() - t_start, 2)
    with open(out("metrics.json.tmp"), "w") as f:
        json.dump(metrics, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(out("metrics.json.tmp"), out("metrics.json"))
    print(json.dumps({k: metrics[k] for k in ("cnn", "mlp")}), file=sys.stderr)


if __name__ == "__main__":
    main()
