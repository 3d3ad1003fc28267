#!/usr/bin/env bash
# Stops the Ray head started by scripts/ray-up.sh and removes its env file.
# Safe when nothing runs and when Ray was never installed.
#
#   scripts/ray-down.sh
#
# `ray stop` stops every Ray process of this user on the machine (see
# ray-up.sh). The state dir ${EDGELOOP_RAY_DIR:-/tmp/edgeloop-ray} keeps its
# logs for inspection; ray-up.sh copes with what is left there.
set -euo pipefail

deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
venv="$deps/ray-venv"
state="${EDGELOOP_RAY_DIR:-/tmp/edgeloop-ray}"

rm -f "$state/env"

if [ ! -x "$venv/bin/ray" ]; then
  echo "==> Ray is not installed ($venv); nothing to stop" >&2
  exit 0
fi

echo "==> stopping Ray" >&2
# --force only after a plain stop did not finish in time.
if ! "$venv/bin/ray" stop --grace-period 10 >&2; then
  "$venv/bin/ray" stop --force >&2 || true
fi
echo "==> Ray stopped" >&2
