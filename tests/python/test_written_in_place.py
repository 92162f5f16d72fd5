"""A training loop that saves each checkpoint over the same path, in place, and commits it in
the background: every commit holds the file as it was when `commit` was called, whatever the
loop wrote next (`torch.save`, safetensors' `save_file` and `shutil.copyfile` all open the
path with "wb"). The CLI's side is tests/e2e/written_in_place.rs."""

import shutil

import torch
from safetensors.torch import save_file

import mdl


def test_background_commits_keep_the_file_as_it_was_when_called(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    path = tmp_path / "ck.bin"
    staged = tmp_path / "staged.bin"
    handles = []
    for step in range(100):
        state = {"w": torch.full((512, 512), float(step)), "b": torch.arange(1024) * step}
        way = step % 3
        if way == 0:
            torch.save(state, path)
        elif way == 1:
            save_file(state, str(path))
        else:
            torch.save(state, staged)
            shutil.copyfile(staged, path)
        expected = path.read_bytes()
        handles.append((repo.commit(path, step=step, wait=False), expected))
    for step, (handle, expected) in enumerate(handles):
        result = handle.wait()
        out = tmp_path / "out"
        repo.checkout(result.id, out)
        # A one-file tree checks out as that file.
        assert out.read_bytes() == expected, f"step {step}"
        out.unlink()
    assert [e.step for e in repo.log()] == list(reversed(range(100)))
    # The private copies went with their commits.
    assert list((tmp_path / "repo" / ".mdl" / "incoming").iterdir()) == []


def test_a_background_commit_of_a_deleted_or_missing_file(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    path = tmp_path / "ck.safetensors"
    save_file({"w": torch.ones(64)}, str(path))
    expected = path.read_bytes()
    handle = repo.commit(path, wait=False)
    path.unlink()
    out = tmp_path / "out"
    repo.checkout(handle.wait().id, out)
    assert out.read_bytes() == expected
    try:
        repo.commit(path, wait=False)
    except mdl.MdlError as e:
        assert "ck.safetensors" in str(e)
    else:
        raise AssertionError("a missing file was committed")
