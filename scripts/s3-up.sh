#!/usr/bin/env bash
# Installs s3s-fs (an S3-compatible server over a directory) and starts it on
# 127.0.0.1 for the S3 artifact store's tests (control-plane
# registry/artifacts/tests.rs, tests/it/s3_artifacts.rs).
#
#   scripts/s3-up.sh           # start (or find running) and print the env file
#   scripts/s3-down.sh         # stop it
#
# Binary: ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/s3s/bin/s3s-fs, s3s-fs 0.14.1
#         from crates.io with its Cargo.lock (`cargo install --locked`; newer
#         releases need a newer rustc). Skipped when that version is there.
# State:  ${EDGELOOP_S3_DIR:-/tmp/edgeloop-s3}: data/ (one directory per
#         bucket; emptied whenever a server is started), the server's log and pid, and `env`, whose path is printed
#         on the last line: AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
#         AWS_SECRET_ACCESS_KEY, AWS_ALLOW_HTTP=true and
#         EDGELOOP_TEST_S3_URL=s3://edgeloop-test/artifacts. scripts/test.sh
#         exports them; tests put each case under a prefix of its own.
#
# Port: ${EDGELOOP_S3_PORT:-9014}. The keys are fixed test keys: the server
# listens on loopback only, and a wrong secret gets 403.
#
# Idempotent: when our server (its pid file) still answers on the port,
# nothing is started. s3s-fs implements multipart uploads (create, upload
# part, complete, abort, list parts), ranged GETs, ListObjectsV2, DeleteObject
# and CopyObject: everything the artifact store uses.
set -euo pipefail

version=0.14.1
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
root="$deps/s3s"
bin="$root/bin/s3s-fs"
state="${EDGELOOP_S3_DIR:-/tmp/edgeloop-s3}"
port="${EDGELOOP_S3_PORT:-9014}"
bucket=edgeloop-test
access_key=edgeloop-test
secret_key=edgeloop-test-secret
env_file="$state/env"
pid_file="$state/s3s-fs.pid"
endpoint="http://127.0.0.1:$port"

write_env() {
  cat >"$env_file.tmp" <<ENV
AWS_ENDPOINT_URL=$endpoint
AWS_REGION=us-east-1
AWS_ACCESS_KEY_ID=$access_key
AWS_SECRET_ACCESS_KEY=$secret_key
AWS_ALLOW_HTTP=true
EDGELOOP_TEST_S3_URL=s3://$bucket/artifacts
ENV
  mv "$env_file.tmp" "$env_file"
}

# Any HTTP answer at all (an unsigned request gets 403) means it is up.
answers() {
  local code
  code="$(curl -s --max-time 3 -o /dev/null -w '%{http_code}' "$endpoint/" 2>/dev/null || true)"
  [ -n "$code" ] && [ "$code" != "000" ]
}

ours_running() {
  [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null
}

# --- binary ------------------------------------------------------------------
if [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null)" = "s3s-fs $version" ]; then
  :
else
  echo "==> installing s3s-fs $version into $root (cargo install, a few minutes)" >&2
  cargo install "s3s-fs@$version" --locked --features binary --root "$root" >&2
fi

# --- server ------------------------------------------------------------------
if ours_running && answers; then
  echo "==> s3s-fs already answers at $endpoint" >&2
  write_env
  echo "$env_file"
  exit 0
fi

rm -f "$env_file"
if ours_running; then
  # Ours, but not answering: stop it and start again.
  kill "$(cat "$pid_file")" 2>/dev/null || true
  sleep 1
fi
if ss -ltnH "sport = :$port" 2>/dev/null | grep -q .; then
  echo "s3-up.sh: port $port is taken by another process; set EDGELOOP_S3_PORT" >&2
  exit 1
fi

# Test data only: a new server starts empty (tests leave their prefixes).
rm -rf "$state/data"
mkdir -p "$state/data/$bucket"
echo "==> starting s3s-fs on $endpoint (data in $state/data)" >&2
setsid "$bin" --host 127.0.0.1 --port "$port" \
  --access-key "$access_key" --secret-key "$secret_key" \
  "$state/data" >"$state/s3s-fs.log" 2>&1 </dev/null &
echo $! >"$pid_file"

deadline=$(( $(date +%s) + 30 ))
until answers; do
  if ! ours_running; then
    cat "$state/s3s-fs.log" >&2
    echo "s3-up.sh: s3s-fs exited (log: $state/s3s-fs.log)" >&2
    exit 1
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "s3-up.sh: $endpoint did not answer within 30 s (log: $state/s3s-fs.log)" >&2
    exit 1
  fi
  sleep 0.2
done
echo "==> s3s-fs up" >&2

write_env
echo "$env_file"
