"""The Python package against a hostile server (the CLI's cases are tests/e2e/hostile_peer.rs):
a proxy in front of a real `mdl serve` tampers with what a checkout through
`mdl.open("http://…")` receives. Each case must refuse with one clear error, write nothing
(a sentinel folder beside the target is compared before and after, the target is not left
behind) and end within its deadlines. And a DCP save whose pickles would run code is refused
naming what they ask for."""

import http.client
import http.server
import io
import json
import os
import pickle
import threading
import time
from pathlib import Path

import pytest

import mdl
from conftest import READ_TOKEN, mdl as run_mdl, tree_bytes


def _listing(fn):
    def tamper(route, status, headers, body):
        if route == "listing" and status == 200:
            doc = json.loads(body)
            fn(doc)
            return status, headers, json.dumps(doc).encode()
        return status, headers, body

    return tamper


def _file(fn):
    def tamper(route, status, headers, body):
        if route == "file" and status == 200:
            return status, headers, fn(body)
        return status, headers, body

    return tamper


def _first(answer):
    """The listing answered as `answer(headers, body)` says: (status, headers, body or a
    callable that writes to the socket)."""

    def tamper(route, status, headers, body):
        if route == "listing":
            return answer(headers, body)
        return status, headers, body

    return tamper


def _flip(body):
    b = bytearray(body)
    b[len(b) // 2] ^= 0x40
    return bytes(b)


def _stall(out):
    time.sleep(30)


def _endless(first):
    def write(out):
        out.write(first)
        while True:
            out.write(b"x" * 65536)

    return write


MODES = {
    "listing_traversal": (_listing(lambda d: d["files"][0].update(path="../../outside/sentinel.txt")), "'..'"),
    "listing_absolute": (_listing(lambda d: d["files"][0].update(path="/tmp/mdl-hostile-py")), "absolute"),
    "listing_dotmdl": (_listing(lambda d: d["files"][0].update(path=".mdl/meta.redb")), ".mdl"),
    "listing_control": (_listing(lambda d: d["files"][0].update(path="a\x1b[2Jb")), "control"),
    "listing_renamed": (_listing(lambda d: d["files"][0].update(path="aaa.txt")), "not those commit"),
    "file_altered": (_file(_flip), "differ"),
    "file_cut": (_file(lambda b: b[: len(b) // 2]), "announced"),
    "file_endless": (
        lambda r, s, h, b: (s, {**h, "Content-Length": None}, _endless(b)) if r == "file" else (s, h, b),
        "more than the",
    ),
    "stalled": (_first(lambda h, b: (200, h, _stall)), "remote.idle-timeout"),
    "gzip": (_first(lambda h, b: (200, {**h, "Content-Encoding": "gzip"}, b)), "content encoded"),
    "redirect": (_first(lambda h, b: (302, {"Location": "/v1/repos/repo/refs"}, b"")), "redirect"),
    "error_without_end": (_first(lambda h, b: (500, {"Content-Length": None}, _endless(b"broken "))), "HTTP 500"),
    "not_json": (_first(lambda h, b: (200, {"Content-Type": "text/html"}, b"<html>")), "not the JSON"),
}


class Proxy:
    """A proxy to `upstream` (host:port) that hands every answer to `tamper(route, status,
    headers, body)`; the body it returns may be bytes or a callable writing to the socket."""

    def __init__(self, upstream, tamper):
        host, port = upstream.split(":")

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _relay(self):
                n = int(self.headers.get("Content-Length") or 0)
                sent = self.rfile.read(n) if n else b""
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                keep = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=sent, headers=keep)
                resp = conn.getresponse()
                body = resp.read()
                headers = {k: v for k, v in resp.getheaders()
                           if k.lower() not in ("content-length", "transfer-encoding", "connection")}
                path = self.path.split("?")[0].split("/")[4:]
                route = "other"
                if path and path[0] == "files":
                    route = "listing" if len(path) == 2 else "file"
                status, headers, body = tamper(route, resp.status, headers, body)
                self.send_response(status)
                length = headers.pop("Content-Length", "auto")
                for k, v in headers.items():
                    self.send_header(k, v)
                if callable(body):
                    self.send_header("Connection", "close")
                    self.end_headers()
                    try:
                        body(self.wfile)
                    except OSError:
                        pass
                    return
                if length is not None:
                    self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)

            do_GET = _relay
            do_POST = _relay

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def honest(tmp_path, serve):
    """A served repository of a tree with a folder, two commits."""
    repo = tmp_path / "repo"
    run_mdl("init", repo)
    tree = tmp_path / "tree"
    (tree / "ck").mkdir(parents=True)
    for step in (1, 2):
        (tree / "config.json").write_text(json.dumps({"step": step}))
        (tree / "ck" / "notes.txt").write_text("notes " * 500)
        run_mdl("-C", repo, "commit", tree, "-m", f"step {step}")
    return serve(repo)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_checkout_from_a_hostile_server_writes_nothing(mode, honest, tmp_path, monkeypatch):
    monkeypatch.setenv("MDL_REMOTE_IDLE_TIMEOUT", "2")
    monkeypatch.setenv("MDL_REMOTE_REQUEST_TIMEOUT", "4")
    tamper, expect = MODES[mode]
    proxy = Proxy(honest.base.removeprefix("http://"), tamper)
    world = tmp_path / "world"
    (world / "outside").mkdir(parents=True)
    (world / "outside" / "sentinel.txt").write_text("keep me")
    (world / "work").mkdir()
    before = tree_bytes(world)
    repo = mdl.open(f"{proxy.base}/repo", READ_TOKEN)
    started = time.monotonic()
    with pytest.raises(mdl.MdlError) as refused:
        repo.checkout("main", world / "work" / "out")
    took = time.monotonic() - started
    message = str(refused.value)
    assert expect in message, message
    assert "\n" not in message and "\x1b" not in message, message
    assert took < 20, took
    assert tree_bytes(world) == before
    assert not (world / "work" / "out").exists()
    assert not Path("/tmp/mdl-hostile-py").exists()


def test_the_honest_proxy_gives_the_commits_bytes(honest, tmp_path):
    proxy = Proxy(honest.base.removeprefix("http://"), lambda r, s, h, b: (s, h, b))
    repo = mdl.open(f"{proxy.base}/repo", READ_TOKEN)
    repo.checkout("main", tmp_path / "out")
    assert set(tree_bytes(tmp_path / "out")) == {"config.json", "ck/notes.txt"}


# --- Pickles in a DCP save ---------------------------------------------------------------

class _Runs:
    """Unpickling this would call os.system: what a planted pickle does."""

    def __reduce__(self):
        return (os.system, ("touch /tmp/mdl-hostile-pickle-ran",))


def _dcp_save(path):
    import torch
    import torch.distributed.checkpoint as dcp

    import mdl.dcp

    state = {"w": torch.arange(6.0).reshape(2, 3), "note": {"epoch": 3}}
    dcp.save(state, storage_writer=mdl.dcp.Writer(path), no_dist=True)
    return state


def test_a_dcp_save_loads_and_a_planted_pickle_is_refused(tmp_path):
    import torch
    import torch.distributed.checkpoint as dcp

    import mdl.dcp

    repo = tmp_path / "repo"
    saved = _dcp_save(repo)
    loaded = {"w": torch.zeros(2, 3), "note": {"epoch": 0}}
    dcp.load(loaded, storage_reader=mdl.dcp.Reader(repo), no_dist=True)
    assert torch.equal(loaded["w"], saved["w"]) and loaded["note"] == {"epoch": 3}

    # A `.metadata` that would run a command: refused, naming what it asks for.
    r = mdl.open(repo)
    tree = tmp_path / "tree"
    r.checkout("main", tree)
    (tree / ".metadata").write_bytes(pickle.dumps(_Runs()))
    r.commit(tree, message="planted metadata")
    ran = Path("/tmp/mdl-hostile-pickle-ran")
    ran.unlink(missing_ok=True)
    # (DCP reports a reader's failure inside its own CheckpointException.)
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as refused:
        dcp.load(loaded, storage_reader=mdl.dcp.Reader(repo), no_dist=True)
    assert "system is not admitted in a DCP save's metadata" in _said(refused.value)
    assert not ran.exists()

    # A non-tensor value that would, in its exact place (`.metadata` — the save's own, read by
    # the test — pointed at it): refused before DCP's planner unpickles it, which it would do
    # with `torch.load(weights_only=False)`.
    r.checkout("main~1", tree, force=True)
    meta = pickle.loads((tree / ".metadata").read_bytes())
    planted = io.BytesIO()
    torch.save(_Runs(), planted)
    for index, place in list(meta.storage_data.items()):
        if place[0] == "bytes":
            (tree / place[1]).write_bytes(planted.getvalue())
            meta.storage_data[index] = ("bytes", place[1], 0, len(planted.getvalue()))
    (tree / ".metadata").write_bytes(pickle.dumps(meta))
    r.commit(tree, message="planted value")
    with pytest.raises(CheckpointException) as refused:
        dcp.load(loaded, storage_reader=mdl.dcp.Reader(repo), no_dist=True)
    assert "refused a value stored in part-" in _said(refused.value)
    assert "unsupported GLOBAL posix.system" in _said(refused.value)
    assert not ran.exists()


def _said(e: BaseException) -> str:
    """What an exception says, with what DCP keeps of each rank's failure."""
    return f"{e} {getattr(e, 'failures', '')}"
