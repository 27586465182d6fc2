#!/usr/bin/env bash
# `make check-install`: a fresh virtualenv in a temp dir, `pip install .` alone (no extras), then
# tests/install/check_minimal.py with that venv's python (broker + librdkafka round trip, embedded API, then the
# [spark] extra). Exits non-zero on any failure. PYTHON picks the interpreter that makes the venv (default python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
started=$(date +%s)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tidelog-check-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Install from a copy of the repository's files (tracked, plus new files not ignored): no build/ or *.egg-info left
# over from earlier builds can slip into the wheel, and the work tree gets none written into it.
mkdir "$tmp/source"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' file; do [ -f "$file" ] && printf '%s\0' "$file"; done |
        xargs -0 cp --parents -t "$tmp/source"
else
    tar -c --exclude=./.venv --exclude=./build --exclude='*.egg-info' --exclude=./.git . | tar -x -C "$tmp/source"
fi

echo "check-install: fresh venv in $tmp/venv ($("$PYTHON" --version 2>&1)), pip install . (no extras)"
"$PYTHON" -m venv "$tmp/venv"
(cd "$tmp/source" && env -u PYTHONPATH "$tmp/venv/bin/python" -m pip install -q .)
env -u PYTHONPATH "$tmp/venv/bin/python" -I tests/install/check_minimal.py --source "$tmp/source" "$@"
echo "check-install: passed in $(($(date +%s) - started)) s"
