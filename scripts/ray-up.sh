#!/usr/bin/env bash
# Installs Ray into a venv and starts a single-node Ray head on 127.0.0.1 for
# the trainer bridge's Ray engine and its tests (trainer-bridge/tests/ray.rs).
#
#   scripts/ray-up.sh          # start (or find running) and print the env file
#   scripts/ray-down.sh        # stop it
#
# Venv:  ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/ray-venv, with ray[default]
#        pinned exactly (pip is skipped when the marker records the same
#        requirement; the marker is written only after a successful install).
# State: ${EDGELOOP_RAY_DIR:-/tmp/edgeloop-ray}: Ray's --temp-dir, TMPDIR for
#        the Ray processes (their socket dirs stay here), the start log, and
#        `env`, which holds EDGELOOP_RAY_DASHBOARD_URL=http://127.0.0.1:PORT.
#        The path of `env` is printed on the last line.
#
# Ports (override with the env vars): GCS ${EDGELOOP_RAY_PORT:-6390} (it must
# lie outside Ray's worker port range 10002-19999), dashboard / Jobs REST API
# ${EDGELOOP_RAY_DASHBOARD_PORT:-8265}.
#
# Idempotent: when the dashboard already answers GET /api/jobs/, nothing is
# started. Stale state (Ray processes that died with an earlier session, a
# half-started head) is cleared with `ray stop --force` before a new start.
# Note that `ray stop` stops every Ray process of this user on the machine,
# not only ours: this is a test head for a dev machine, not a shared cluster.
#
# Measured facts this relies on are in ../shared/notes/engines.md:
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray on loopback (otherwise it
# swaps 127.0.0.1 for eth0's address), RAY_JOB_START_TIMEOUT_SECONDS=20 lets a
# job that waits for resources be stopped, --num-gpus=2 gives two fake GPUs
# whose jobs still get CUDA_VISIBLE_DEVICES.
set -euo pipefail

# ray[default]==2.60.0 and everything it needs, hash-locked:
# scripts/requirements/ray.in and ray.txt.

deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
venv="$deps/ray-venv"
state="${EDGELOOP_RAY_DIR:-/tmp/edgeloop-ray}"
gcs_port="${EDGELOOP_RAY_PORT:-6390}"
dash_port="${EDGELOOP_RAY_DASHBOARD_PORT:-8265}"
url="http://127.0.0.1:$dash_port"
env_file="$state/env"

if [ "$gcs_port" -ge 10002 ] && [ "$gcs_port" -le 19999 ]; then
  echo "ray-up.sh: EDGELOOP_RAY_PORT=$gcs_port lies in Ray's worker port range 10002-19999" >&2
  exit 1
fi

answers() {
  curl -fsS --max-time 3 -o /dev/null "$url/api/jobs/" 2>/dev/null
}

write_env() {
  mkdir -p "$state"
  printf 'EDGELOOP_RAY_DASHBOARD_URL=%s\n' "$url" >"$env_file.tmp"
  mv "$env_file.tmp" "$env_file"
}

# --- venv --------------------------------------------------------------------
# shellcheck source=lib/venv.sh
. "$(dirname "$0")/lib/venv.sh"
venv_install "$venv" ray ray ray.dashboard

# --- head --------------------------------------------------------------------
if answers; then
  echo "==> Ray head already answers at $url" >&2
  write_env
  echo "$env_file"
  exit 0
fi

mkdir -p "$state/tmp" "$state/ray"
rm -f "$env_file"

# Whatever is left from an earlier session (dead head, stray raylets, a
# dashboard that never came up) is stopped first, so the ports are free.
if pgrep -u "$(id -u)" -f 'gcs_server|raylet|ray/dashboard' >/dev/null 2>&1; then
  echo "==> stopping stale Ray processes" >&2
  "$venv/bin/ray" stop --force >&2 || true
fi

for p in "$gcs_port" "$dash_port"; do
  if ss -ltnH "sport = :$p" 2>/dev/null | grep -q .; then
    echo "ray-up.sh: port $p is taken by another process; set EDGELOOP_RAY_PORT / EDGELOOP_RAY_DASHBOARD_PORT" >&2
    exit 1
  fi
done

echo "==> starting the Ray head (GCS 127.0.0.1:$gcs_port, dashboard $url)" >&2
start=$(date +%s)
if ! env \
  TMPDIR="$state/tmp" \
  RAY_USAGE_STATS_ENABLED=0 \
  RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 \
  RAY_JOB_START_TIMEOUT_SECONDS=20 \
  "$venv/bin/ray" start --head \
    --node-ip-address=127.0.0.1 \
    --port="$gcs_port" \
    --dashboard-host=127.0.0.1 \
    --dashboard-port="$dash_port" \
    --include-dashboard=true \
    --num-cpus=2 \
    --num-gpus=2 \
    --object-store-memory=200000000 \
    --disable-usage-stats \
    --temp-dir="$state/ray" \
    >"$state/start.log" 2>&1; then
  cat "$state/start.log" >&2
  echo "ray-up.sh: ray start failed (log: $state/start.log)" >&2
  exit 1
fi

# The Jobs API comes up a little after `ray start` returns.
deadline=$(( $(date +%s) + 60 ))
until answers; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "ray-up.sh: $url/api/jobs/ did not answer within 60 s (log: $state/start.log, $state/ray/session_latest/logs)" >&2
    exit 1
  fi
  sleep 0.5
done
echo "==> Ray head up in $(( $(date +%s) - start )) s" >&2

write_env
echo "$env_file"
