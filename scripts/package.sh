#!/usr/bin/env bash
# Builds what an operator installs, into dist/:
#
#   scripts/package.sh [debs] [image] [bundle]     (all three by default)
#
# The tests package the suite's debug build (--profile dev --no-build),
# which is quicker than a `dist` build with its whole-program optimisation.
#
#   edgeloop-agent_<version>_amd64.deb          edge-agent, its unit, /etc/edgeloop/agent.toml,
#                                               the ONNX Runtime CPU library
#   edgeloop-bridge_<version>_amd64.deb         trainer-bridge, its unit, /etc/edgeloop/bridge.toml
#   edgeloop-control-plane_<version>_amd64.deb  control-plane and the edgeloop CLI, its unit,
#                                               /etc/edgeloop/control-plane.toml, the library
#   edgeloop-control-plane-<version>.oci.tar    an OCI image archive of the control plane
#                                               (Buildah, from scratch, no daemon, non-root)
#   edgeloop-offline-<version>-x86_64.tar.gz    the offline bundle: the four binaries, the
#                                               library beside them, SHA256SUMS, install.sh
#
# Options (or their environment variables):
#   --profile dist|release|dev  EDGELOOP_PACKAGE_PROFILE  cargo profile (dist: release with
#                                                      LTO, smaller binaries; Cargo.toml)
#   --version V             EDGELOOP_PACKAGE_VERSION   package version (the workspace's)
#   --out DIR               EDGELOOP_PACKAGE_OUT       where the files go (dist/)
#   --fast                  EDGELOOP_PACKAGE_FAST=1    gzip -1 instead of xz (tests)
#   --no-build              EDGELOOP_PACKAGE_NO_BUILD=1  package the binaries already in
#                                                      target/ (the suite built them)
#   --split SIZE                                       also write the bundle as numbered
#                                                      parts of SIZE (split's units: 100M)
#                                                      with a manifest, for links that limit
#                                                      a transfer's size
#
# Idempotent: the binaries are built by cargo (nothing to do when current),
# the ONNX Runtime library comes from scripts/fetch-onnxruntime.sh (nothing
# fetched when it is there), and each file in dist/ is replaced whole
# (written beside it, then renamed). Needs dpkg-deb and dpkg-shlibdeps
# (Debian's dpkg, dpkg-dev) and, for the image, buildah.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
profile="${EDGELOOP_PACKAGE_PROFILE:-dist}"
version="${EDGELOOP_PACKAGE_VERSION:-}"
out="${EDGELOOP_PACKAGE_OUT:-$repo/dist}"
fast="${EDGELOOP_PACKAGE_FAST:-}"
no_build="${EDGELOOP_PACKAGE_NO_BUILD:-}"
split_size=""
what=()
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) profile="$2"; shift 2 ;;
        --version) version="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --fast) fast=1; shift ;;
        --no-build) no_build=1; shift ;;
        --split) split_size="$2"; shift 2 ;;
        debs|image|bundle) what+=("$1"); shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "package.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ ${#what[@]} -gt 0 ] || what=(debs image bundle)
case "$profile" in
    dist|release) target_dir="$repo/target/$profile" ;;
    dev|debug) profile=dev; target_dir="$repo/target/debug" ;;
    *) echo "package.sh: --profile must be dist, release or dev, not $profile" >&2; exit 2 ;;
esac
if [ -z "$version" ]; then
    version="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml")"
fi
# Debian's version syntax (upstream part): digits first, then [A-Za-z0-9.+~-].
if ! [[ "$version" =~ ^[0-9][A-Za-z0-9.+~-]*$ ]]; then
    echo "package.sh: version $version is not a Debian version" >&2
    exit 2
fi
arch=amd64
[ "$(uname -m)" = x86_64 ] || { echo "package.sh: builds amd64 packages on x86_64 only" >&2; exit 2; }

say() { echo "package.sh: $*" >&2; }

# The binaries, and the library every ONNX Runtime user loads.
if [ -z "$no_build" ]; then
    say "building the binaries ($profile)"
    (cd "$repo" && cargo build --profile "$profile" --locked \
        -p edgeloop-edge-agent -p edgeloop-trainer-bridge -p edgeloop-control-plane -p edgeloop-cli --bins)
fi
for bin in edge-agent trainer-bridge control-plane edgeloop; do
    [ -x "$target_dir/$bin" ] || { say "no $target_dir/$bin: build it, or leave out --no-build"; exit 1; }
done
ort_lib="$("$repo/scripts/fetch-onnxruntime.sh" | tail -n 1)"
[ -f "$ort_lib" ] || { say "no ONNX Runtime library at $ort_lib"; exit 1; }
ort_name="$(basename "$ort_lib")"

mkdir -p "$out"
work="$(mktemp -d "$out/.package.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# `publish FILE`: moves a finished FILE from the work dir into dist/ whole.
publish() {
    mv -f "$1" "$out/$(basename "$1")"
    say "wrote $out/$(basename "$1") ($(du -h "$out/$(basename "$1")" | cut -f1))"
}

# `put_bin NAME DEST`: the binary, stripped of its symbols.
put_bin() {
    install -D -m 0755 "$target_dir/$1" "$2"
    strip --strip-unneeded "$2"
}

build_deb() {
    local pkg="$1" user="$2" state="$3" conf="$4" what_it_is="$5" summary="$6" long="$7"
    shift 7
    local root="$work/$pkg" unit="$pkg.service"
    rm -rf "$root"
    mkdir -p "$root/DEBIAN"
    for bin in "$@"; do
        case "$bin" in
            lib:*) install -D -m 0644 "$ort_lib" "$root/usr/lib/${bin#lib:}/$ort_name" ;;
            *) put_bin "$bin" "$root/usr/bin/$bin" ;;
        esac
    done
    install -D -m 0644 "$repo/deploy/debian/$unit" "$root/lib/systemd/system/$unit"
    install -D -m 0644 "$repo/deploy/debian/$conf" "$root/etc/edgeloop/$conf"
    local doc="$root/usr/share/doc/$pkg"
    install -d "$doc"
    {
        echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
        echo "Upstream-Name: edgeloop"
        echo
        echo "Files: *"
        echo "Copyright: 2026 The Edgeloop authors"
        echo "License: Apache-2.0"
        echo
        echo "Files: usr/lib/*/$ort_name"
        echo "Copyright: 2018-2026 Microsoft Corporation"
        echo "License: MIT"
        echo
        echo "License: Apache-2.0"
        echo " On Debian systems the full text is in /usr/share/common-licenses/Apache-2.0."
        echo
        echo "License: MIT"
        echo " Permission is hereby granted, free of charge, to any person obtaining a copy"
        echo " of this software, to deal in it without restriction, subject to the MIT terms."
    } >"$doc/copyright"
    # A native package (no Debian revision): changelog.gz, not changelog.Debian.gz.
    printf '%s (%s) stable; urgency=medium\n\n  * Built from the Edgeloop repository.\n\n -- Edgeloop <packages@edgeloop.dev>  %s\n' \
        "$pkg" "$version" "$(date -R -d @"${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)}")" \
        | gzip -9n >"$doc/changelog.gz"
    # The tags that stay, each with its reason (docs/install.md).
    local overrides="$root/usr/share/lintian/overrides/$pkg"
    install -d "$(dirname "$overrides")"
    : >"$overrides"
    for bin in "$@"; do
        case "$bin" in
            lib:*)
                {
                    echo "# ONNX Runtime $ort_name is upstream's build from the onnxruntime wheel,"
                    echo "# pinned by hash; it links its own curl and mbedtls. Debian has no"
                    echo "# ONNX Runtime with the C API version 31 this code needs."
                    echo "embedded-library curl [usr/lib/${bin#lib:}/$ort_name]"
                    echo "embedded-library mbedtls [usr/lib/${bin#lib:}/$ort_name]"
                } >>"$overrides"
                ;;
            *)
                {
                    echo "# \`$bin --help\` documents every flag, and the configuration file every key."
                    echo "no-manual-page [usr/bin/$bin]"
                } >>"$overrides"
                ;;
        esac
    done
    {
        echo "# $pkg"
        echo
        echo "$summary."
        echo
        echo "Configuration: /etc/edgeloop/$conf (documented in its comments)."
        echo "Service: systemctl enable --now $unit; logs: journalctl -u $unit."
        echo "State: /var/lib/$state (kept on remove and upgrade, deleted on purge)."
    } >"$doc/README.md"
    for script in postinst prerm postrm; do
        sed -e "s|@PKG@|$pkg|g; s|@USER@|$user|g; s|@STATE@|$state|g; s|@UNIT@|$unit|g; \
                s|@CONF@|$conf|g; s|@WHAT@|$what_it_is|g" \
            "$repo/deploy/debian/$script.in" >"$root/DEBIAN/$script"
        chmod 0755 "$root/DEBIAN/$script"
    done
    echo "/etc/edgeloop/$conf" >"$root/DEBIAN/conffiles"
    # The libraries the ELF files need, as Debian packages with versions.
    local elves=()
    while IFS= read -r -d '' f; do elves+=("$f"); done \
        < <(find "$root/usr" -type f \( -perm -u+x -o -name '*.so*' \) -print0)
    mkdir -p "$work/shlibs/debian"
    printf 'Source: edgeloop\n\nPackage: %s\nArchitecture: any\n' "$pkg" >"$work/shlibs/debian/control"
    local depends
    depends="$(cd "$work/shlibs" && dpkg-shlibdeps -O -e"${elves[@]}" 2>/dev/null \
        | sed -n 's/^shlibs:Depends=//p')"
    [ -n "$depends" ] || { say "$pkg: dpkg-shlibdeps found no dependencies"; exit 1; }
    local size
    size="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
    {
        echo "Package: $pkg"
        echo "Version: $version"
        echo "Architecture: $arch"
        echo "Maintainer: Edgeloop <packages@edgeloop.dev>"
        echo "Installed-Size: $size"
        echo "Depends: $depends, passwd"
        echo "Section: net"
        echo "Priority: optional"
        echo "Homepage: https://edgeloop.dev"
        echo "Description: $summary"
        echo "$long" | fold -s -w 72 | sed 's/ *$//; s/^/ /'
    } >"$root/DEBIAN/control"
    (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' \
        | sort -z | xargs -0 md5sum >DEBIAN/md5sums)
    local compress=(-Zxz)
    [ -z "$fast" ] || compress=(-Zgzip -z1)
    local deb="$work/${pkg}_${version}_${arch}.deb"
    dpkg-deb --root-owner-group "${compress[@]}" --build "$root" "$deb" >/dev/null
    publish "$deb"
}

debs() {
    build_deb edgeloop-agent edgeloop-agent edgeloop-agent agent.toml "edge agent" \
        "Edgeloop edge agent: model sync and inference on a device" \
        "Enrolls with the control plane over mTLS, syncs signed models into A/B slots, serves them with ONNX Runtime over the Open Inference Protocol v2 (REST and gRPC), and reports drift sketches and telemetry, buffered while offline. Ships the ONNX Runtime CPU library." \
        edge-agent lib:edgeloop-agent
    build_deb edgeloop-bridge edgeloop-bridge edgeloop-bridge bridge.toml "trainer bridge" \
        "Edgeloop trainer bridge: runs training jobs on a cluster" \
        "Leases training jobs from the control plane and runs them on local processes or containers, Slurm, Ray or Kubernetes, with checkpoints uploaded and resumed after failures and preemptions." \
        trainer-bridge
    build_deb edgeloop-control-plane edgeloop edgeloop control-plane.toml "control plane" \
        "Edgeloop control plane and the edgeloop CLI" \
        "The cloud side of Edgeloop: the console API and console, gRPC for agents and bridges, the model registry with lineage, quantization behind an accuracy gate, staged rollouts, drift analysis and retraining triggers. Embedded store by default; PostgreSQL and S3 for scale-out. Ships the edgeloop CLI and the ONNX Runtime CPU library." \
        control-plane edgeloop lib:edgeloop
}

# The ELF interpreter and shared libraries FILE needs, as absolute paths.
needed_libs() {
    ldd "$1" | awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}'
}

image() {
    command -v buildah >/dev/null || { say "image: buildah is missing (apt-get install buildah)"; exit 1; }
    local root="$work/image-root" name="edgeloop-control-plane" uid=65532
    rm -rf "$root"
    put_bin control-plane "$root/usr/bin/control-plane"
    put_bin edgeloop "$root/usr/bin/edgeloop"
    install -D -m 0644 "$ort_lib" "$root/usr/lib/edgeloop/$ort_name"
    # Only what the binaries load: the C library, libgcc_s and libstdc++
    # (ONNX Runtime), nothing else from the host.
    local lib
    for lib in $( (needed_libs "$target_dir/control-plane"; needed_libs "$ort_lib") | sort -u); do
        # 0755: the kernel runs the ELF interpreter only if it is executable.
        install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
    done
    install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nedgeloop:x:%s:%s:Edgeloop:/var/lib/edgeloop:/sbin/nologin\n' \
        "$uid" "$uid" >"$root/etc/passwd"
    printf 'root:x:0:\nedgeloop:x:%s:\n' "$uid" >"$root/etc/group"
    install -d -m 1777 "$root/tmp"
    install -d -m 0700 "$root/var/lib/edgeloop"
    local ctr
    ctr="$(buildah from scratch)"
    # shellcheck disable=SC2064
    trap "buildah rm '$ctr' >/dev/null 2>&1 || true; rm -rf '$work'" EXIT
    buildah copy --quiet "$ctr" "$root" / >/dev/null
    # The state directory is the service user's: copied from its parent, so
    # the directory itself is an item the ownership applies to.
    buildah copy --quiet --chown "$uid:$uid" "$ctr" "$root/var/lib" /var/lib >/dev/null
    buildah config \
        --user "$uid:$uid" \
        --env ORT_DYLIB_PATH="/usr/lib/edgeloop/$ort_name" \
        --env EDGELOOP_DATA_DIR=/var/lib/edgeloop \
        --workingdir /var/lib/edgeloop \
        --volume /var/lib/edgeloop \
        --port 7443 --port 8080 \
        --entrypoint '["/usr/bin/control-plane"]' \
        --cmd '["serve", "--grpc-listen", "0.0.0.0:7443", "--http-listen", "0.0.0.0:8080"]' \
        --label "org.opencontainers.image.title=$name" \
        --label "org.opencontainers.image.version=$version" \
        --label "org.opencontainers.image.source=https://edgeloop.dev" \
        "$ctr"
    buildah commit --quiet --format oci --rm "$ctr" "localhost/$name:$version" >/dev/null
    local archive="$work/$name-$version.oci.tar"
    buildah push --quiet "localhost/$name:$version" "oci-archive:$archive:$name:$version"
    publish "$archive"
}

bundle() {
    local name="edgeloop-offline-$version-x86_64" root
    root="$work/$name"
    rm -rf "$root"
    for bin in edgeloop control-plane edge-agent trainer-bridge; do
        put_bin "$bin" "$root/bin/$bin"
    done
    # Beside the binaries: each finds it at <its dir>/../lib/edgeloop/.
    install -D -m 0644 "$ort_lib" "$root/lib/edgeloop/$ort_name"
    for f in "$repo"/deploy/debian/*.service "$repo"/deploy/debian/*.toml; do
        install -D -m 0644 "$f" "$root/share/edgeloop/$(basename "$f")"
    done
    install -m 0755 "$repo/deploy/offline/install.sh" "$root/install.sh"
    install -m 0644 "$repo/deploy/offline/README.md" "$root/README.md"
    (cd "$root" && find . -type f ! -name SHA256SUMS -printf '%P\0' | sort -z \
        | xargs -0 sha256sum >SHA256SUMS)
    local archive="$work/$name.tar.gz"
    local level=9
    [ -z "$fast" ] || level=1
    tar -C "$work" --owner=0 --group=0 --numeric-owner --sort=name \
        --mtime="@${SOURCE_DATE_EPOCH:-0}" -cf - "$name" | gzip -"$level" -n >"$archive"
    if [ -n "$split_size" ]; then
        local parts="$work/$name.parts"
        mkdir -p "$parts"
        split -b "$split_size" -d -a 3 "$archive" "$parts/$name.tar.gz.part-"
        # Check the parts, join them in order, check the whole:
        #   sha256sum -c NAME.parts.sha256 && cat NAME.tar.gz.part-* > NAME.tar.gz
        #   sha256sum -c NAME.tar.gz.sha256
        (cd "$parts" && sha256sum "$name".tar.gz.part-* >"$name.parts.sha256")
        (cd "$work" && sha256sum "$name.tar.gz") >"$parts/$name.tar.gz.sha256"
        rm -rf "$out/$name.parts"
        mv "$parts" "$out/$name.parts"
        say "wrote $out/$name.parts ($(find "$out/$name.parts" -name '*.part-*' | wc -l) parts)"
    fi
    publish "$archive"
}

for w in "${what[@]}"; do
    "$w"
done
