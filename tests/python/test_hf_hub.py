"""The real huggingface_hub client against a real `mdl serve`: hf_hub_download and
snapshot_download of a branch, a tag and a commit return the committed bytes."""

import os

import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from conftest import READ_TOKEN, mdl, tree_bytes


def checkpoint(d, step):
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text('{"n_layer": 2}\n')
    (d / "model.safetensors").write_bytes(safetensors_bytes(step))
    (d / "sub" / "notes.txt").write_text(f"step {step}\n" * 2000)


def safetensors_bytes(seed):
    import struct

    n = 4096
    data = struct.pack(f"<{n}f", *[((i * 2654435761 + seed) % 1000) / 1000.0 for i in range(n)])
    header = b'{"w":{"dtype":"F32","shape":[64,64],"data_offsets":[0,%d]}}' % len(data)
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


@pytest.fixture
def served(tmp_path, repo, serve):
    for step in (1, 2):
        d = tmp_path / f"ck{step}"
        checkpoint(d, step)
        mdl("-C", repo, "commit", d, "-m", f"step {step}")
        if step == 1:
            mdl("-C", repo, "tag", "v1")
    server = serve(repo)
    return server, tmp_path


def test_hf_hub_download_and_snapshot_download(served, tmp_path):
    server, _ = served
    endpoint = f"{server.base}/hf"
    cache = tmp_path / "hf-cache"
    kw = dict(endpoint=endpoint, token=READ_TOKEN, cache_dir=str(cache))
    for rev, src in [("main", tmp_path / "ck2"), ("v1", tmp_path / "ck1")]:
        path = hf_hub_download("repo", "model.safetensors", revision=rev, **kw)
        assert open(path, "rb").read() == (src / "model.safetensors").read_bytes()
        path = hf_hub_download("repo", "sub/notes.txt", revision=rev, **kw)
        assert open(path, "rb").read() == (src / "sub" / "notes.txt").read_bytes()
        snap = snapshot_download("repo", revision=rev, **kw)
        assert tree_bytes(snap) == tree_bytes(src)
    # A commit id as the revision, and the model info the client reads it from.
    info = HfApi(endpoint=endpoint, token=READ_TOKEN).model_info("repo", revision="v1")
    assert sorted(s.rfilename for s in info.siblings) == ["config.json", "model.safetensors", "sub/notes.txt"]
    snap = snapshot_download("repo", revision=info.sha, local_dir=str(tmp_path / "by-id"), **kw)
    # (A local_dir also holds the client's own bookkeeping under .cache/.)
    got = {k: v for k, v in tree_bytes(snap).items() if not k.startswith(".cache/")}
    assert got == tree_bytes(tmp_path / "ck1")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download("repo", "nope.bin", revision="main", **kw)


def test_missing_file_revision_and_repository_raise_the_hubs_exceptions(served, tmp_path):
    """A missing file, revision or repository is the Hub's own exception, never the client's
    offline fallback (`LocalEntryNotFoundError`, "check your Internet connection")."""
    server, _ = served
    endpoint = f"{server.base}/hf"
    kw = dict(endpoint=endpoint, token=READ_TOKEN, cache_dir=str(tmp_path / "hf-missing"))
    cases = [
        (lambda: hf_hub_download("repo", "nope.bin", revision="main", **kw), RemoteEntryNotFoundError),
        (lambda: hf_hub_download("repo", "sub/nope.txt", revision="v1", **kw), RemoteEntryNotFoundError),
        (lambda: hf_hub_download("repo", "config.json", revision="no-such-branch", **kw), RevisionNotFoundError),
        (lambda: hf_hub_download("no-such-repo", "config.json", **kw), RepositoryNotFoundError),
    ]
    api = HfApi(endpoint=endpoint, token=READ_TOKEN)
    cases += [
        (lambda: api.model_info("repo", revision="no-such-branch"), RevisionNotFoundError),
        (lambda: api.model_info("no-such-repo"), RepositoryNotFoundError),
    ]
    for call, expected in cases:
        with pytest.raises(expected) as raised:
            call()
        assert type(raised.value) is expected, f"{type(raised.value).__name__}: {raised.value}"


def test_environment_endpoint_and_tokens(served, tmp_path, monkeypatch):
    server, _ = served
    monkeypatch.setenv("HF_ENDPOINT", f"{server.base}/hf")
    # The endpoint is read when huggingface_hub is imported: a fresh interpreter sees it.
    import subprocess
    import sys

    code = (
        "from huggingface_hub import hf_hub_download;"
        f"print(open(hf_hub_download('repo','config.json',token='{READ_TOKEN}',"
        f"cache_dir='{tmp_path / 'c2'}')).read(), end='')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout == '{"n_layer": 2}\n'
