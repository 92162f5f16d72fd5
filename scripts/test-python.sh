#!/usr/bin/env bash
# The Python tests (tests/python): the real torch, transformers and huggingface_hub against the
# real `mdl` binary and `mdl serve`. Builds mdl, installs the pinned packages into a cache
# outside the clone on first use (scripts/python-env.sh; several GB, a minute or two), runs
# pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q -p mdl-cli --bin mdl
venv=$(scripts/python-env.sh)
export MDL="$PWD/target/debug/mdl"
# No telemetry or hub lookups: everything the tests download comes from `mdl serve`.
export HF_HUB_DISABLE_TELEMETRY=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 TOKENIZERS_PARALLELISM=false
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/python "$@"
