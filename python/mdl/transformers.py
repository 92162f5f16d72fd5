"""Hugging Face ``transformers``: every checkpoint the ``Trainer`` saves becomes a commit.

::

    from mdl.transformers import MdlCallback
    trainer = Trainer(..., callbacks=[MdlCallback("runs/repo", delete_checkpoints=True)])

To resume from any revision, check it out and hand the folder to the Trainer::

    folder = mdl.transformers.checkout_checkpoint("runs/repo", "my-run~2", "resume/")
    trainer.train(resume_from_checkpoint=folder)

Importing this module imports ``transformers``; ``import mdl`` alone does not.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

from transformers import TrainerCallback

from ._repo import CommitHandle, Repository, as_repository

__all__ = ["MdlCallback", "checkout_checkpoint", "branch_name"]


def branch_name(run_name: str) -> str:
    """A valid branch name made from a run name (other characters become ``-``)."""
    name = re.sub(r"[^A-Za-z0-9._/-]+", "-", run_name).strip("-./") or "run"
    name = re.sub(r"/{2,}", "/", name).replace("..", ".")
    return name


def _metrics(log_history: list[dict]) -> dict[str, float]:
    """The latest value of every number the Trainer logged."""
    out: dict[str, float] = {}
    for entry in log_history:
        for k, v in entry.items():
            if k in ("step", "epoch") or isinstance(v, bool):
                continue
            if isinstance(v, (int, float)):
                out[k] = float(v)
    return out


class MdlCallback(TrainerCallback):
    """Commits each checkpoint folder the Trainer saves.

    ``repo``: a :class:`mdl.Repository` or a path (created if missing). ``branch``: where
    the commits go (default: the run name, ``args.run_name`` or the output folder's name).
    ``lossy`` / ``epsilon``: as for :meth:`mdl.Repository.commit`. With
    ``delete_checkpoints``, a checkpoint folder is deleted once its commit is durable.

    Commits are stored in the background while training goes on (the folder is read in
    before ``on_save`` returns, so the Trainer's own rotation cannot race it); the callback
    waits for the last one when training ends, and raises there if one failed.
    """

    def __init__(
        self,
        repo: Repository | str | os.PathLike[str],
        *,
        branch: str | None = None,
        lossy: bool | None = None,
        epsilon: float | None = None,
        delete_checkpoints: bool = False,
    ):
        self.repo = as_repository(repo)
        self.branch = branch
        self.lossy = lossy
        self.epsilon = epsilon
        self.delete_checkpoints = delete_checkpoints
        self.handles: list[CommitHandle] = []
        self._pending: list[tuple[CommitHandle, str]] = []

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if not state.is_world_process_zero:
            return control
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        branch = self.branch or branch_name(
            args.run_name or os.path.basename(os.path.normpath(args.output_dir))
        )
        handle = self.repo.commit(
            folder,
            message=f"checkpoint-{state.global_step}",
            step=state.global_step,
            metrics=_metrics(state.log_history),
            branch=branch,
            lossy=self.lossy,
            epsilon=self.epsilon,
            wait=False,
        )
        self.handles.append(handle)
        self._pending.append((handle, folder))
        self._collect(block=False)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._collect(block=True)
        return control

    def _collect(self, block: bool) -> None:
        """Settles finished commits (all, when ``block``): raises a failure, deletes folders."""
        still = []
        for handle, folder in self._pending:
            if block or handle.done():
                handle.wait()
                if self.delete_checkpoints:
                    shutil.rmtree(folder, ignore_errors=True)
            else:
                still.append((handle, folder))
        self._pending = still


def checkout_checkpoint(
    repo: Repository | str | os.PathLike[str], rev: str, folder: str | os.PathLike[str]
) -> str:
    """Writes commit ``rev`` into ``folder`` (created; must be empty) for
    ``trainer.train(resume_from_checkpoint=folder)``; returns the folder."""
    repo = repo if isinstance(repo, Repository) else Repository.open(repo)
    repo.checkout(rev, folder)
    return os.fspath(folder)
