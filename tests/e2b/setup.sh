#!/usr/bin/env bash
# Make the venv tests/cli/e2b.rs drives `conch e2b` from, outside the repository:
#
#   setup.sh VENV_DIR
#
# VENV_DIR gets the `e2b` SDK pinned below from PyPI (the test's CONCH_E2B_PYTHON is
# VENV_DIR/bin/python). Idempotent: skipped when the venv holds the same pin. Nothing here
# is written into the repository.
set -euo pipefail

E2B_VERSION=2.63.0

[[ $# -eq 1 ]] || { echo "usage: $0 VENV_DIR" >&2; exit 2; }
dir=$1
stamp="$dir/.conch-e2b-pin"
want="e2b==$E2B_VERSION"
if [[ -x "$dir/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "setup.sh: $dir is already set up"
  exit 0
fi
echo "setup.sh: making $dir"
rm -f "$stamp"
[[ -x "$dir/bin/python" ]] || "${PYTHON:-python3}" -m venv "$dir"
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$want"
echo "$want" > "$stamp"
echo "export CONCH_E2B_PYTHON=$dir/bin/python"
