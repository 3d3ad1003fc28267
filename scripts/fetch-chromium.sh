#!/usr/bin/env bash
# Debian's `chromium` and `chromium-driver` for the web console's browser
# tests (tests/it/console.rs), installed with apt-get only when missing.
# Idempotent. The tests find /usr/bin/chromium and /usr/bin/chromedriver
# (tests/src/browser.rs) and say they skipped without them.
set -euo pipefail

log() { echo "fetch-chromium: $*" >&2; }

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
log "installing Debian's chromium and chromium-driver"
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi
/usr/bin/chromium --version >&2
