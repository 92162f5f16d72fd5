"""PyTorch Lightning with the package's CheckpointIO plugin: every checkpoint is a commit,
Lightning's bookkeeping works on the pointer files, and a run resumed from one continues
exactly like the uninterrupted run."""

import json

import lightning as L
import torch

import mdl
from mdl.lightning import MdlCheckpointIO


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 16, generator=g)
    y = x.sum(dim=1, keepdim=True)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def fit(root, repo, epochs, ckpt_path=None):
    L.seed_everything(0, verbose=False)
    model = Regression()
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=root / "ckpt", every_n_epochs=1, save_top_k=-1, save_last=True, monitor="train_loss"
    )
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        plugins=[MdlCheckpointIO(repo, branch="lit")],
        callbacks=[checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, data(), ckpt_path=ckpt_path)
    return model, trainer


def test_lightning_saves_to_and_resumes_from_mdl(tmp_path):
    repo = mdl.init(tmp_path / "repo")
    straight, _ = fit(tmp_path / "a", repo, epochs=4)
    # One commit per checkpoint (every epoch, plus last.ckpt saved as its own commit).
    log = repo.log("lit")
    steps = [e.step for e in log]
    assert {8, 16, 24, 32} <= set(steps), steps
    pointers = sorted((tmp_path / "a" / "ckpt").iterdir())
    assert any(p.name == "last.ckpt" for p in pointers)
    for p in pointers:
        pointer = json.loads(p.read_text())
        assert pointer["commit"] in {e.id for e in log}, p
    # Each commit records the monitored metric as it was at that save.
    scored = [e for e in log if "train_loss" in e.metrics]
    assert {8, 16, 24, 32} <= {e.step for e in scored}, [(e.step, e.metrics) for e in log]
    assert all(e.metrics["train_loss"] >= 0 for e in scored)

    # A fresh run resumed from epoch 2's checkpoint ends exactly like the uninterrupted one.
    epoch2 = next(p for p in pointers if p.name.startswith("epoch=1-"))
    resumed, trainer = fit(tmp_path / "b", repo, epochs=4, ckpt_path=str(epoch2))
    assert trainer.global_step == 32
    for (k, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), k

    # The checkpoint's content is in the commit: the model's weights, and the optimizer's
    # state as Lightning saved it.
    state = repo.load_state(json.loads(epoch2.read_text())["commit"])
    assert set(state.model) == set(straight.state_dict())
    assert state.extra["checkpoint"]["global_step"] == 16
    assert "optimizer_states" in state.extra["checkpoint"]
