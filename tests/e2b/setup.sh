#!/usr/bin/env bash
# The venv tests/cli/e2b.rs drives `conch e2b` from (its CONCH_E2B_PYTHON):
#
#   setup.sh VENV_DIR
#
# The `e2b` SDK, pinned here, from PyPI, outside the repository.
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 VENV_DIR" >&2; exit 2; }
exec bash "$(dirname "$0")/../venv.sh" "$1" CONCH_E2B_PYTHON e2b==2.63.0
