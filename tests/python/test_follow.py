"""Weight sync (issue 72): a newer commit's state applied in place, only what changed, and a
branch followed as it moves — locally and through a server's long poll."""

import threading
import time

import pytest
import torch

import mdl

from conftest import READ_TOKEN
from conftest import mdl as run_mdl
from test_package import model_and_optimizer, train


def same_state(a, b):
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), k


def same_optimizer(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for i, slots in sa["state"].items():
        for k, v in slots.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(sb["state"][i][k])), (i, k)


def test_a_newer_state_is_written_in_place_and_only_what_changed(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    model, opt = model_and_optimizer()
    train(model, opt, 2)
    a = repo.commit_state(model, opt, step=0).wait().id
    # One tensor of the model changes, and the optimizer's learning rate.
    with torch.no_grad():
        model[3].bias.add_(1.0)
    opt.param_groups[0]["lr"] = 5e-3
    b = repo.commit_state(model, opt, step=1).wait().id

    follower, f_opt = model_and_optimizer(seed=7)
    repo.load_state(a, follower, f_opt)
    places = [t.data_ptr() for t in follower.state_dict().values()]
    state = repo.load_state(b, follower, f_opt, since=a)
    assert state.changed == 1 and state.step == 1 and state.model is None
    same_state(model, follower)
    same_optimizer(opt, f_opt)
    assert [t.data_ptr() for t in follower.state_dict().values()] == places

    # A whole training step later, both take the same step.
    train(model, opt, 1, seed=3)
    train(follower, f_opt, 1, seed=3)
    same_state(model, follower)

    # A model of another shape is refused before anything is written.
    other = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 16)
    )
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match="since=: model.3.weight is float32"):
        repo.load_state(b, other, since=a)
    for k, v in other.state_dict().items():
        assert torch.equal(v, before[k]), k
    with pytest.raises(ValueError, match="pass one"):
        repo.load_state(b, since=a)


def test_a_branch_is_followed_here_and_through_a_server(tmp_path, serve):
    path = tmp_path / "repo"
    trainer = mdl.init(path)
    model, opt = model_and_optimizer()
    first = trainer.commit_state(model, opt, step=0).wait().id

    # Here: each commit of the branch, the model brought to it in place.
    follower, f_opt = model_and_optimizer(seed=5)
    trainer.load_state(first, follower, f_opt)
    watch = trainer.follow("main", follower, f_opt, since=first, timeout=20)

    def commit_later(repo, step):
        time.sleep(0.3)
        train(model, opt, 1, seed=step)
        repo.commit_state(model, opt, step=step).wait()

    t = threading.Thread(target=commit_later, args=(trainer, 1))
    t.start()
    state = next(watch)
    t.join()
    assert state.step == 1 and state.changed > 0
    same_state(model, follower)
    same_optimizer(opt, f_opt)
    assert list(trainer.follow("main", since="main", timeout=0.2)) == []

    # Through a server: its long poll answers when the trainer commits into the folder it
    # serves; the clone fetches and applies.
    server = serve(path)
    clone = tmp_path / "clone"
    run_mdl("--token", READ_TOKEN, "clone", f"{server.base}/repo", clone)
    watcher = mdl.open(clone, token=READ_TOKEN)
    held = watcher.resolve("main")
    remote_follower, r_opt = model_and_optimizer(seed=9)
    watcher.load_state(held, remote_follower, r_opt)
    watch = watcher.follow("main", remote_follower, r_opt, since=held, remote="origin", timeout=20)
    t = threading.Thread(target=commit_later, args=(trainer, 2))
    t.start()
    state = next(watch)
    t.join()
    assert state.step == 2
    assert state.commit == trainer.resolve("main") == watcher.resolve("origin/main")
    same_state(model, remote_follower)
    same_optimizer(opt, r_opt)

    # What came is stored as deltas over what the watcher held, and a model that does not hold
    # what it claims to (one element off) is refused, unchanged: the result is checked against
    # the commit's ids, never taken on trust.
    old = {(t.file, t.name): t.id for t in watcher.tensors(held)}
    over = [
        t for t in watcher.show(state.commit)["tensors"]
        if t["file"] == "model.safetensors" and t["base"] == old.get((t["file"], t["name"]))
    ]
    assert over, "no tensor came as a delta over the version the watcher held"
    wrong, wrong_opt = model_and_optimizer(seed=11)
    watcher.load_state(held, wrong, wrong_opt)
    with torch.no_grad():
        wrong.state_dict()[over[0]["name"]].view(-1)[0] += 1.0
    before = {k: v.clone() for k, v in wrong.state_dict().items()}
    with pytest.raises(mdl.MdlError):
        watcher.load_state(state.commit, wrong, wrong_opt, since=held)
    for k, v in wrong.state_dict().items():
        assert torch.equal(v, before[k]), k


def rl_model(seed=0):
    """bf16 weights, an embedding tied to the output layer (one storage, two names)."""
    torch.manual_seed(seed)
    emb = torch.nn.Embedding(512, 64)
    out = torch.nn.Linear(64, 512, bias=False)
    out.weight = emb.weight
    return torch.nn.Sequential(emb, torch.nn.Linear(64, 64), out).bfloat16()


def rl_step(model, seed):
    """A hundredth of each weight's elements moved by one bf16 step, as an RL update leaves
    them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            flat = p.view(-1).view(torch.int16)
            at = torch.rand(flat.numel(), generator=g) < 0.01
            flat[at] += 1


def test_an_rl_step_is_patched_where_the_weights_lie(tmp_path):
    path = tmp_path / "repo"
    repo = mdl.init(path)
    run_mdl("config", "delta.mode", "forward", cwd=path)
    model = rl_model()
    a = repo.commit_state(model, step=0).wait().id
    rl_step(model, 1)
    b = repo.commit_state(model, step=1).wait().id

    # b stores its weights as masked deltas over a's: what is patched in place.
    old = {t.name: t.id for t in repo.tensors(a)}
    over = [t for t in repo.show(b)["tensors"] if t["base"] == old.get(t["name"])]
    assert len(over) >= 2, repo.show(b)["tensors"]

    follower = rl_model(seed=3)
    repo.load_state(a, follower)
    places = [t.data_ptr() for t in follower.state_dict().values()]
    state = repo.load_state(b, follower, since=a)
    assert state.changed == 3
    same_state(model, follower)
    assert [t.data_ptr() for t in follower.state_dict().values()] == places
    assert follower[0].weight.data_ptr() == follower[2].weight.data_ptr()

    # A model one element off the version it claims to hold: refused, nothing written (every
    # patch is checked against the tensor's bytes before the first is written).
    wrong = rl_model(seed=4)
    repo.load_state(a, wrong)
    with torch.no_grad():
        wrong[1].weight.view(-1)[7] += 1.0
    before = {k: v.clone() for k, v in wrong.state_dict().items()}
    with pytest.raises(mdl.MdlError, match="hash|differ|mismatch"):
        repo.load_state(b, wrong, since=a)
    for k, v in wrong.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_a_follower_of_rl_steps_verifies_them_against_its_own_weights(tmp_path, serve):
    path = tmp_path / "repo"
    trainer = mdl.init(path)
    run_mdl("config", "delta.mode", "forward", cwd=path)
    model = rl_model()
    trainer.commit_state(model, step=0).wait()
    server = serve(path)
    clone = tmp_path / "clone"
    run_mdl("--token", READ_TOKEN, "clone", f"{server.base}/repo", clone)
    watcher = mdl.open(clone, token=READ_TOKEN)
    held = watcher.resolve("main")
    follower = rl_model(seed=3)
    watcher.load_state(held, follower)

    # Each step fetched as a delta over what the follower holds, verified against its weights
    # (lent to the fetch), then patched into them.
    watch = watcher.follow("main", follower, since=held, remote="origin", timeout=20)
    for s in (1, 2):
        rl_step(model, s)
        trainer.commit_state(model, step=s).wait()
        state = next(watch)
        assert state.step == s and state.commit == trainer.resolve("main")
        same_state(model, follower)

    # Weights one element off what they claim: the fetch does not take them on trust (it
    # fetches without them), and the load refuses, leaving them as they were.
    wrong = rl_model(seed=4)
    watcher.load_state(state.commit, wrong)
    with torch.no_grad():
        wrong[1].weight.view(-1)[7] += 1.0
    before = {k: v.clone() for k, v in wrong.state_dict().items()}
    rl_step(model, 3)
    trainer.commit_state(model, step=3).wait()
    with pytest.raises(mdl.MdlError):
        next(watcher.follow("main", wrong, since=state.commit, remote="origin", timeout=20))
    assert watcher.resolve("origin/main") == trainer.resolve("main")
    for k, v in wrong.state_dict().items():
        assert torch.equal(v, before[k]), k
