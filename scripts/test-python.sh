#!/usr/bin/env bash
# The Python tests (tests/python): the `mdl` package (python/) and the real torch,
# transformers, lightning and huggingface_hub against the real `mdl` binary and `mdl serve`.
# Builds mdl, installs the pinned packages into a cache outside the clone on first use
# (scripts/python-env.sh; several GB, a minute or two), builds and installs the package into
# it (`pip install ./python`, the README's command, with cargo's dev profile: quicker to build,
# the same code), runs pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q -p mdl-cli --bin mdl
venv=$(scripts/python-env.sh)
PATH="$venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" "$venv/bin/pip" install --quiet \
    --disable-pip-version-check --no-build-isolation --no-deps --force-reinstall ./python
export MDL="$PWD/target/debug/mdl"
# No telemetry or hub lookups: everything the tests download comes from `mdl serve`.
export HF_HUB_DISABLE_TELEMETRY=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 TOKENIZERS_PARALLELISM=false
export MDL_WEED=${MDL_WEED:-$(scripts/seaweedfs-env.sh)}
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/python "$@"
