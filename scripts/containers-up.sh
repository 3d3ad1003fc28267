#!/usr/bin/env bash
# A container runtime for jobs with an `image` on the local engine, and the
# image the tests run: Podman (Debian's, as root, no daemon) on runc, and
# `localhost/edgeloop-base:bookworm`, a Debian 12 minbase root filesystem
# built here with debootstrap (nothing is pulled from a registry).
#
# Idempotent: installs the Debian packages only when missing, writes the
# runtime's config, and builds the image only when local storage lacks it
# (from a root filesystem tarball kept in the deps dir, made once).
#
#   EDGELOOP_CONTAINERS_DIR  state dir (default /tmp/edgeloop-containers)
#   EDGELOOP_DEPS            deps dir (default ~/.edgeloop/deps)
#
# The last line printed is the path of a sourceable env file with
# EDGELOOP_CONTAINER_RUNTIME, CONTAINERS_CONF, EDGELOOP_TEST_IMAGE and the
# fake GPUs' CDI spec (EDGELOOP_TEST_FAKE_CDI, empty where real GPUs are).
set -euo pipefail

STATE=${EDGELOOP_CONTAINERS_DIR:-/tmp/edgeloop-containers}
DEPS=${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}
IMAGE=localhost/edgeloop-base:bookworm
ROOTFS_TAR=$DEPS/containers/debian-bookworm-minbase.tar
MIRROR=${EDGELOOP_DEBIAN_MIRROR:-http://deb.debian.org/debian}

log() { echo "containers-up: $*" >&2; }

# --- packages ---------------------------------------------------------------
need=()
for bin in podman runc debootstrap; do
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need+=("$bin")
done
# `--init` (signals reach the job's process as they would outside a
# container) needs catatonit.
[ -x /usr/libexec/podman/catatonit ] || need+=(catatonit)
if [ ${#need[@]} -gt 0 ]; then
  log "installing container packages (missing: ${need[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends podman runc catatonit debootstrap >/dev/null
fi

# --- config -----------------------------------------------------------------
# This machine's cgroups are hybrid, which crun refuses: runc. The sandbox
# refuses the rlimits Podman raises by default: limits it allows
# (../shared/notes/engines.md).
mkdir -p "$STATE"
CONF=$STATE/containers.conf
cat >"$CONF" <<EOF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=1000:1000"]

[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$CONF

# --- fake GPUs through CDI ----------------------------------------------------
# The tests pass a job's GPUs the way a GPU node does, through a CDI spec
# naming `nvidia.com/gpu` devices (`nvidia-ctk cdi generate` writes the real
# one, docs/gpu.md). On a machine without NVIDIA devices a spec of fake
# ones stands in: each device node is /dev/null, with a variable naming it.
# Podman 4.3 reads specs only from /etc/cdi and /var/run/cdi (no
# cdi_spec_dirs yet); /var/run is emptied at boot, so the spec is rewritten
# each run. Never written beside real GPUs or a real spec.
FAKE_CDI=/var/run/cdi/edgeloop-fake-gpu.yaml
FAKE_GPUS=4
real_cdi_spec() { # a spec naming NVIDIA GPUs that is not the fake one
  local f
  for f in /etc/cdi/* /var/run/cdi/*; do
    [ -f "$f" ] || continue
    grep -q 'edgeloop-fake-gpu' "$f" && continue
    grep -q 'nvidia.com/gpu' "$f" && return 0
  done
  return 1
}
if [ ! -e /dev/nvidia0 ] && ! real_cdi_spec; then
  mkdir -p /var/run/cdi
  {
    echo '# edgeloop-fake-gpu: written by scripts/containers-up.sh for the tests'
    echo 'cdiVersion: "0.5.0"'
    echo 'kind: "nvidia.com/gpu"'
    echo 'devices:'
    for i in $(seq 0 $((FAKE_GPUS - 1))); do
      echo "  - name: \"$i\""
      echo '    containerEdits:'
      echo '      deviceNodes:'
      echo "        - path: /dev/nvidia$i"
      echo '          hostPath: /dev/null'
      echo "      env: [\"EDGELOOP_FAKE_GPU_$i=injected\"]"
    done
    echo 'containerEdits:'
    echo '  env: ["EDGELOOP_FAKE_CDI=1"]'
  } >"$FAKE_CDI.tmp"
  mv "$FAKE_CDI.tmp" "$FAKE_CDI"
else
  FAKE_CDI=
fi

# --- the test image -----------------------------------------------------------
if ! podman image exists "$IMAGE"; then
  if [ ! -s "$ROOTFS_TAR" ]; then
    log "building a Debian 12 minbase root filesystem (debootstrap, about 30 s)"
    mkdir -p "$(dirname "$ROOTFS_TAR")"
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    debootstrap --variant=minbase bookworm "$root" "$MIRROR" >"$STATE/debootstrap.log" 2>&1 || {
      log "debootstrap failed; see $STATE/debootstrap.log"
      exit 1
    }
    # Package caches and logs are not part of the image.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*
    tar -C "$root" --numeric-owner -cf "$ROOTFS_TAR.tmp" .
    mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
  fi
  log "importing $IMAGE"
  podman import --change 'CMD ["/bin/sh"]' "$ROOTFS_TAR" "$IMAGE" >/dev/null
fi
podman run --rm --init --network host "$IMAGE" true

ENV_FILE=$STATE/env
cat >"$ENV_FILE.tmp" <<EOF
EDGELOOP_CONTAINER_RUNTIME=podman
CONTAINERS_CONF=$CONF
EDGELOOP_TEST_IMAGE=$IMAGE
EDGELOOP_TEST_FAKE_CDI=$FAKE_CDI
EDGELOOP_TEST_FAKE_GPUS=$FAKE_GPUS
EOF
mv "$ENV_FILE.tmp" "$ENV_FILE"
log "podman $(podman version --format '{{.Client.Version}}') on runc; image $IMAGE"
echo "$ENV_FILE"
