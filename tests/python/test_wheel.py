"""The package as users install it: scripts/test-python.sh builds the wheel
(scripts/build-wheel.sh), installs it into a fresh virtual environment and runs every Python
test from there with no Rust toolchain on PATH; this file checks that this is what is running."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import mdl

WHEEL = os.environ.get("MDL_WHEEL")
needs_wheel = pytest.mark.skipif(not WHEEL, reason="run by scripts/test-python.sh, which builds the wheel")


@needs_wheel
def test_the_package_and_the_cli_come_from_the_wheel():
    prefix = Path(sys.prefix).resolve()
    assert Path(mdl.__file__).resolve().is_relative_to(prefix), mdl.__file__
    assert shutil.which("cargo") is None and shutil.which("rustc") is None
    cli = shutil.which("mdl")
    assert cli is not None and Path(cli).resolve() == prefix / "bin" / "mdl"
    out = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True).stdout
    # The version, and the commit it was built from (or "unknown commit" outside git).
    assert out.strip().startswith(f"mdl {mdl.__version__} ("), out


@needs_wheel
def test_the_wheel_is_one_abi3_build_with_the_cli_inside():
    name = Path(WHEEL).name
    assert name.startswith(f"mdl-{mdl.__version__}-cp311-abi3-"), name
    with zipfile.ZipFile(WHEEL) as z:
        names = set(z.namelist())
        cli = z.getinfo(f"mdl-{mdl.__version__}.data/scripts/mdl")
    assert cli.external_attr >> 16 & 0o111, "the CLI is not executable in the wheel"
    assert any(n.startswith("mdl/_mdl.") and n.endswith(".so") for n in names), sorted(names)
    # One extension for every CPython from 3.11: the stable ABI's suffix, no version in it.
    assert "mdl/_mdl.abi3.so" in names
