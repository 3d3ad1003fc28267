#!/usr/bin/env bash
# The edge agent's footprint: the stripped release binary's size (ONNX
# Runtime's library excluded; it is loaded at run time) and the resident
# memory of an idle agent with no model, against the goals of 15 MB and
# 30 MB. The agent runs against a control plane that is not there, so it
# sits in its reconnect backoff, the idle state of a device that is offline.
#
#   scripts/bench-agent-footprint.sh
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release -p edgeloop-edge-agent --bin edge-agent >&2
work="$(mktemp -d)"
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
strip -o "$work/edge-agent" target/release/edge-agent
size=$(stat -c %s "$work/edge-agent")

"$work/edge-agent" run --data-dir "$work/data" --control-plane https://127.0.0.1:9 \
  --bootstrap-token "elb1.$(printf '0%.0s' $(seq 16)).$(printf '0%.0s' $(seq 64)).$(printf '0%.0s' $(seq 64))" \
  --allow-unsigned true \
  --inference-listen 127.0.0.1:0 --grpc-inference-listen 127.0.0.1:0 >"$work/log" 2>&1 &
pid=$!
sleep 3
kill -0 "$pid" 2>/dev/null || { echo "the agent exited:" >&2; cat "$work/log" >&2; exit 1; }
rss_kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")

awk -v s="$size" -v r="$rss_kb" 'BEGIN {
  printf "stripped binary: %.1f MB (goal < 15 MB: %.2f of the goal)\n", s / 1e6, s / 15e6
  printf "idle RSS, no model: %.1f MB (goal < 30 MB: %.2f of the goal)\n", r * 1024 / 1e6, r * 1024 / 30e6
}'
