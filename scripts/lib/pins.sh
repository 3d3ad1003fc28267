# Sourced by the fetch scripts: `verify_pinned FILE...` checks each file's
# sha256 against the one scripts/pins.sha256 names for its file name, and
# fails naming the file when it is not listed or does not match. Nothing a
# fetch script downloads is extracted, installed or loaded before this.
pins_file="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/pins.sha256"

verify_pinned() {
  local f
  for f in "$@"; do
    verify_pinned_as "$(basename "$f")" "$f" || return 1
  done
}

# `verify_pinned_as NAME FILE`: FILE must have the sha256 pinned for NAME
# (for installed files whose names two builds share).
verify_pinned_as() {
  local name="$1" f="$2" want got
  want="$(awk -v n="$name" '$1 !~ /^#/ && $2 == n { print $1 }' "$pins_file")"
  if [ -z "$want" ]; then
    echo "$(basename "$0"): $name has no pinned sha256 in scripts/pins.sha256; refusing it (pin it once you have checked where it came from)" >&2
    return 1
  fi
  got="$(sha256sum "$f" | cut -d' ' -f1)"
  if [ "$got" != "$want" ]; then
    echo "$(basename "$0"): $name has sha256 $got, but scripts/pins.sha256 pins $want; refusing it" >&2
    return 1
  fi
}
