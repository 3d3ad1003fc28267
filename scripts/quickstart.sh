#!/usr/bin/env bash
# Quick start: build, start the control plane on embedded defaults (sled,
# local artifact store, its own CA), enroll a local edge agent, and show it
# online. Idempotent: a second run reuses the data dir and the agent's
# identity. Ctrl-C stops both.
#
#   scripts/quickstart.sh           run until Ctrl-C
#   scripts/quickstart.sh --check   exit 0 once the agent is listed online (CI)
set -euo pipefail
cd "$(dirname "$0")/.."

home="${EDGELOOP_HOME:-$PWD/.edgeloop}"
grpc="${EDGELOOP_GRPC_LISTEN:-127.0.0.1:7443}"
http="${EDGELOOP_HTTP_LISTEN:-127.0.0.1:7080}"
check=false
[ "${1:-}" = "--check" ] && check=true

echo "==> building (cargo build --bins)"
cargo build --quiet --bins
bin="$PWD/target/debug"

mkdir -p "$home"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "==> starting control plane (data: $home/control-plane, gRPC $grpc, HTTP $http)"
"$bin/control-plane" serve --data-dir "$home/control-plane" --grpc-listen "$grpc" --http-listen "$http" \
  >>"$home/control-plane.log" 2>&1 &
pids+=($!)

for _ in $(seq 1 100); do
  curl -fsS "http://$http/readyz" >/dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2>/dev/null || { echo "control plane exited; see $home/control-plane.log" >&2; tail -5 "$home/control-plane.log" >&2; exit 1; }
  sleep 0.1
done
admin="$(cat "$home/control-plane/admin.token")"
api() { curl -fsS -H "Authorization: Bearer $admin" -H 'content-type: application/json' "$@"; }

# No models are assigned by the quick start, so no signing key is set up yet.
agent_args=(run --data-dir "$home/agent" --control-plane "https://localhost:${grpc##*:}" --allow-unsigned true)
if [ ! -f "$home/agent/identity/identity.json" ]; then
  echo "==> creating a bootstrap token for device 'local-agent'"
  token="$(api -X POST "http://$http/api/v1/tokens" -d '{"kind":"device","name":"local-agent"}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')"
  agent_args+=(--bootstrap-token "$token")
fi

echo "==> starting edge agent (data: $home/agent)"
"$bin/edge-agent" "${agent_args[@]}" >>"$home/agent.log" 2>&1 &
pids+=($!)

online=false
for _ in $(seq 1 150); do
  if api "http://$http/api/v1/devices/local-agent" 2>/dev/null | grep -q '"status":"online"'; then online=true; break; fi
  sleep 0.2
done
$online || { echo "agent did not come online; see $home/agent.log" >&2; tail -5 "$home/agent.log" >&2; exit 1; }

echo "==> devices:"
api "http://$http/api/v1/devices" | python3 -c '
import json, sys
for d in json.load(sys.stdin):
    print("  %-16s %-8s last seen %s" % (d["id"], d["status"], d["last_seen"]))'
cat <<MSG

Console API:  http://$http/api/v1   (OpenAPI: http://$http/api/v1/openapi.json)
Admin token:  $home/control-plane/admin.token
Logs:         $home/control-plane.log, $home/agent.log
MSG
$check && exit 0
echo "Running; Ctrl-C to stop."
wait "${pids[0]}"
