"""The `mdl` package in-process: live-state commits round-trip byte for byte in every dtype,
lossy commits carry their recorded error, background failures surface and change nothing,
a killed training process leaves every earlier commit intact."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import mdl

from conftest import mdl as run_mdl
from conftest import tree_bytes

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    # The format's C64 and F8_E8M0, which the CLI committed and the package once refused.
    torch.complex64,
    torch.float8_e8m0fnu,
]


def as_bytes(t):
    """A tensor's bytes (NaN-safe equality)."""
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 32)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def train(model, opt, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 32, generator=g)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return loss.item()


def test_live_state_round_trips_byte_for_byte(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    model, opt = model_and_optimizer()
    loss = train(model, opt, 3)
    g = torch.Generator().manual_seed(7)
    # Every dtype, odd shapes, a 0-d tensor, an empty one, a non-contiguous view, NaNs.
    weird = {
        f"t_{str(d).removeprefix('torch.')}": (torch.randn(5, 3, 7, generator=g) * 50).to(d)
        for d in DTYPES
    }
    weird["scalar"] = torch.tensor(3.5)
    weird["empty"] = torch.empty(0, 4)
    weird["transposed"] = torch.randn(6, 4, generator=g).t()
    weird["nan"] = torch.tensor([float("nan"), float("inf"), -0.0])
    extra = {
        "rng": torch.get_rng_state(),
        "np_rng": np.random.default_rng(3).bit_generator.state,
        "numpy": np.arange(12, dtype=np.int32).reshape(3, 4),
        "schedule": {"last_epoch": 3, "lrs": (1e-2, 5e-3), "nested": [1, None, True, "x"]},
        "by_index": {0: "a", 1: "b"},
        "inf": float("inf"),
        "weird": weird,
    }
    handle = repo.commit_state(model, opt, extra, step=3, metrics={"loss": loss}, message="m")
    result = handle.wait()
    assert handle.done() and result.id == repo.resolve("main")
    assert result.lossy_tensors == 0

    state = repo.load_state(result.id)
    assert state.step == 3 and state.commit == result.id
    for original, back in ((model.state_dict(), state.model), (weird, state.extra["weird"])):
        assert list(back) == list(original)
        for name, t in original.items():
            assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
            assert as_bytes(back[name]) == as_bytes(t), name
    osd, back = opt.state_dict(), state.optimizer
    assert back["param_groups"] == osd["param_groups"]
    assert set(back["state"]) == set(osd["state"])
    for i, per in osd["state"].items():
        for k, v in per.items():
            assert as_bytes(back["state"][i][k]) == as_bytes(v), (i, k)
    assert torch.equal(state.extra["rng"], extra["rng"])
    assert np.array_equal(state.extra["numpy"], extra["numpy"])
    assert state.extra["schedule"] == extra["schedule"]
    assert state.extra["by_index"] == extra["by_index"]
    assert state.extra["inf"] == float("inf")
    assert state.extra["np_rng"] == extra["np_rng"]

    # load_state_dict accepts them, and training continues exactly as it would have.
    model2, opt2 = model_and_optimizer(seed=99)
    repo.load_state(result.id, model2, opt2)
    assert train(model, opt, 2, seed=5) == train(model2, opt2, 2, seed=5)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)

    # The moments were paired with their parameters by name, as the client knows them.
    pairs = repo.show(result.id)["pairs"]
    assert {"param": "model.safetensors: 0.weight",
            "exp_avg": "optimizer.safetensors: 0.weight.exp_avg",
            "exp_avg_sq": "optimizer.safetensors: 0.weight.exp_avg_sq",
            "source": "client"} in pairs

    # load: only what is asked for, sharing memory with the decoded bytes; numpy too.
    got = repo.load(result.id, ["0.weight"], file="model.safetensors")
    assert list(got) == ["0.weight"]
    assert as_bytes(got["0.weight"]) == as_bytes(state.model["0.weight"])
    arr = repo.load(result.id, ["weird.t_int16"], framework="numpy")["weird.t_int16"]
    assert arr.dtype == np.int16 and arr.tobytes() == as_bytes(weird["t_int16"])
    with pytest.raises(KeyError):
        repo.load(result.id, ["nope"])


def test_a_blocking_commit_reads_the_tensors_in_place_and_stores_what_a_staged_one_does(tmp_path):
    model, opt = model_and_optimizer()
    train(model, opt, 2)
    g = torch.Generator().manual_seed(11)
    weird = {f"t_{str(d).removeprefix('torch.')}": (torch.randn(4, 9, generator=g) * 50).to(d) for d in DTYPES}
    weird["empty"] = torch.empty(0, 4)
    weird["transposed"] = torch.randn(6, 4, generator=g).t()
    extra = {"numpy": np.arange(12, dtype=np.int32).reshape(3, 4), "weird": weird}
    staged, in_place = mdl.init(tmp_path / "staged"), mdl.init(tmp_path / "in-place")
    for step in (1, 2):
        a = staged.commit_state(model, opt, extra, step=step).wait()
        b = in_place.commit_state(model, opt, extra, step=step, wait=True)
        records = lambda repo, id: sorted(
            (t["file"], t["name"], t["id"], t["codec"], t["stored_bytes"]) for t in repo.show(id)["tensors"]
        )
        assert records(in_place, b.id) == records(staged, a.id)
        train(model, opt, 1, seed=step)
    # Nothing was staged for the blocking commits: the tensors were read where they lie.
    assert in_place._staging._buffers == {} and staged._staging._buffers
    back = in_place.load_state("main~1")
    first = staged.load_state("main~1")
    for name, t in first.model.items():
        assert as_bytes(back.model[name]) == as_bytes(t), name
    for name, t in first.extra["weird"].items():
        assert as_bytes(back.extra["weird"][name]) == as_bytes(t), name
    assert np.array_equal(back.extra["numpy"], extra["numpy"])
    # A lazily conjugated view is stored as its values, blocking or not.
    z = torch.randn(3, 2, dtype=torch.complex64, generator=g)
    for wait in (True, False):
        done = in_place.commit_state({"z": z.conj()}, wait=wait)
        got = in_place.load_state(done.id if wait else done.wait().id).model["z"]
        assert torch.equal(got, z.conj().resolve_conj())


def test_lossy_commits_carry_their_recorded_error(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
    train_big = lambda: [  # noqa: E731
        (model(torch.randn(32, 256)).pow(2).mean().backward(), opt.step(), opt.zero_grad())
        for _ in range(3)
    ]
    train_big()
    first = repo.commit_state(model, opt, step=3, metrics={"loss": 1.0}).wait()
    train_big()
    second = repo.commit_state(model, opt, step=6, metrics={"loss": 1.0}, lossy=True).wait()
    assert first.lossy_tensors == 0 and second.lossy_tensors > 0
    shown = repo.show(second.id)
    lossy = [t for t in shown["tensors"] if t["lossy"]]
    assert len(lossy) == second.lossy_tensors
    # The live optimizer's betas, as the state's param_groups carry them, priced the weights.
    assert shown["adam_betas"] == "0.9,0.98 (recorded in mdl-state.json)"
    # Each lossy tensor records its error; the decoded tensor differs from the committed one
    # by exactly what was recorded.
    state = repo.load_state(second.id)
    originals = {"model.safetensors": model.state_dict()}
    checked = 0
    for t in lossy:
        info = t["lossy_info"]
        assert info["rel_error"] > 0 and info["max_abs_error"] > 0
        orig = originals.get(t["file"], {}).get(t["name"])
        if orig is None:
            continue
        back = state.model[t["name"]].double()
        diff = back - orig.double()
        assert diff.abs().max().item() == pytest.approx(info["max_abs_error"], rel=1e-4)
        assert (diff.norm() / orig.double().norm()).item() == pytest.approx(info["rel_error"], rel=1e-3)
        checked += 1
    assert checked > 0
    # The series by the lossy papers' accountings: every weight and both moments, each commit.
    counted = repo.stats(lossy=True)["lossy"]
    n = sum(p.numel() for p in model.parameters())
    assert counted["commits"] == 2
    assert counted["weights"]["elements"] == 2 * n
    assert counted["exp_avg"]["elements"] == counted["exp_avg_sq"]["elements"] == 2 * n
    assert counted["dynaquant"] > 1 and counted["excp"] > 1
    assert "lossy" not in repo.stats()


@contextlib.contextmanager
def records_unwritable(repo):
    """The repository's records cannot be written meanwhile (root ignores permissions, so the
    objects folder is replaced by a file)."""
    objects = os.path.join(repo.root, ".mdl", "objects")
    moved = objects + ".away"
    os.rename(objects, moved)
    with open(objects, "w") as f:
        f.write("not a folder")
    try:
        yield
    finally:
        os.remove(objects)
        os.rename(moved, objects)


def test_a_background_failure_surfaces_and_changes_nothing(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    model, opt = model_and_optimizer()
    first = repo.commit_state(model, opt, step=1).wait()
    before = run_mdl("fsck", "-C", repo.root)
    with records_unwritable(repo):
        train(model, opt, 1)
        handle = repo.commit_state(model, opt, step=2)
        with pytest.raises(mdl.MdlError, match="background commit failed"):
            handle.wait()
        with pytest.raises(mdl.MdlError, match="background commit failed"):
            handle.wait()  # as often as asked
        # ... and on the next call, which commits nothing.
        with pytest.raises(mdl.MdlError, match="background commit failed"):
            repo.commit_state(model, opt, step=3)
    assert [e.id for e in repo.log()] == [first.id]
    assert run_mdl("fsck", "-C", repo.root).returncode == before.returncode == 0
    # The one after goes ahead.
    assert repo.commit_state(model, opt, step=4).wait().id == repo.resolve("HEAD")


def test_a_loop_reads_its_own_commits_at_once(tmp_path):
    # The README's quick start as pasted: commits that return at once, then a read of main~2.
    repo = mdl.open(tmp_path / "runs" / "gpt", create=True)
    model, opt = model_and_optimizer()
    committed = []
    for step in range(3):
        train(model, opt, 1)
        committed.append({k: v.clone() for k, v in model.state_dict().items()})
        repo.commit_state(model, opt, step=step, metrics={"loss": 1.0 / (step + 1)})
    assert [e.step for e in repo.log()] == [2, 1, 0]
    fresh, fresh_opt = model_and_optimizer()
    state = repo.load_state("main~2", fresh, fresh_opt)
    assert state.step == 0
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, committed[0][k]), k
    # A failure of the commit in flight is still reported by the next commit, not eaten by
    # a read.
    with records_unwritable(repo):
        handle = repo.commit_state(model, opt, step=3)
        repo.resolve("HEAD")  # waits for it to fail
        assert handle.done()
    assert [e.step for e in repo.log()] == [2, 1, 0]
    with pytest.raises(mdl.MdlError, match="background commit failed"):
        repo.commit_state(model, opt, step=4)
    assert repo.commit_state(model, opt, step=5).wait().id == repo.resolve("HEAD")


def test_a_loop_on_its_own_branch_in_a_new_repository_is_where_head_is(tmp_path):
    # A loop that names its branch (the README's experiments): HEAD follows the new
    # repository's first branch, so log, HEAD~N and the CLI show the run with no switch.
    repo = mdl.open(tmp_path / "runs" / "mlp", create=True)
    model, opt = model_and_optimizer()
    for step in range(3):
        train(model, opt, 1)
        repo.commit_state(model, opt, step=step, branch="mlp")
    repo.wait()
    assert repo.head == "mlp"
    assert [e.step for e in repo.log()] == [2, 1, 0]
    assert repo.load_state("HEAD~2", *model_and_optimizer()).step == 0
    assert [e["step"] for e in run_mdl("-C", repo.root, "log", "--json")] == [2, 1, 0]
    # A git habit that names the branch that is not there is told where the history is.
    with pytest.raises(mdl.MdlError, match=r"the branches are mlp \(HEAD\)"):
        repo.load_state("main~2", *model_and_optimizer())


def test_bad_state_is_refused_before_anything_starts(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    with pytest.raises(TypeError, match="no pickles"):
        repo.commit_state({"w": torch.zeros(2)}, extra={"f": object()})
    with pytest.raises(mdl.MdlError, match="branch|name"):
        repo.commit_state({"w": torch.zeros(2)}, branch="bad..name")
    assert repo.log() == []
    assert repo.wait() is None


KILLED = textwrap.dedent(
    """
    import sys, torch, mdl
    repo = mdl.open(sys.argv[1])
    torch.manual_seed(0)
    state = {f"w{i}": torch.randn(1024, 1024) for i in range(24)}
    for step in range(1000):
        for t in state.values():
            t.add_(1e-3)
        h = repo.commit_state(state, step=step)
        if step == 1:
            h.wait()
            print("committed", flush=True)
    """
)


def test_killing_the_process_mid_commit_loses_nothing_committed(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, repo.root], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "committed"
    os.kill(proc.pid, signal.SIGKILL)  # mid-way through a later background commit
    proc.wait()
    log = repo.log()
    assert len(log) >= 2 and [e.step for e in log][-2:] == [1, 0]
    fsck = run_mdl("fsck", "-C", repo.root)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    for e in log:
        assert len(repo.load(e.id, ["w0"])["w0"]) == 1024


def test_pending_commits_finish_at_interpreter_exit(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    script = textwrap.dedent(
        """
        import sys, torch, mdl
        repo = mdl.open(sys.argv[1])
        repo.commit_state({"w": torch.randn(512, 512)}, step=1)
        # exits with the commit in flight
        """
    )
    subprocess.run([sys.executable, "-c", script, repo.root], check=True)
    assert [e.step for e in repo.log()] == [1]


def test_history_refs_and_files(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"layers": 2}))
    from safetensors.torch import save_file

    save_file({"w": torch.randn(64, 64)}, str(ckpt / "model.safetensors"))
    a = repo.commit(ckpt, message="dir", step=10, metrics={"loss": 2.0})
    assert isinstance(a, mdl.CommitResult) and a.tensors >= 1
    repo.tag("v1", message="first")
    repo.branch("exp")
    save_file({"w": torch.randn(64, 64)}, str(ckpt / "model.safetensors"))
    handle = repo.commit(ckpt, branch="exp", step=20, wait=False)
    b = handle.wait()
    assert [e.step for e in repo.log("exp")] == [20, 10]
    assert repo.log("exp")[1].metrics == {"loss": 2.0}
    assert {r.name for r in repo.branches()} == {"main", "exp"}
    assert [(t.name, t.message) for t in repo.tags()] == [("v1", "first")]
    d = repo.diff("v1", b.id)
    assert d and isinstance(d, dict)
    out = tmp_path / "out"
    repo.checkout("exp", out)
    assert json.loads((out / "config.json").read_text()) == {"layers": 2}
    assert [t.name for t in repo.tensors("exp")] == ["w"]
    repo.switch("exp")
    assert repo.head == "exp"
    with pytest.raises(mdl.MdlError, match="unknown revision"):
        repo.log("nope")


def test_a_remote_repository(tmp_path, serve):
    from conftest import READ_TOKEN, WRITE_TOKEN
    from safetensors.torch import save_file

    local = mdl.init(tmp_path / "served")
    model, opt = model_and_optimizer()
    train(model, opt, 1)
    first = local.commit_state(model, opt, step=1, wait=True)
    local.tag("v1")
    server = serve(local.root)
    name = os.path.basename(local.root)
    url = f"{server.base}/{name}"

    reader = mdl.open(url, READ_TOKEN)
    assert isinstance(reader, mdl.Repository) and reader.backend == "served"
    assert [(e.id, e.step) for e in reader.log()] == [(first.id, 1)]
    assert [b.name for b in reader.branches()] == ["main"] and reader.branches()[0].current
    assert [t.name for t in reader.tags()] == ["v1"]
    out = tmp_path / "download"
    reader.checkout("v1", out)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["model.safetensors", "optimizer.safetensors", "mdl-state.json"]
    )
    # A file commit needs a write token; refused with the server's message otherwise.
    ckpt = tmp_path / "c.safetensors"
    save_file({"w": torch.randn(8, 8)}, str(ckpt))
    with pytest.raises(mdl.PermissionDenied):
        reader.commit(ckpt, step=2)
    writer = mdl.open(url, WRITE_TOKEN)
    result = writer.commit(ckpt, step=2, metrics={"loss": 0.5}, branch="uploads")
    assert [e.id for e in writer.log("uploads")][0] == result.id
    assert writer.show(result.id)["step"] == 2
    # A folder goes as one tree, checked out as it was.
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    save_file({"w": torch.randn(4, 4)}, str(tree / "model.safetensors"))
    (tree / "sub" / "notes.txt").write_text("a nested file")
    in_tree = writer.commit(tree, step=3, branch="uploads")
    back = tmp_path / "tree-back"
    writer.checkout(in_tree.id, back)
    assert tree_bytes(back) == tree_bytes(tree)


def test_a_blocking_commit_raises_its_failure_once(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    objects = os.path.join(repo.root, ".mdl", "objects")
    os.rename(objects, objects + ".away")
    with open(objects, "w") as f:
        f.write("not a folder")
    try:
        with pytest.raises(mdl.MdlError, match="background commit failed"):
            repo.commit_state({"w": torch.randn(16, 16)}, step=1, wait=True)
    finally:
        os.remove(objects)
        os.rename(objects + ".away", objects)
    # Raised where the caller waited: the next call goes ahead.
    assert repo.commit_state({"w": torch.randn(16, 16)}, step=2, wait=True).id == repo.resolve("HEAD")
    assert [e.step for e in repo.log()] == [2]


TRAIN = """
import sys, torch, mdl
repo = mdl.open(sys.argv[1], create=True)
repo.commit_state(torch.nn.Linear(4, 4), step=int(sys.argv[2])).wait()
"""


def test_a_commit_records_the_training_codes_git_commit(tmp_path):
    """commit_state from a script in a git work tree records that tree's HEAD, and whether the
    tracked files had changes (`source.git`, `source.dirty`), shown by `mdl log` and `show`."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    git = lambda *a: subprocess.run(["git", "-C", code, *a], check=True, capture_output=True, text=True, env=env).stdout
    git("init", "-q")
    git("add", "train.py")
    git("commit", "-q", "-m", "train")
    head = git("rev-parse", "HEAD").strip()
    repo = tmp_path / "runs"
    # Run from elsewhere: the script's folder is what counts.
    subprocess.run([sys.executable, code / "train.py", repo, "1"], check=True, cwd=tmp_path)
    (code / "train.py").write_text(TRAIN + "# tuned\n")
    subprocess.run([sys.executable, code / "train.py", repo, "2"], check=True, cwd=tmp_path)
    log = run_mdl("-C", repo, "log", "--json")
    assert [e["properties"] for e in log] == [
        {"source.git": head, "source.dirty": "true"},
        {"source.git": head, "source.dirty": "false"},
    ]
    text = run_mdl("-C", repo, "log").stdout
    assert f"[git {head[:8]}+dirty]" in text and f"[git {head[:8]}]" in text
    assert f"git={head}" in run_mdl("-C", repo, "show", "HEAD").stdout
