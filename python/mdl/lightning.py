"""PyTorch Lightning: a ``CheckpointIO`` plugin that saves checkpoints as mdl commits.

::

    from mdl.lightning import MdlCheckpointIO
    trainer = Trainer(plugins=[MdlCheckpointIO("runs/repo")])
    trainer.fit(model)                      # every checkpoint is a commit
    trainer.fit(model, ckpt_path="last")    # resumes from one

Lightning still sees a file at each checkpoint path: a small pointer (JSON naming the
repository and the commit) instead of the ``torch.save`` archive, so ``ModelCheckpoint``'s
bookkeeping (top-k, ``last.ckpt``, resuming by path) works unchanged. Removing a checkpoint
removes its pointer; the commit stays in the history. Importing this module imports
``lightning``; ``import mdl`` alone does not.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from lightning.pytorch.plugins.io import CheckpointIO

from ._mdl import MdlError
from ._repo import CommitHandle, Repository, as_repository

__all__ = ["MdlCheckpointIO"]

POINTER_KIND = "mdl-lightning-checkpoint"


class MdlCheckpointIO(CheckpointIO):
    """Saves Lightning checkpoints into an mdl repository, in the background.

    ``repo``: a :class:`mdl.Repository` or a path (created if missing); ``branch``,
    ``lossy``, ``epsilon``: as for :meth:`mdl.Repository.commit_state`. The model's
    ``state_dict`` is stored as ``model.safetensors``; the rest of the checkpoint (optimizer
    states, loops, callbacks) as the commit's extra state.
    """

    def __init__(
        self,
        repo: Repository | str | os.PathLike[str],
        *,
        branch: str | None = None,
        lossy: bool | None = None,
        epsilon: float | None = None,
    ):
        self.repo = as_repository(repo)
        self.branch = branch
        self.lossy = lossy
        self.epsilon = epsilon
        # Pointers written before their commit's id was known.
        self._unsettled: list[tuple[CommitHandle, str]] = []

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError("MdlCheckpointIO takes no storage_options")
        path = os.fspath(path)
        rest = {k: v for k, v in checkpoint.items() if k != "state_dict"}
        token = uuid.uuid4().hex
        step = checkpoint.get("global_step")
        handle = self.repo.commit_state(
            checkpoint.get("state_dict", {}),
            extra={"checkpoint": rest, "token": token},
            step=step,
            metrics=_monitored(checkpoint),
            message=os.path.basename(path),
            branch=self.branch,
            lossy=self.lossy,
            epsilon=self.epsilon,
        )
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._write_pointer(path, {"kind": POINTER_KIND, "repo": self.repo.root, "token": token})
        self._unsettled.append((handle, path))
        self._settle(block=False)

    def load_checkpoint(
        self, path: Any, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        # Nothing is unpickled, whatever ``weights_only`` says.
        self._settle(block=True)
        with open(os.fspath(path)) as f:
            pointer = json.load(f)
        if pointer.get("kind") != POINTER_KIND:
            raise ValueError(f"{path} is not an mdl checkpoint pointer")
        repo = self.repo if pointer["repo"] == self.repo.root else Repository.open(pointer["repo"])
        commit = pointer.get("commit") or self._find(repo, pointer["token"])
        state = repo.load_state(commit)
        checkpoint = dict(state.extra["checkpoint"])
        checkpoint["state_dict"] = state.model
        if map_location is not None:
            import torch

            checkpoint = _map(checkpoint, lambda t: t.to(map_location) if isinstance(t, torch.Tensor) else t)
        return checkpoint

    def remove_checkpoint(self, path: Any) -> None:
        path = os.fspath(path)
        self._unsettled = [(h, p) for h, p in self._unsettled if p != path]
        if os.path.exists(path):
            os.remove(path)

    def teardown(self) -> None:
        self._settle(block=True)

    def _settle(self, block: bool) -> None:
        """Writes the commit id into the pointers of finished commits (raises a failure)."""
        still = []
        for handle, path in self._unsettled:
            if not (block or handle.done()):
                still.append((handle, path))
                continue
            result = handle.wait()
            if os.path.exists(path):
                with open(path) as f:
                    pointer = json.load(f)
                pointer["commit"] = result.id
                self._write_pointer(path, pointer)
        self._unsettled = still

    @staticmethod
    def _write_pointer(path: str, pointer: dict) -> None:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(pointer, f)
        os.replace(tmp, path)

    @staticmethod
    def _find(repo: Repository, token: str) -> str:
        """The commit a pointer written before its commit's id was known refers to."""
        repo.wait()
        for ref in repo.branches():
            for entry in repo.log(ref.name):
                try:
                    extra = repo._state_document(entry.id).get("extra")
                except MdlError:
                    continue  # not a live-state commit
                if isinstance(extra, dict) and extra.get("token") == token:
                    return entry.id
        raise ValueError(f"no commit holds the checkpoint {token} (was it committed?)")


def _monitored(checkpoint: dict[str, Any]) -> dict[str, float]:
    """What a Lightning checkpoint records of the run's metrics: the value each
    ``ModelCheckpoint`` monitors, as it was when this checkpoint was saved (``{monitor:
    score}``). Lightning keeps its logged history in its loggers, not in checkpoints."""
    out = {}
    for state in (checkpoint.get("callbacks") or {}).values():
        if not isinstance(state, dict):
            continue
        monitor, score = state.get("monitor"), state.get("current_score")
        if isinstance(monitor, str) and score is not None:
            try:
                out[monitor] = float(score)
            except (TypeError, ValueError):
                continue
    return out


def _map(value: Any, f: Any) -> Any:
    if isinstance(value, dict):
        return {k: _map(v, f) for k, v in value.items()}
    if isinstance(value, list):
        return [_map(v, f) for v in value]
    if isinstance(value, tuple):
        return tuple(_map(v, f) for v in value)
    return f(value)
