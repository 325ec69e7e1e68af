#!/usr/bin/env bash
# Makes (or keeps) a venv holding exactly the pinned PyPI packages a test suite drives:
#
#   venv.sh VENV_DIR NAME PIN...
#
# Idempotent: skipped when VENV_DIR's stamp holds the same pins. Prints the line that exports
# NAME (the venv's python) for the tests. Nothing here is written into the repository.
set -euo pipefail

[[ $# -ge 3 ]] || { echo "usage: $0 VENV_DIR NAME PIN..." >&2; exit 2; }
dir=$1 name=$2
shift 2
stamp="$dir/.conch-pins"
want="$*"
if [[ -x "$dir/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "venv.sh: $dir is already set up"
  exit 0
fi
echo "venv.sh: making $dir"
rm -f "$stamp"
[[ -x "$dir/bin/python" ]] || "${PYTHON:-python3}" -m venv "$dir"
"$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
echo "$want" > "$stamp"
echo "export $name=$dir/bin/python"
