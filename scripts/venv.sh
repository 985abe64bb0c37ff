#!/usr/bin/env bash
# Builds the project's Python environment in .venv: Debian's Python, every
# package pinned by python/requirements-test.txt (PyTorch, Lightning,
# Transformers, XGBoost, Jupyter, pytest, ... from PyPI), and the
# durabletrain package from ./python (editable). Safe to run again: it does
# nothing when the requirements have not changed since the last build.
#   scripts/venv.sh          build .venv from the lock (requirements-test.txt)
#   scripts/venv.sh --lock   build it from requirements-test.in's names and
#                            versions (constrained by the lock as it stands, so that
#                            adding a name moves no package already pinned), and
#                            write the lock from what was installed
#   scripts/venv.sh [--lock] ray
#                            the same for .venv-ray, the Ray benchmark's own
#                            environment (bench/ray/requirements.{in,txt}: the
#                            test environment and ray[train,tune], optuna), which
#                            `make test` never builds
set -euo pipefail
cd "$(dirname "$0")/.."
lockflag=
if [ "${1:-}" = "--lock" ]; then lockflag=1; shift; fi
case "${1:-test}" in
  test) venv=.venv; names=python/requirements-test.in; lock=python/requirements-test.txt ;;
  ray)  venv=.venv-ray; names=bench/ray/requirements.in; lock=bench/ray/requirements.txt ;;
  *) echo "venv: unknown environment '$1'; want test or ray" >&2; exit 2 ;;
esac
stamp="$venv/.durabletrain-requirements"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
if [ -n "$lockflag" ]; then
  echo "venv: building $venv from $names, and locking it in $lock" >&2
  /usr/bin/python3 -m venv --clear "$venv"
  constraints=()
  if [ -f "$lock" ]; then
    grep -v '^#' "$lock" > "$venv/.constraints.txt"
    constraints=(-c "$venv/.constraints.txt")
  fi
  "${pip[@]}" -r "$names" "${constraints[@]}"
  { echo "# Every package of $venv, pinned: generated from $(basename "$names") by scripts/venv.sh --lock"
    echo "# (a package's version changes here only through that file)."
    "$venv/bin/python" -m pip freeze --exclude-editable | grep -v '^durabletrain'; } > "$lock.new"
  mv "$lock.new" "$lock"
  rm -f "$stamp"
fi
want="$(cat "$lock" python/pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if [ -z "$lockflag" ]; then
  echo "venv: building $venv (pinned: $lock)" >&2
  /usr/bin/python3 -m venv --clear "$venv"
  "${pip[@]}" -r "$lock"
fi
"${pip[@]}" --no-deps --no-build-isolation -e ./python 2>/dev/null || "${pip[@]}" --no-deps -e ./python
echo "$want" > "$stamp"
