#!/usr/bin/env bash
# The venv tests/cli/engine.rs drives mini-swe-agent from (its CONCH_MINISWE_PYTHON):
#
#   setup.sh VENV_DIR
#
# mini-swe-agent and swe-rex, pinned here, from PyPI, outside the repository.
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 VENV_DIR" >&2; exit 2; }
exec bash "$(dirname "$0")/../venv.sh" "$1" CONCH_MINISWE_PYTHON \
  mini-swe-agent==2.4.6 swe-rex==1.4.0
