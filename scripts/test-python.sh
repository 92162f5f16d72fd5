#!/usr/bin/env bash
# The Python tests (tests/python): the `mdl` package and the real torch, transformers, lightning
# and huggingface_hub against the real `mdl` binary and `mdl serve` — all as a user installs
# them: the wheel built by scripts/build-wheel.sh (with cargo's dev profile: quicker to build, the
# same code), installed into a fresh virtual environment, and run with no cargo or rustc on PATH,
# the `mdl` command being the one the wheel put there.
# The pinned packages come from a cache outside the clone (scripts/python-env.sh; several GB,
# installed on first use), which the fresh environment reaches through a path file rather than
# installing them again. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
deps=$(scripts/python-env.sh)
# The CLI as the Rust tests built it (nothing to do after scripts/test.sh's `cargo test
# --workspace`): `--tests` gives the build the tests' feature set, so the binary is theirs,
# not a second one compiled with `-p mdl-cli`'s features.
cargo build --workspace --bins --tests
wheel=$(MATURIN="$deps/bin/maturin" scripts/build-wheel.sh --profile dev --out target/wheels-test \
    --cli target/debug/mdl)

venv=$PWD/target/wheel-venv
rm -rf "$venv"
"$deps/bin/python" -m venv --without-pip "$venv"
"$deps/bin/python" - "$venv" "$deps" <<'EOF'
import pathlib, sys, sysconfig
venv, deps = map(pathlib.Path, sys.argv[1:])
rel = pathlib.Path(sysconfig.get_path("purelib")).relative_to(sys.prefix)
(venv / rel / "pinned-test-packages.pth").write_text(f"{deps / rel}\n")
EOF
# An `mdl` left in the cache by an earlier `pip install ./python` would not be used (the
# environment's own packages come first) but is removed so that nothing can mistake it.
"$deps/bin/pip" uninstall --quiet --yes mdl >/dev/null 2>&1 || true
"$deps/bin/pip" --python "$venv/bin/python" install --quiet --disable-pip-version-check \
    --no-deps --no-index "$wheel"

export MDL_WEED=${MDL_WEED:-$(scripts/seaweedfs-env.sh)}
# PATH without any folder that holds cargo or rustc: nothing below can build.
path=$venv/bin
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do
    [ -x "$d/cargo" ] || [ -x "$d/rustc" ] || path=$path:$d
done
export PATH=$path MDL_WHEEL=$wheel MDL="$venv/bin/mdl"
# No telemetry or hub lookups: everything the tests download comes from `mdl serve`.
export HF_HUB_DISABLE_TELEMETRY=1 TRANSFORMERS_NO_ADVISORY_WARNINGS=1 TOKENIZERS_PARALLELISM=false
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/python "$@"
