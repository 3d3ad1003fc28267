#!/bin/sh
# Installs the Edgeloop offline bundle this script sits in, with nothing
# fetched: checks every file against SHA256SUMS, then copies the binaries and
# the ONNX Runtime library under PREFIX (default /opt/edgeloop), keeping
# bin/ and lib/edgeloop/ side by side so each binary finds the library by
# itself (no ORT_DYLIB_PATH, no deps dir).
#
#   ./install.sh [PREFIX]
#   ./install.sh --check          only verify the bundle
set -eu

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
if ! sha256sum --quiet -c SHA256SUMS; then
    echo "install.sh: the bundle is damaged (SHA256SUMS does not match); fetch it again" >&2
    exit 1
fi
[ "${1:-}" = --check ] && { echo "install.sh: the bundle is intact"; exit 0; }
prefix="${1:-/opt/edgeloop}"
case "$prefix" in
    /*) ;;
    *) echo "install.sh: PREFIX must be an absolute path, not $prefix" >&2; exit 2 ;;
esac
mkdir -p "$prefix/bin" "$prefix/lib/edgeloop" "$prefix/share/edgeloop"
for f in bin/* lib/edgeloop/* share/edgeloop/*; do
    # Beside the old file, then renamed: a running binary keeps its inode.
    cp -p "$f" "$prefix/$f.new"
    mv -f "$prefix/$f.new" "$prefix/$f"
done
echo "install.sh: installed under $prefix:"
echo "  $prefix/bin/{edgeloop,control-plane,edge-agent,trainer-bridge}"
echo "  systemd units and configuration templates: $prefix/share/edgeloop/"
echo "  (the units name /usr/bin: point ExecStart at $prefix/bin, or use the .deb packages)"
