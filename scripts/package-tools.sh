#!/usr/bin/env bash
# Installs, idempotently, what scripts/package.sh and its tests use beyond
# the build: Debian's dpkg-dev (dpkg-shlibdeps), buildah (the image, from
# scratch, without a daemon) and lintian (the packages' check). Nothing is
# done when all three are there.
#
#   scripts/package-tools.sh
set -euo pipefail
need=()
command -v dpkg-shlibdeps >/dev/null 2>&1 || need+=(dpkg-dev)
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v lintian >/dev/null 2>&1 || need+=(lintian)
if [ ${#need[@]} -gt 0 ]; then
  echo "package-tools: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
