"""The same journey through ``mdl.Repository`` on each backend: a folder here, a repository
behind ``mdl serve`` and one in object storage (SeaweedFS, which scripts/test-python.sh
installs). A Trainer-like folder committed twice, ``log(all=True)``, byte-identical
checkouts, branch, tag, reset, reflog, gc, fsck — and what a served repository cannot do
raises ``mdl.Unsupported`` saying what to do instead."""

import pytest

import mdl
from conftest import ADMIN_TOKEN, WRITE_TOKEN, mdl as run_mdl, tree_bytes


def trainer_folder(path, seed):
    """A folder as a Trainer writes one: weights, optimizer state, RNG state, JSON."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    path.mkdir(parents=True)
    save_file({"w": rng.standard_normal((64, 32)).astype(np.float32)}, str(path / "model.safetensors"))
    save_file({"exp_avg": rng.standard_normal((64, 32)).astype(np.float32)}, str(path / "optimizer.safetensors"))
    (path / "rng_state.pth").write_bytes(rng.bytes(1500))
    (path / "trainer_state.json").write_text(f'{{"global_step": {seed}}}\n')


@pytest.fixture(params=["local", "served", "bucket"])
def place(request, tmp_path):
    """A fresh repository on one backend, opened as a user would: ``mdl.open(location)``."""
    if request.param == "bucket":
        base = request.getfixturevalue("bucket")
        location = f"{base}/journey"
        return mdl.open(location, create=True)
    folder = tmp_path / "repo"
    run_mdl("init", folder)
    if request.param == "local":
        return mdl.open(folder)
    server = request.getfixturevalue("serve")(folder)
    return mdl.open(f"{server.base}/repo", WRITE_TOKEN)


def test_the_same_journey_on_every_backend(place, tmp_path):
    one, two = tmp_path / "checkpoint-1", tmp_path / "checkpoint-2"
    trainer_folder(one, 1)
    trainer_folder(two, 2)
    c1 = place.commit(one, message="one", step=1)
    c2 = place.commit(two, message="two", step=2)
    assert place.resolve("HEAD") == c2.id

    place.branch("exp", c1.id)
    place.tag("v1", c1.id, message="the first")
    assert [(t.name, t.target) for t in place.tags()] == [("v1", c1.id)]
    assert sorted(b.name for b in place.branches()) == ["exp", "main"]
    assert [e.id for e in place.log(all=True)] == [c2.id, c1.id]

    for rev, folder in [("main", two), ("v1", one), ("exp", one)]:
        out = tmp_path / f"out-{rev}"
        place.checkout(rev, out)
        assert tree_bytes(out) == tree_bytes(folder), (place.backend, rev)

    moved = place.reset("v1")
    assert (moved["from"], moved["to"]) == (c2.id, c1.id)
    assert place.log()[0].id == c1.id
    assert place.reflog()["entries"][0]["new"] == c1.id
    place.reset(c2.id)
    place.delete_branch("exp", force=True)
    place.delete_tag("v1")
    place.gc(prune_older_than="0s")
    out = tmp_path / "after-gc"
    place.checkout("main~1", out)
    assert tree_bytes(out) == tree_bytes(one)
    assert place.fsck()["problems"] == []
    assert place.config()["delta.max_depth"] == "16"

    if place.backend != "served":  # refused there: test_a_served_repository_says_what_it_cannot_do
        # Live state, stored through the same operations as the commits above.
        import numpy as np

        w = np.random.default_rng(4).standard_normal((16, 8)).astype(np.float32)
        live = place.commit_state({"w": w}, step=4, message="live").wait()
        assert place.resolve("HEAD") == live.id
        back = place.load_state(live.id, framework="numpy")
        assert back.step == 4 and back.model["w"].tobytes() == w.tobytes()


def test_a_served_repository_says_what_it_cannot_do(tmp_path, serve):
    folder = tmp_path / "repo"
    run_mdl("init", folder)
    server = serve(folder)
    repo = mdl.open(f"{server.base}/repo", WRITE_TOKEN)
    assert repo.backend == "served"
    trainer_folder(tmp_path / "ckpt", 3)
    first = repo.commit(tmp_path / "ckpt", step=3)
    import numpy as np

    with pytest.raises(mdl.Unsupported) as refused:
        repo.commit_state({"w": np.zeros(4, dtype=np.float32)}, step=4)
    assert refused.value.code == "unsupported"
    assert "push" in str(refused.value)
    with pytest.raises(mdl.Unsupported):
        repo.load("HEAD")
    # The refusals changed nothing.
    assert [e.id for e in repo.log(all=True)] == [first.id]


def test_a_server_of_a_folder_creates_repositories_for_an_admin(tmp_path, serve, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    server = serve(root, root=True)
    url = f"{server.base}/run-7"
    # A writer may not create one; nothing is made.
    with pytest.raises(mdl.PermissionDenied) as denied:
        mdl.open(url, WRITE_TOKEN, create=True)
    assert denied.value.code == "forbidden"
    assert not (root / "run-7").exists()
    made = mdl.open(url, ADMIN_TOKEN, create=True)
    assert made.backend == "served"
    assert (root / "run-7" / ".mdl").is_dir()
    # Once it exists, a writer's create=True opens it, and commits go in.
    repo = mdl.open(url, WRITE_TOKEN, create=True)
    trainer_folder(tmp_path / "ckpt", 5)
    first = repo.commit(tmp_path / "ckpt", step=5)
    assert [e.id for e in made.log()] == [first.id]
    monkeypatch.setenv("MDL_TOKEN", ADMIN_TOKEN)
    with pytest.raises(mdl.Conflict):
        mdl.init(url)
