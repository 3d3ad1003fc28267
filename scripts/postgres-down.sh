#!/usr/bin/env bash
# Stops the PostgreSQL server started by scripts/postgres-up.sh and removes
# its env file. Safe when nothing runs and when it was never started.
#
#   scripts/postgres-down.sh
#
# The cluster in ${EDGELOOP_PG_DIR:-/tmp/edgeloop-pg}/data stays (the test
# databases are dropped by the tests that made them); postgres-up.sh starts
# it again.
set -euo pipefail

state="${EDGELOOP_PG_DIR:-/tmp/edgeloop-pg}"
bin=/usr/lib/postgresql/15/bin
data="$state/data"

rm -f "$state/env"

if [ ! -x "$bin/pg_ctl" ] || [ ! -s "$data/PG_VERSION" ]; then
  echo "postgres-down: no cluster in $data; nothing to stop" >&2
  exit 0
fi
if [ ! -s "$data/postmaster.pid" ]; then
  echo "postgres-down: not running" >&2
  exit 0
fi
echo "postgres-down: stopping" >&2
runuser -u postgres -- "$bin/pg_ctl" -D "$data" -m fast -w -t 60 stop >&2 || true
