"""Runs an Open Inference Protocol v2 infer request through Python ONNX Runtime.

    python tools/oip_reference.py MODEL.onnx REQUEST.json

Prints {"outputs": [{"name", "shape", "datatype", "data"}]} with every model
output, data flat in row-major order: the reference the edge agent's serving
tests compare their HTTP answers with (same model, same inputs).
"""

import json
import sys

import numpy as np
import onnxruntime as ort

DTYPES = {
    "FP32": np.float32,
    "FP64": np.float64,
    "FP16": np.float16,
    "INT8": np.int8,
    "UINT8": np.uint8,
    "INT32": np.int32,
    "INT64": np.int64,
    "BOOL": np.bool_,
}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}


def main():
    model, request = sys.argv[1], sys.argv[2]
    with open(request) as f:
        body = json.load(f)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feeds = {
        i["name"]: np.array(i["data"], dtype=DTYPES[i["datatype"]]).reshape(i["shape"])
        for i in body["inputs"]
    }
    names = [o.name for o in session.get_outputs()]
    values = session.run(names, feeds)
    outputs = [
        {
            "name": n,
            "shape": list(v.shape),
            "datatype": NAMES[v.dtype],
            "data": v.reshape(-1).tolist(),
        }
        for n, v in zip(names, values)
    ]
    json.dump({"outputs": outputs}, sys.stdout)


if __name__ == "__main__":
    main()
