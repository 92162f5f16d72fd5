#!/usr/bin/env bash
# Builds the `mdl` wheel: the Python package (python/, the library in-process through PyO3, one
# abi3 extension for every CPython >= 3.11) with the `mdl` command-line tool inside it, installed
# onto PATH by pip as wheel data (scripts/), a native binary as ruff ships its own. What the
# release workflow (.github/workflows/release.yml) runs on each platform; run it the same way here:
#
#     scripts/build-wheel.sh [--profile release|dev] [--out DIR] [--cli PATH] [-- MATURIN-ARGS…]
#
# --profile dev is what the test suite installs (scripts/test-python.sh); release is the default.
# --cli PATH packs that `mdl` instead of building one: the test suite's own, built with the
# tests' feature set, which `cargo build -p mdl-cli` would otherwise compile again.
# The wheel's platform tag is the oldest one the built files allow (maturin checks the libraries
# they link): manylinux_2_28 when built in that image, as the workflow does. Prints the wheel's path.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
out=target/wheels
cli=
while [ $# -gt 0 ]; do
    case $1 in
        --profile) profile=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --cli) cli=$2; shift 2 ;;
        --) shift; break ;;
        *) echo "error: unknown argument '$1' (usage: $0 [--profile P] [--out DIR] [--cli PATH] [-- MATURIN-ARGS…])" >&2; exit 2 ;;
    esac
done
dir=$([ "$profile" = dev ] && echo debug || echo "$profile")

# The CLI, copied without its debug information into the wheel's data: maturin packs
# python/<module-name>.data when it exists (not committed; without it, `pip install ./python`
# builds the library alone).
# Cargo's progress (a line a crate) goes to stderr; stdout is the wheel's path alone.
if [ -z "$cli" ]; then
    cargo build --profile "$profile" -p mdl-cli --bin mdl
    cli=target/$dir/mdl
elif [ ! -x "$cli" ]; then
    echo "error: --cli $cli is not an executable" >&2
    exit 2
fi
data=python/mdl._mdl.data
rm -rf "$data"
mkdir -p "$data/scripts"
cp "$cli" "$data/scripts/mdl"
strip "$data/scripts/mdl"

maturin=${MATURIN:-$(command -v maturin || true)}
if [ -z "$maturin" ]; then
    echo "error: maturin is not on PATH (pip install 'maturin>=1.16,<2', or set MATURIN)" >&2
    exit 1
fi
mkdir -p "$out"
"$maturin" build --profile "$profile" --strip -m python/Cargo.toml --out "$out" "$@" >&2
rm -rf "$data"
wheel=$(ls -t "$out"/mdl-*.whl | head -1)
echo "$wheel"
