#!/usr/bin/env bash
# Prints the path of a Python virtual environment with tests/python/requirements.txt installed,
# creating it on first use. It lives outside the clone, in $MDL_PY_CACHE (default
# ~/.cache/mdl/python), in a folder named by the requirements' hash, so reruns on the same
# machine are instant and a change of pins makes a fresh one. Progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ticking.sh
req=tests/python/requirements.txt
key=$( (cat "$req"; python3 --version) | sha256sum | cut -c1-16)
root=${MDL_PY_CACHE:-$HOME/.cache/mdl/python}
venv=$root/$key
if [ ! -e "$venv/.complete" ]; then
    echo "installing the Python test environment into $venv (once; torch is several GB)" >&2
    rm -rf "$venv"
    mkdir -p "$root"
    python3 -m venv "$venv"
    # A line a package as pip collects it; the ticks cover the long downloads and unpacks.
    ticking "installing the Python test environment" \
        "$venv/bin/pip" install --progress-bar off --disable-pip-version-check -r "$req" >&2
    touch "$venv/.complete"
fi
echo "$venv"
