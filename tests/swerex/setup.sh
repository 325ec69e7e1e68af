#!/usr/bin/env bash
# Make what tests/swerex/run.sh needs, outside the repository:
#
#   setup.sh VENV_DIR SDIST_DIR [REFERENCE_SERVER_VENV_DIR]
#
# VENV_DIR     a venv with the pinned client side: swe-rex 1.4.0, aiohttp, pytest,
#              pytest-asyncio, requests (run.sh's SWEREX_PYTHON is VENV_DIR/bin/python)
# SDIST_DIR    swe-rex 1.4.0's sdist is downloaded from PyPI and extracted here, as
#              SDIST_DIR/swe_rex-1.4.0 (run.sh's SWEREX_SDIST_DIR may be either)
# REFERENCE_SERVER_VENV_DIR (optional)
#              a separate venv with swe-rex 1.4.0's own server (swerex-remote) and pinned
#              dependencies, to check the suite against the server it was written for
#
# Idempotent: each part is skipped when it is already there with the same pins.
# Nothing here is written into the repository.
set -euo pipefail

SWEREX_VERSION=1.4.0
# Verified together with Python 3.11 (see tests/swerex/README.md).
CLIENT_PINS=(
  "swe-rex==$SWEREX_VERSION"
  "aiohttp==3.14.5"
  "pytest==9.2.0"
  "pytest-asyncio==1.5.0"
  "requests==2.34.2"
)
# swe-rex's own dependencies, for its server.  fastapi 0.121.3 is the last release before
# 0.122.0 made a missing API key answer 401 instead of the 403 that swe-rex's tests expect.
SERVER_PINS=(
  "swe-rex==$SWEREX_VERSION"
  "fastapi==0.121.3"
  "starlette==0.50.0"
  "uvicorn==0.55.0"
  "pydantic==2.14.4"
  "pexpect==4.9.0"
  "bashlex==0.18"
  "python-multipart==0.0.34"
  "requests==2.34.2"
  "rich==15.0.0"
)

usage() { echo "usage: $0 VENV_DIR SDIST_DIR [REFERENCE_SERVER_VENV_DIR]" >&2; exit 2; }
[[ $# -eq 2 || $# -eq 3 ]] || usage

python=${PYTHON:-python3}

# make_venv DIR PIN...: a venv holding exactly these pins (plus their dependencies).
make_venv() {
  local dir=$1; shift
  local stamp="$dir/.conch-swerex-pins"
  local want
  want=$(printf '%s\n' "$@")
  if [[ -x "$dir/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "setup.sh: $dir is already set up"
    return
  fi
  echo "setup.sh: making $dir"
  rm -f "$stamp"
  [[ -x "$dir/bin/python" ]] || "$python" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
  printf '%s\n' "$want" > "$stamp"
}

venv_dir=$1
sdist_dir=$2
server_dir=${3:-}

make_venv "$venv_dir" "${CLIENT_PINS[@]}"

extracted="$sdist_dir/swe_rex-$SWEREX_VERSION"
if [[ -f "$extracted/tests/test_execution.py" ]] && grep -qx "Version: $SWEREX_VERSION" "$extracted/PKG-INFO"; then
  echo "setup.sh: $extracted is already there"
else
  echo "setup.sh: downloading swe-rex $SWEREX_VERSION's sdist into $sdist_dir"
  mkdir -p "$sdist_dir"
  tmp=$(mktemp -d "$sdist_dir/.download.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  "$venv_dir/bin/python" -m pip download --quiet --disable-pip-version-check \
    --no-deps --no-binary :all: --dest "$tmp" "swe-rex==$SWEREX_VERSION"
  tar -xzf "$tmp/swe_rex-$SWEREX_VERSION.tar.gz" -C "$tmp"
  rm -rf "$extracted"
  mv "$tmp/swe_rex-$SWEREX_VERSION" "$extracted"
  rm -rf "$tmp"
  trap - EXIT
fi

if [[ -n "$server_dir" ]]; then
  make_venv "$server_dir" "${SERVER_PINS[@]}"
fi

echo
echo "export SWEREX_PYTHON=$venv_dir/bin/python"
echo "export SWEREX_SDIST_DIR=$extracted"
if [[ -n "$server_dir" ]]; then
  echo "export SWEREX_SERVER='[\"$server_dir/bin/swerex-remote\",\"--host\",\"127.0.0.1\",\"--port\",\"{port}\",\"--auth-token\",\"{token}\"]'"
fi
