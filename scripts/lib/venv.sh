# Sourced by the scripts that make Python venvs (python-env.sh,
# python-apitest.sh, python-clients.sh, torch-env.sh, ray-up.sh).
#
#   venv_install VENV NAME [IMPORT...]
#
# Creates VENV with ${PYTHON:-python3} if it is missing and installs
# scripts/requirements/NAME.txt into it with `pip --require-hashes`, wheels
# only: every file pip takes must have the sha256 the lock file names
# (scripts/lock-python.sh writes it from NAME.in). Then imports each IMPORT
# to prove the install. Idempotent: nothing runs when the venv's marker holds
# the lock file's sha256. The marker is written last, so an interrupted
# install is redone in full.
venv_install() {
  local venv="$1" name="$2" python="${PYTHON:-python3}" lock stamp marker module
  shift 2
  lock="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/requirements/$name.txt"
  [ -f "$lock" ] || { echo "$(basename "$0"): no lock file $lock" >&2; return 1; }
  stamp="$(sha256sum "$lock" | cut -d' ' -f1)"
  marker="$venv/.edgeloop-lock"
  if [ -x "$venv/bin/python" ] && [ -f "$marker" ] && [ "$(cat "$marker")" = "$stamp" ]; then
    return 0
  fi
  command -v "$python" >/dev/null || { echo "$(basename "$0"): $python is required" >&2; return 1; }
  mkdir -p "$(dirname "$venv")"
  if [ ! -x "$venv/bin/python" ]; then
    echo "==> creating venv $venv" >&2
    "$python" -m venv "$venv" >&2
  fi
  rm -f "$marker"
  echo "==> installing $name (hash-locked, scripts/requirements/$name.txt)" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --require-hashes --only-binary=:all: -r "$lock" >&2
  for module in "$@"; do
    "$venv/bin/python" -c "import $module" >&2
  done
  printf '%s' "$stamp" >"$marker"
}
