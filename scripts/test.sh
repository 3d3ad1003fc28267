#!/usr/bin/env bash
# The whole test suite: what CI runs (.ci/run calls this). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> rustfmt"
cargo fmt --all -- --check

echo "==> no OpenSSL, no aws-lc in the dependency graph"
for crate in openssl-sys aws-lc-sys aws-lc-rs; do
  if cargo tree --workspace -i "$crate" >/dev/null 2>&1; then
    echo "error: $crate is in the dependency graph:" >&2
    cargo tree --workspace -i "$crate" >&2
    exit 1
  fi
done

echo "==> build"
cargo build --workspace --all-targets

echo "==> clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings

echo "==> tests"
cargo test --workspace

echo "==> quick start smoke run"
smoke="$(mktemp -d)"
trap 'rm -rf "$smoke"' EXIT
EDGELOOP_HOME="$smoke" EDGELOOP_GRPC_LISTEN=127.0.0.1:17443 EDGELOOP_HTTP_LISTEN=127.0.0.1:17080 \
  scripts/quickstart.sh --check
