#!/usr/bin/env bash
# Builds the project's Python environment in .venv: Debian's Python, every
# package pinned by python/requirements-test.txt (PyTorch, Lightning,
# Transformers, XGBoost, Jupyter, pytest, ... from PyPI), and the
# durabletrain package from ./python (editable). Safe to run again: it does
# nothing when the requirements have not changed since the last build.
#   scripts/venv.sh          build .venv from the lock (requirements-test.txt)
#   scripts/venv.sh --lock   build it from requirements-test.in's names and
#                            versions, and write the lock from what was installed
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv
stamp="$venv/.durabletrain-requirements"
lock=python/requirements-test.txt
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
if [ "${1:-}" = "--lock" ]; then
  echo "venv: building $venv from python/requirements-test.in, and locking it in $lock" >&2
  /usr/bin/python3 -m venv --clear "$venv"
  "${pip[@]}" -r python/requirements-test.in
  { echo "# Every package of .venv, pinned: generated from requirements-test.in by scripts/venv.sh --lock"
    echo "# (a package's version changes here only through that file)."
    "$venv/bin/python" -m pip freeze --exclude-editable | grep -v '^durabletrain'; } > "$lock.new"
  mv "$lock.new" "$lock"
  rm -f "$stamp"
fi
want="$(cat "$lock" python/pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if [ "${1:-}" != "--lock" ]; then
  echo "venv: building $venv (pinned: $lock)" >&2
  /usr/bin/python3 -m venv --clear "$venv"
  "${pip[@]}" -r "$lock"
fi
"${pip[@]}" --no-deps --no-build-isolation -e ./python 2>/dev/null || "${pip[@]}" --no-deps -e ./python
echo "$want" > "$stamp"
