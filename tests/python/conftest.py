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
ADMIN_TOKEN = "a" * 64


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
    """``mdl serve`` of the repository ``repo``, or with ``root`` of every one in that folder."""

    def __init__(self, repo, tmp, root=False, args=()):
        tokens = Path(tmp) / "tokens"
        tokens.write_text(
            f"reader read {READ_TOKEN}\nwriter write {WRITE_TOKEN}\nadmin admin {ADMIN_TOKEN}\n"
        )
        self.proc = subprocess.Popen(
            [MDL, "serve", "--addr", "127.0.0.1:0", "--tokens", str(tokens),
             "--root" if root else "-C", str(repo), *args],
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

    def start(repo, root=False, args=()):
        s = Server(repo, tmp_path, root, args)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


# SeaweedFS's `weed mini` (scripts/seaweedfs-env.sh installs it; scripts/test-python.sh sets
# MDL_WEED): every port it opens, the S3 port 7th; the keys it takes as its admin identity.
WEED_PORTS = [
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
    "filer.port.grpc", "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance",
    "admin.port", "admin.port.grpc",
]
WEED_KEY, WEED_SECRET = "mdl-test-key", "mdl-test-secret"


def free_ports(n):
    import socket

    held = [socket.socket() for _ in range(n)]
    for s in held:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in held]
    for s in held:
        s.close()
    return ports


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """A SeaweedFS server of this test's own with a bucket `mdl`; the AWS_* environment set
    for it. Yields the bucket's base URL (`s3://mdl`)."""
    import socket
    import time

    weed = os.environ.get("MDL_WEED")
    if not weed:
        pytest.skip("MDL_WEED is not set: run scripts/test-python.sh, which installs SeaweedFS")
    data = tmp_path / "weed"
    data.mkdir()
    ports = free_ports(len(WEED_PORTS))
    log = open(tmp_path / "weed.log", "w")
    env = dict(os.environ, AWS_ACCESS_KEY_ID=WEED_KEY, AWS_SECRET_ACCESS_KEY=WEED_SECRET)
    proc = subprocess.Popen(
        [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-webdav=false",
         "-admin.ui=false", "-bucket=mdl", *(f"-{k}={v}" for k, v in zip(WEED_PORTS, ports))],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env,
    )
    for k, v in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{ports[6]}",
        "AWS_ACCESS_KEY_ID": WEED_KEY,
        "AWS_SECRET_ACCESS_KEY": WEED_SECRET,
        "AWS_ALLOW_HTTP": "true",
        "MDL_CACHE_DIR": str(tmp_path / "cache"),
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "weed.log").read_text()
            assert time.monotonic() < deadline, "SeaweedFS did not start"
            try:
                socket.create_connection(("127.0.0.1", ports[6]), timeout=1).close()
            except OSError:
                time.sleep(0.25)
                continue
            # Up when a signed request answers: the probe is not a repository.
            r = mdl("-C", "s3://mdl/probe", "log", check=False)
            if "is not an mdl repository" in r.stderr:
                break
            time.sleep(0.25)
        yield "s3://mdl"
    finally:
        proc.kill()
        proc.wait()
        log.close()
