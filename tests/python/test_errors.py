"""Failures a program can catch: each kind of failure its class, every one an MdlError with the
stable code that the CLI's --json and the HTTP API report, also when a background commit
failed and also over HTTP."""

import fcntl

import numpy as np
import pytest

import mdl
from conftest import READ_TOKEN


def state(seed):
    return {"w": np.full(16, seed, dtype=np.float32)}


def raised(kind, code, call):
    with pytest.raises(kind) as e:
        call()
    assert isinstance(e.value, mdl.MdlError)
    assert e.value.code == code, (e.value.code, str(e.value))
    return e.value


def test_each_failure_raises_its_kind_with_its_code(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    raised(mdl.NotFound, "unborn_branch", lambda: repo.resolve("HEAD"))
    repo.commit_state(state(1), wait=True)
    raised(mdl.NotFound, "unknown_revision", lambda: repo.resolve("no-such-branch"))
    repo.branch("exp")
    raised(mdl.Conflict, "ref_exists", lambda: repo.branch("exp"))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    raised(mdl.InvalidInput, "invalid_safetensors", lambda: repo.commit(bad, wait=True))
    raised(mdl.NotFound, "no_such_repository", lambda: mdl.Repository.open(tmp_path / "nothing-here"))


def test_a_background_commit_keeps_its_code(tmp_path):
    mdl.init(tmp_path / "repo")
    repo = mdl.Repository.open(tmp_path / "repo", wait=0.2)
    # Another holder of the repository's lock: the commit, stored in the background, is Busy.
    with open(tmp_path / "repo" / ".mdl" / "lock", "r+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        err = raised(mdl.Busy, "busy", lambda: repo.commit_state(state(2), wait=True))
        fcntl.flock(held, fcntl.LOCK_UN)
    assert "background commit failed" in str(err)
    # The next commit goes ahead.
    assert repo.commit_state(state(3), wait=True).id == repo.resolve("HEAD")


def test_over_http_the_servers_code_decides(tmp_path, serve):
    repo = mdl.init(tmp_path / "repo")
    repo.commit_state(state(1), wait=True)
    server = serve(tmp_path / "repo")
    remote = mdl.open(f"{server.base}/repo", token=READ_TOKEN)
    raised(mdl.NotFound, "unknown_revision", lambda: remote.show("no-such-branch"))
    raised(mdl.NotFound, "no_such_repository", lambda: mdl.open(f"{server.base}/other", token=READ_TOKEN).log())
    unauthorized = mdl.open(f"{server.base}/repo", token="x" * 32)
    raised(mdl.PermissionDenied, "unauthorized", lambda: unauthorized.log())


def test_links_out_of_a_folder_damaged_checkpoints_and_limits(tmp_path):
    """What `mdl commit` refuses unless asked, refused from Python the same way, and taken with
    ``follow_links`` or ``as_bytes``; a commit over a limit is ``too_large``."""
    repo = mdl.init(tmp_path / "repo")
    secret = tmp_path / "secret.txt"
    secret.write_text("password")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").symlink_to(secret)
    e = raised(mdl.InvalidInput, "bad_input", lambda: repo.commit(ck, wait=True))
    assert "outside the folder committed" in str(e)
    done = repo.commit(ck, follow_links=True, wait=True)
    out = tmp_path / "config.json"  # a tree of one file is checked out as that file
    repo.checkout(done.id, out)
    assert out.read_text() == "password"

    cut = tmp_path / "optimizer.pt"
    cut.write_bytes(b"PK\x03\x04" + bytes(60))
    e = raised(mdl.InvalidInput, "bad_input", lambda: repo.commit(cut, wait=True))
    assert "not a readable torch.save checkpoint" in str(e)
    done = repo.commit(cut, as_bytes=True, wait=True)
    repo.checkout(done.id, tmp_path / "back.pt")
    assert (tmp_path / "back.pt").read_bytes() == cut.read_bytes()

    repo.set_config("limits.files", "1")
    (ck / "config.json").unlink()
    (ck / "a.txt").write_text("a")
    (ck / "b.txt").write_text("b")
    raised(mdl.InvalidInput, "too_large", lambda: repo.commit(ck, wait=True))


def test_state_it_cannot_take_is_refused_in_mdls_words(tmp_path):
    import torch

    repo = mdl.init(tmp_path / "repo")
    cases = [
        (dict(extra={"w": torch.ones(2)}, step=-1), "step must be a whole number"),
        (dict(extra={"w": torch.ones(2)}, step=1.5), "step must be a whole number"),
        (dict(extra={"__metadata__": torch.ones(2)}), "'__metadata__'"),
        (dict(extra={"s": torch.eye(3).to_sparse()}), "dense tensors"),
    ]
    for kwargs, want in cases:
        with pytest.raises(mdl.InvalidInput, match=want) as e:
            repo.commit_state(wait=True, **kwargs)
        assert e.value.code == "bad_input"
    assert repo.log() == []
