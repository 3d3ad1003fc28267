#!/usr/bin/env bash
# Installs cargo-deny (the dependency graph's licence, ban and duplicate
# checks; deny.toml) into the deps dir, and prints the binary's path on its
# last line.
#
#   scripts/cargo-deny.sh
#
# Binary: ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/cargo-deny/bin/cargo-deny,
#         cargo-deny 0.20.2 from crates.io with its Cargo.lock (`cargo install
#         --locked`: the versions its authors tested). Idempotent: nothing is
#         built when that version is there (a cold build is a few minutes).
set -euo pipefail

version=0.20.2
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
root="$deps/cargo-deny"
bin="$root/bin/cargo-deny"

if ! { [ -x "$bin" ] && [ "$("$bin" --version 2>/dev/null)" = "cargo-deny $version" ]; }; then
  echo "==> installing cargo-deny $version into $root (cargo install, a few minutes)" >&2
  cargo install "cargo-deny@$version" --locked --root "$root" >&2
fi
echo "$bin"
