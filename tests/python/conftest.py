"""Shared fixtures of the Python tests: the `mdl` binary, repositories, and a running
`mdl serve`. Run by `scripts/test-python.sh` (which builds mdl and installs the pinned
packages), or by hand: `MDL=target/debug/mdl $(scripts/python-env.sh)/bin/python -m pytest tests/python`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MDL = os.environ.get("MDL", str(ROOT / "target" / "debug" / "mdl"))
READ_TOKEN = "r" * 64
WRITE_TOKEN = "w" * 64


def mdl(*args, cwd=None, check=True):
    """Runs mdl; returns its stdout (parsed when --json is among the args)."""
    r = subprocess.run([MDL, *map(str, args)], cwd=cwd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"mdl {args} exited {r.returncode}: {r.stderr}")
    return json.loads(r.stdout) if "--json" in args and r.returncode == 0 else r


def tree_bytes(root):
    """Every file under `root` by relative path, with its bytes."""
    root = Path(root)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def repo(tmp_path):
    path = tmp_path / "repo"
    mdl("init", path)
    return path


class Server:
    def __init__(self, repo, tmp):
        tokens = Path(tmp) / "tokens"
        tokens.write_text(f"reader read {READ_TOKEN}\nwriter write {WRITE_TOKEN}\n")
        self.proc = subprocess.Popen(
            [MDL, "serve", "--addr", "127.0.0.1:0", "--tokens", str(tokens), "-C", str(repo)],
            stdout=subprocess.PIPE,
            stderr=sys.stderr,
            text=True,
        )
        line = self.proc.stdout.readline().strip()
        assert line.startswith("listening on "), line
        self.base = line.removeprefix("listening on ")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def serve(tmp_path):
    servers = []

    def start(repo):
        s = Server(repo, tmp_path)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()
