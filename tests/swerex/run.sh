#!/usr/bin/env bash
# Run SWE-ReX's own server tests (from the swe-rex 1.4.0 sdist) against any server command,
# with conch's tests/swerex/conftest.py standing in for the conftest the sdist lacks.
#
# Environment:
#   SWEREX_PYTHON      python of a venv holding swe-rex==1.4.0, aiohttp, pytest, pytest-asyncio,
#                      requests (tests/swerex/setup.sh makes one)
#   SWEREX_SDIST_DIR   the extracted sdist (the folder holding tests/test_execution.py), or the
#                      folder setup.sh extracted it into (holding swe_rex-1.4.0/)
#   SWEREX_SERVER      the server's argv as a JSON list, with {port} and {token} placeholders
#   SWEREX_KEEP_SCRATCH=1  keep the scratch directory even when pytest passes
#
# Extra arguments go to pytest, e.g. --deselect tests/test_server.py::test_unauthenticated_request
# Exits with pytest's status.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

die() { echo "run.sh: $*" >&2; exit 2; }

[[ -n "${SWEREX_PYTHON:-}" ]] || die "SWEREX_PYTHON is not set (a venv python with swe-rex==1.4.0; see setup.sh)"
[[ -x "$SWEREX_PYTHON" ]] || die "SWEREX_PYTHON=$SWEREX_PYTHON is not an executable"
[[ -n "${SWEREX_SDIST_DIR:-}" ]] || die "SWEREX_SDIST_DIR is not set (the extracted swe-rex 1.4.0 sdist; see setup.sh)"
[[ -n "${SWEREX_SERVER:-}" ]] || die 'SWEREX_SERVER is not set (e.g. ["conch","swerex-remote","--host","127.0.0.1","--port","{port}","--auth-token","{token}"])'

src="$SWEREX_SDIST_DIR"
if [[ ! -f "$src/tests/test_execution.py" && -f "$src/swe_rex-1.4.0/tests/test_execution.py" ]]; then
  src="$src/swe_rex-1.4.0"
fi
modules=(test_execution.py test_server.py test_remote_deployment.py)
for m in "${modules[@]}"; do
  [[ -f "$src/tests/$m" ]] || die "$src/tests/$m not found: is SWEREX_SDIST_DIR the extracted swe-rex 1.4.0 sdist?"
done
if [[ -f "$src/PKG-INFO" ]] && ! grep -qx 'Version: 1.4.0' "$src/PKG-INFO"; then
  echo "run.sh: warning: $src/PKG-INFO is not swe-rex 1.4.0; the conftest was written for 1.4.0" >&2
fi
"$SWEREX_PYTHON" -c 'import swerex, aiohttp, pytest, pytest_asyncio, requests' \
  || die "SWEREX_PYTHON=$SWEREX_PYTHON lacks one of swe-rex, aiohttp, pytest, pytest-asyncio, requests"

scratch="$(mktemp -d "${TMPDIR:-/tmp}/conch-swerex.XXXXXX")"
mkdir "$scratch/tests"
: > "$scratch/tests/__init__.py"
cp "$here/conftest.py" "$scratch/tests/conftest.py"
for m in "${modules[@]}"; do
  cp "$src/tests/$m" "$scratch/tests/$m"
done
cat > "$scratch/pytest.ini" <<'EOF'
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
xfail_strict = false
testpaths = tests
EOF

# As in an activated venv: `python` in the server's shells is the venv's (some tests run it).
venv_bin="$(dirname "$SWEREX_PYTHON")"

status=0
(
  cd "$scratch"
  PATH="$venv_bin:$PATH" PYTHONDONTWRITEBYTECODE=1 \
    "$SWEREX_PYTHON" -m pytest -p no:cacheprovider -q -rA --basetemp="$scratch/tmp" "$@"
) || status=$?

if [[ "$status" -eq 0 && "${SWEREX_KEEP_SCRATCH:-}" != 1 ]]; then
  rm -rf "$scratch"
else
  echo "run.sh: pytest exited $status; scratch directory kept: $scratch" >&2
fi
exit "$status"
