#!/usr/bin/env bash
# The peers the benchmarks set mdl beside, installed once into caches outside the clone, pinned:
# `lmz` (PyPI lmzip, in a virtual environment of its own) and ZipNN (PyPI zipnn, which needs
# torch: installed without dependencies into a folder put on PYTHONPATH of the Python test
# environment, scripts/python-env.sh). Prints shell assignments for `eval`:
#   LMZ=…  ZIPNN_PYTHON=…  ZIPNN_PATH=…
set -euo pipefail
cd "$(dirname "$0")/.."
lmzip=1.3.0
zipnn=0.5.4
zstandard=0.25.0
cache="${XDG_CACHE_HOME:-$HOME/.cache}/mdl/bench"
lmz_env="$cache/peers-lmzip-$lmzip"
if [ ! -e "$lmz_env/installed" ]; then
    rm -rf "$lmz_env"
    python3 -m venv "$lmz_env"
    "$lmz_env/bin/pip" install -q "lmzip==$lmzip" "zstandard==$zstandard" >&2
    touch "$lmz_env/installed"
fi
python_env=$(scripts/python-env.sh)
zipnn_dir="$cache/peers-zipnn-$zipnn-$(basename "$python_env")"
if [ ! -e "$zipnn_dir/installed" ]; then
    rm -rf "$zipnn_dir"
    # A source distribution: its C extension is compiled for that environment's Python.
    "$python_env/bin/pip" install -q --no-deps --target "$zipnn_dir" \
        "zipnn==$zipnn" "zstandard==$zstandard" >&2
    touch "$zipnn_dir/installed"
fi
echo "LMZ=$lmz_env/bin/lmz ZIPNN_PYTHON=$python_env/bin/python ZIPNN_PATH=$zipnn_dir"
