#!/usr/bin/env bash
# Make the venv tests/cli/engine.rs drives mini-swe-agent from, outside the repository:
#
#   setup.sh VENV_DIR
#
# VENV_DIR gets mini-swe-agent and swe-rex, pinned below, from PyPI (the test's
# CONCH_MINISWE_PYTHON is VENV_DIR/bin/python). Idempotent: skipped when the venv holds the
# same pins. Nothing here is written into the repository.
set -euo pipefail

MINISWE_VERSION=2.4.6
SWEREX_VERSION=1.4.0

[[ $# -eq 1 ]] || { echo "usage: $0 VENV_DIR" >&2; exit 2; }
dir=$1
stamp="$dir/.conch-engine-pin"
want="mini-swe-agent==$MINISWE_VERSION swe-rex==$SWEREX_VERSION"
if [[ -x "$dir/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "setup.sh: $dir is already set up"
  exit 0
fi
echo "setup.sh: making $dir"
rm -f "$stamp"
[[ -x "$dir/bin/python" ]] || "${PYTHON:-python3}" -m venv "$dir"
# shellcheck disable=SC2086
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check $want
echo "$want" > "$stamp"
echo "export CONCH_MINISWE_PYTHON=$dir/bin/python"
