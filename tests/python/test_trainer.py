"""A real transformers Trainer checkpoint (a tiny GPT-2 built from a config, random weights, no
download): committed as a folder, checked out byte for byte, and resumed from; and the same
through the package's TrainerCallback."""

import pytest

import mdl as mdl_package
from mdl.transformers import MdlCallback, checkout_checkpoint

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from conftest import mdl, tree_bytes


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, 96, (n, 24), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def trainer(out, max_steps=6, callbacks=None, use_cpu=True):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    # Small shards, as large models are saved: model-0000i-of-0000n.safetensors and the index.
    save = model.save_pretrained
    model.save_pretrained = lambda *a, **k: save(*a, **{**k, "max_shard_size": "60KB"})
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        save_steps=3,
        eval_strategy="steps",
        eval_steps=3,
        logging_steps=1,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        weight_decay=0.01,
        report_to=[],
        use_cpu=use_cpu,
        seed=0,
        data_seed=0,
    )
    return Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(64, 1),
        eval_dataset=Tokens(8, 2),
        callbacks=callbacks,
    )


def test_trainer_checkpoint_commits_checks_out_and_resumes(tmp_path, repo):
    first = trainer(tmp_path / "run")
    first.train()
    ck = tmp_path / "run" / "checkpoint-3"
    names = {p.name for p in ck.iterdir()}
    assert "model.safetensors.index.json" in names, names
    assert any(n.startswith("model-00002-of-") for n in names), names
    assert {"optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth", "training_args.bin"} <= names

    mdl("-C", repo, "commit", ck, "-m", "checkpoint-3")
    mdl("-C", repo, "commit", tmp_path / "run" / "checkpoint-6", "-m", "checkpoint-6")
    # Step, loss and eval loss come from trainer_state.json.
    log = mdl("-C", repo, "--json", "log")
    assert [e["step"] for e in log] == [6, 3]
    assert "loss" in log[1]["metrics"] and "eval_loss" in log[1]["metrics"]
    shown = mdl("-C", repo, "--json", "show", "main~1")
    formats = {f["path"]: f["format"] for f in shown["files"]}
    assert formats["optimizer.pt"] == "torch" and formats["scheduler.pt"] == "torch"
    assert formats["rng_state.pth"] == "torch" and formats["training_args.bin"] == "torch"
    assert formats["trainer_state.json"] == "bytes"

    out = tmp_path / "checked-out"
    mdl("-C", repo, "checkout", "main~1", "-o", out)
    assert tree_bytes(out) == tree_bytes(ck)

    # Resuming from the checkout continues exactly as resuming from the original.
    runs = {}
    for name, source in [("original", ck), ("mdl", out)]:
        t = trainer(tmp_path / f"resume-{name}")
        t.train(resume_from_checkpoint=str(source))
        losses = [e["loss"] for e in t.state.log_history if "loss" in e]
        runs[name] = (losses, {k: v.clone() for k, v in t.model.state_dict().items()})
    # The history holds the checkpoint's 3 logged steps and the 3 trained after resuming.
    assert runs["original"][0] == runs["mdl"][0] and len(runs["mdl"][0]) == 6
    for k, v in runs["original"][1].items():
        assert torch.equal(v, runs["mdl"][1][k]), k


def resumed(tmp_path, name, source, max_steps=9):
    """Trains from checkpoint ``source`` up to ``max_steps``: the logged losses and the weights."""
    t = trainer(tmp_path / f"resume-{name}", max_steps=max_steps)
    t.train(resume_from_checkpoint=str(source))
    losses = [e["loss"] for e in t.state.log_history if "loss" in e]
    return losses, {k: v.clone() for k, v in t.model.state_dict().items()}


def test_the_callback_commits_every_save_and_a_trainer_resumes_from_any_revision(tmp_path):
    repo = mdl_package.init(tmp_path / "repo")
    callback = MdlCallback(repo)
    run = tmp_path / "run"
    trainer(run, max_steps=9, callbacks=[callback]).train()
    # One commit per save, on the run's branch, with the Trainer's step and metrics.
    assert len(callback.handles) == 3 and all(h.done() for h in callback.handles)
    log = repo.log("run")
    assert [e.step for e in log] == [9, 6, 3]
    # The new repository's first branch is the one HEAD follows: its history shows as is.
    assert repo.head == "run" and repo.log() == log
    assert mdl("-C", repo.root, "log", "--json")[0]["step"] == 9
    assert [e.message for e in log] == ["checkpoint-9", "checkpoint-6", "checkpoint-3"]
    for e in log:
        assert {"loss", "eval_loss", "learning_rate"} <= set(e.metrics), e.metrics
    assert log[1].metrics["eval_loss"] == next(
        x["eval_loss"] for x in reversed(trainer_state(run / "checkpoint-6")) if "eval_loss" in x
    )

    # Resuming from a checkout of the middle commit continues exactly as from the folder.
    folder = checkout_checkpoint(repo, "run~1", tmp_path / "from-mdl")
    resumes_alike(tmp_path, run / "checkpoint-6", folder)


def resumes_alike(tmp_path, original, folder):
    """Training on to step 9 from ``folder`` logs the same losses and ends with the same weights
    as from the Trainer's own ``original``."""
    a, b = resumed(tmp_path, "original", original), resumed(tmp_path, "mdl", folder)
    assert a[0] == b[0] and len(a[0]) == 9
    for k, v in a[1].items():
        assert torch.equal(v, b[1][k]), k


def test_the_callback_deletes_checkpoints_once_durable(tmp_path):
    repo = mdl_package.init(tmp_path / "repo")
    run = tmp_path / "run"
    callback = MdlCallback(repo, branch="small", lossy=True, delete_checkpoints=True)
    trainer(run, max_steps=6, callbacks=[callback]).train()
    assert not any(p.name.startswith("checkpoint-") for p in run.iterdir())
    log = repo.log("small")
    assert [e.step for e in log] == [6, 3]
    out = tmp_path / "out"
    repo.checkout("small", out)
    assert (out / "trainer_state.json").exists()


def trainer_state(folder):
    import json

    return json.loads((folder / "trainer_state.json").read_text())["log_history"]


def test_the_state_source_commits_live_state_and_resumes_as_the_trainers_own_folder(tmp_path):
    repo = mdl_package.init(tmp_path / "repo")
    run = tmp_path / "run"
    trainer(run, max_steps=9, callbacks=[MdlCallback(repo, source="state")]).train()
    # The Trainer wrote no checkpoint folder: each save was committed from the live state.
    assert not run.exists() or not any(p.name.startswith("checkpoint-") for p in run.iterdir())
    log = repo.log("run")
    assert [e.step for e in log] == [9, 6, 3]
    # The new repository's first branch is the one HEAD follows: its history shows as is.
    assert repo.head == "run" and repo.log() == log
    assert mdl("-C", repo.root, "log", "--json")[0]["step"] == 9
    assert [e.message for e in log] == ["checkpoint-9", "checkpoint-6", "checkpoint-3"]
    assert {f["path"] for f in repo.show("run~1")["files"]} >= {"model.safetensors", "optimizer.safetensors"}

    # The same training, saved by the Trainer itself.
    reference = tmp_path / "reference"
    trainer(reference, max_steps=9).train()
    ck = reference / "checkpoint-6"
    # The commit's metrics include the evaluation run at the save, as the Trainer's folder does.
    assert log[1].metrics["eval_loss"] == next(
        x["eval_loss"] for x in reversed(trainer_state(ck)) if "eval_loss" in x
    )

    folder = checkout_checkpoint(repo, "run~1", tmp_path / "from-state")
    written = {p.name for p in (tmp_path / "from-state").iterdir()}
    assert written == {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"}
    assert untimed(tmp_path / "from-state") == untimed(ck)
    # Resuming from it continues exactly as resuming from the Trainer's own folder.
    resumes_alike(tmp_path, ck, folder)


def test_checkout_checkpoint_refuses_a_non_empty_folder_and_foreign_state(tmp_path):
    repo = mdl_package.init(tmp_path / "repo")
    run = tmp_path / "run"
    trainer(run, max_steps=3, callbacks=[MdlCallback(repo, source="state")]).train()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("keep")
    with pytest.raises(FileExistsError):
        checkout_checkpoint(repo, "run", busy)
    assert [p.name for p in busy.iterdir()] == ["x"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("busy")] == ["busy"]
    # A live-state commit that the callback did not make has no Trainer folder to become.
    repo.commit_state({"w": torch.ones(3)}, branch="other", wait=True)
    with pytest.raises(ValueError, match="not saved by MdlCallback"):
        checkout_checkpoint(repo, "other", tmp_path / "nope")
    assert not (tmp_path / "nope").exists()
    with pytest.raises(ValueError, match="source must be one of"):
        MdlCallback(repo, source="files")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_state_source_commits_cuda_state_as_trained(tmp_path):
    repo = mdl_package.init(tmp_path / "repo")
    t = trainer(tmp_path / "run", max_steps=3, callbacks=[MdlCallback(repo, source="state")], use_cpu=False)
    t.train()
    assert next(t.model.parameters()).is_cuda
    committed = repo.load_state("run").model
    for k, v in t.model.state_dict().items():
        assert torch.equal(v.cpu(), committed[k]), k


def untimed(folder):
    """A folder's trainer_state.json without the times, which differ from run to run."""
    import json

    state = json.loads((folder / "trainer_state.json").read_text())
    state["log_history"] = [
        {k: v for k, v in e.items() if not k.endswith(("_runtime", "_per_second"))} for e in state["log_history"]
    ]
    return state


def test_a_trainer_commits_into_a_folder_that_mdl_serve_serves(tmp_path, serve):
    """The set-up a team uses: `mdl serve` on the training repository, training committing into
    it on the same machine. Every save becomes a commit without waiting for the server, the
    server answers with them, and a checkout resumes exactly as the Trainer's own folder."""
    import json
    import time
    import urllib.request

    from conftest import READ_TOKEN

    repo = mdl_package.init(tmp_path / "repo")
    server = serve(tmp_path / "repo")
    run = tmp_path / "run"
    started = time.monotonic()
    trainer(run, max_steps=9, callbacks=[MdlCallback(str(tmp_path / "repo"))]).train()
    assert time.monotonic() - started < 30, "training waited for the server's lock"
    assert [e.step for e in repo.log("run")] == [9, 6, 3]
    # Live state too, while the server is up.
    done = repo.commit_state({"w": torch.ones(3)}, branch="live", wait=True)
    assert repo.log("live")[0].id == done.id

    request = urllib.request.Request(
        f"{server.base}/v1/repos/repo/log?rev=run", headers={"Authorization": f"Bearer {READ_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        served = json.load(answer)
    assert [e["step"] for e in served] == [9, 6, 3]

    folder = checkout_checkpoint(repo, "run~1", tmp_path / "from-served")
    resumes_alike(tmp_path, run / "checkpoint-6", folder)
