#!/usr/bin/env bash
# Stops the s3s-fs server started by scripts/s3-up.sh (by its pid file only)
# and removes its env file. Safe when nothing runs.
#
#   scripts/s3-down.sh
#
# The state dir ${EDGELOOP_S3_DIR:-/tmp/edgeloop-s3} keeps the data and the
# log for inspection until s3-up.sh next starts a server (with empty data).
set -euo pipefail

state="${EDGELOOP_S3_DIR:-/tmp/edgeloop-s3}"
pid_file="$state/s3s-fs.pid"

rm -f "$state/env"
if [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
  echo "==> stopping s3s-fs" >&2
  kill "$(cat "$pid_file")"
  for _ in $(seq 50); do
    kill -0 "$(cat "$pid_file")" 2>/dev/null || break
    sleep 0.1
  done
else
  echo "==> s3s-fs is not running; nothing to stop" >&2
fi
rm -f "$pid_file"
