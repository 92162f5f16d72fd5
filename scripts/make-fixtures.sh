#!/usr/bin/env bash
# Makes the fixture repository of one format version, with the build that wrote that version:
#
#   scripts/make-fixtures.sh 1    # the last commit writing only version 1 as documented (2bf7328)
#   scripts/make-fixtures.sh 2    # the last commit writing version 2 that builds (afec482)
#   scripts/make-fixtures.sh 3    # the last commit writing version 3 (364b373)
#   scripts/make-fixtures.sh 4    # the last commit writing version 4 (0ff8a9b)
#   scripts/make-fixtures.sh 5    # the last commit writing version 5 (a823e4b)
#   scripts/make-fixtures.sh 6    # the last commit writing version 6 (4f32c56)
#   scripts/make-fixtures.sh 7    # the last commit writing version 7 (b43d615)
#   scripts/make-fixtures.sh 8    # the last commit writing version 8 (1bd2575)
#   scripts/make-fixtures.sh 9    # the last commit writing version 9 (d57ec06)
#   scripts/make-fixtures.sh 10   # the last commit writing version 10 (3da5f30)
#   scripts/make-fixtures.sh 11   # the last commit writing version 11 (50b9fa8)
#   scripts/make-fixtures.sh 12   # the last commit writing version 12 (0854438)
#   scripts/make-fixtures.sh 13   # the last commit writing version 13 (f6f6a8a)
#   scripts/make-fixtures.sh 14   # this working tree (version 14)
#
# A fixture, once committed, is never regenerated: it is what that build wrote, and today's
# code must keep reading it (tests/fixtures.rs in the mdl crate). A format change adds the next
# version here and runs this once for it. Old builds are checked out into git worktrees under
# target/fixture-builds and built there (a few minutes each). MDL_FIXTURE_OUT=DIR writes
# elsewhere (to compare with a committed fixture).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: scripts/make-fixtures.sh VERSION}
case "$version" in
    1) rev=2bf7328 ;;
    2) rev=afec482 ;;
    3) rev=364b373 ;;
    4) rev=0ff8a9b ;;
    5) rev=a823e4b ;;
    6) rev=4f32c56 ;;
    7) rev=b43d615 ;;
    8) rev=1bd2575 ;;
    9) rev=d57ec06 ;;
    10) rev=3da5f30 ;;
    11) rev=50b9fa8 ;;
    12) rev=0854438 ;;
    13) rev=f6f6a8a ;;
    14) rev= ;;
    *) echo "error: no build is known to write format version $version" >&2; exit 1 ;;
esac
if [ -z "$rev" ]; then
    cargo build -q -p mdl-cli --bin mdl
    bin=target/debug/mdl
else
    tree=target/fixture-builds/v$version
    if [ ! -e "$tree/.git" ]; then
        rm -rf "$tree"
        git worktree add --detach "$tree" "$rev"
    fi
    (cd "$tree" && CARGO_TARGET_DIR="$PWD/target" cargo build -q -p mdl-cli --bin mdl)
    bin=$tree/target/debug/mdl
fi
out=${MDL_FIXTURE_OUT:-tests/fixtures/v$version}
if [ -e "$out" ]; then
    echo "error: $out exists; a committed fixture is never regenerated (remove it by hand to replace it)" >&2
    exit 1
fi
python3 scripts/make-fixture.py --mdl "$bin" --version "$version" --out "$out"
