"""ONNX Runtime's own Python quantizer, as the side-by-side baseline for
Edgeloop's quantizer (models/benches/quantize_vs_ort.rs runs this).

usage: ort_quantize.py static|dynamic MODEL OUT [CALIBRATION.npz [per-call]]

With `per-call`, entry i along axis 0 of every array is one whole call's
input (Edgeloop's per-call layout, models/src/dataset.rs), not a row.

Prints one JSON line: {"quantize_ms": ...}. The time covers quantization
only (imports and interpreter start-up are excluded), so it compares with
the Rust quantizer's time for the same work: calibration plus rewriting.
"""
import json
import sys
import time

import numpy as np
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)


class NpzReader(CalibrationDataReader):
    def __init__(self, path, batch=64, per_call=False):
        data = np.load(path)
        self.names = [k for k in data.files if k != "label"]
        n = len(data[self.names[0]])
        if per_call:
            # np.asarray: a scalar input (silero's `sr`) stays a 0-d array.
            self.batches = [{k: np.asarray(data[k][i]) for k in self.names} for i in range(n)]
        else:
            self.batches = [
                {k: data[k][i : i + batch] for k in self.names} for i in range(0, n, batch)
            ]
        self.i = 0

    def get_next(self):
        if self.i >= len(self.batches):
            return None
        self.i += 1
        return self.batches[self.i - 1]

    def rewind(self):
        self.i = 0


def main():
    mode, model, out = sys.argv[1:4]
    start = time.perf_counter()
    if mode == "static":
        quantize_static(
            model,
            out,
            NpzReader(sys.argv[4], per_call=sys.argv[5:6] == ["per-call"]),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
        )
    elif mode == "dynamic":
        quantize_dynamic(model, out, per_channel=True, weight_type=QuantType.QInt8)
    else:
        raise SystemExit(f"unknown mode {mode}")
    elapsed = (time.perf_counter() - start) * 1000.0
    print(json.dumps({"quantize_ms": elapsed}))


if __name__ == "__main__":
    main()
