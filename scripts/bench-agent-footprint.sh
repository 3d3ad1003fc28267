#!/usr/bin/env bash
# The edge agent's footprint, as shipped: the stripped binary's size (ONNX
# Runtime's library excluded; it is loaded at run time) and the resident
# memory of an idle agent with no model, for the `dist` profile the
# packages are built with (LTO, one codegen unit) against the plain
# `release` profile, measured in the same run. Goals: under 10 MB each.
# The agent runs against a control plane that is not there, so it sits in
# its reconnect backoff, the idle state of a device that is offline. The
# idle RSS is mostly the binary's own pages (the kernel maps code around
# every page it touches), so a smaller binary is a smaller process.
#
#   scripts/bench-agent-footprint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
pid=
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT

# `measure PROFILE`: "<bytes> <rss kB>" of the stripped agent of PROFILE,
# idle, the median RSS of three starts.
measure() {
  local profile="$1" dir rss=()
  dir="$( [ "$profile" = release ] && echo release || echo "$profile")"
  cargo build --profile "$profile" -p edgeloop-edge-agent --bin edge-agent >&2
  strip -o "$work/edge-agent-$profile" "target/$dir/edge-agent"
  for _ in 1 2 3; do
    rm -rf "$work/data"
    "$work/edge-agent-$profile" run --data-dir "$work/data" --control-plane https://127.0.0.1:9 \
      --bootstrap-token "elb1.$(printf '0%.0s' $(seq 16)).$(printf '0%.0s' $(seq 64)).$(printf '0%.0s' $(seq 64))" \
      --allow-unsigned true \
      --inference-listen 127.0.0.1:0 --grpc-inference-listen 127.0.0.1:0 >"$work/log" 2>&1 &
    pid=$!
    sleep 3
    kill -0 "$pid" 2>/dev/null || { echo "the agent exited:" >&2; cat "$work/log" >&2; exit 1; }
    rss+=("$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")")
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
  done
  echo "$(stat -c %s "$work/edge-agent-$profile") $(printf '%s\n' "${rss[@]}" | sort -n | sed -n 2p)"
}

read -r base_size base_rss < <(measure release)
read -r dist_size dist_rss < <(measure dist)
awk -v bs="$base_size" -v br="$base_rss" -v ds="$dist_size" -v dr="$dist_rss" 'BEGIN {
  printf "| | release (baseline) | dist (shipped) | dist / release | goal |\n|---|---|---|---|---|\n"
  printf "| stripped binary | %.1f MB | %.1f MB | %.2f | < 10 MB (%.2f of it) |\n", bs / 1e6, ds / 1e6, ds / bs, ds / 10e6
  printf "| idle RSS, no model | %.1f MB | %.1f MB | %.2f | < 10 MB (%.2f of it) |\n", br * 1024 / 1e6, dr * 1024 / 1e6, dr / br, dr * 1024 / 10e6
}'
