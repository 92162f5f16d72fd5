"""Hugging Face ``transformers``: every checkpoint the ``Trainer`` saves becomes a commit.

::

    from mdl.transformers import MdlCallback
    trainer = Trainer(..., callbacks=[MdlCallback("runs/repo", delete_checkpoints=True)])

To resume from any revision, check it out and hand the folder to the Trainer::

    folder = mdl.transformers.checkout_checkpoint("runs/repo", "my-run~2", "resume/")
    trainer.train(resume_from_checkpoint=folder)

With ``source="state"`` the Trainer writes no checkpoint folder: each save is committed from
the live model, optimizer, scheduler and RNG states (CUDA tensors snapshotted on their GPU, as
:meth:`mdl.Repository.commit_state` takes them), and ``checkout_checkpoint`` writes the folder
the Trainer would have written, for resuming.

Importing this module imports ``transformers``; ``import mdl`` alone does not.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import uuid
from typing import Any

import numpy as np

from transformers import TrainerCallback

from . import _state
from ._repo import CommitHandle, Repository, as_repository

__all__ = ["MdlCallback", "checkout_checkpoint", "branch_name"]

SOURCES = ("folder", "state")


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
    """Commits each checkpoint the Trainer saves.

    ``repo``: a :class:`mdl.Repository` or a path (created if missing). ``branch``: where
    the commits go (default: the run name, ``args.run_name`` or the output folder's name).
    ``lossy`` / ``epsilon``: as for :meth:`mdl.Repository.commit`.

    ``source``: what a commit is made from. ``"folder"`` (the default): the checkpoint folder
    the Trainer wrote, read in before ``on_save`` returns (so the Trainer's own rotation cannot
    race it); with ``delete_checkpoints``, a folder is deleted once its commit is durable.
    ``"state"``: the live model, optimizer, LR scheduler and RNG states, taken where they are
    (CUDA tensors snapshotted on their GPU), and the Trainer writes no folder; the snapshot is
    taken once the save's evaluation has run, before the next step changes anything. It needs
    single-process training without an fp16 grad scaler, DeepSpeed or FSDP, and no
    ``load_best_model_at_end`` (those need the Trainer's own folders).

    Commits are stored in the background while training goes on; the callback waits for the
    last one when training ends, and raises there if one failed.
    """

    def __init__(
        self,
        repo: Repository | str | os.PathLike[str],
        *,
        branch: str | None = None,
        lossy: bool | None = None,
        epsilon: float | None = None,
        delete_checkpoints: bool = False,
        source: str = "folder",
    ):
        if source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}, not {source!r}")
        self.repo = as_repository(repo)
        self.branch = branch
        self.lossy = lossy
        self.epsilon = epsilon
        self.delete_checkpoints = delete_checkpoints
        self.source = source
        self.handles: list[CommitHandle] = []
        self._pending: list[tuple[CommitHandle, str | None]] = []
        # A save asked for in state mode and not yet committed: its step, RNG states and
        # control flags as the Trainer would have saved them.
        self._due: dict[str, Any] | None = None
        self._committed_step: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.source == "state":
            _check_state_source(args)
        return control

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._commit_due(args, state, kwargs)
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._take_due(args, state, control)
        return control

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._note_save_point(args, control)
        return control

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._note_save_point(args, control)
        return control

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._commit_due(args, state, kwargs)
        return control

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._commit_due(args, state, kwargs)
        self._take_due(args, state, control)
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if not state.is_world_process_zero or self.source != "folder":
            return control
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        handle = self.repo.commit(
            folder,
            message=f"checkpoint-{state.global_step}",
            step=state.global_step,
            metrics=_metrics(state.log_history),
            branch=self._branch(args),
            lossy=self.lossy,
            epsilon=self.epsilon,
            wait=False,
        )
        self._started(handle, folder)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._commit_due(args, state, kwargs)
        self._collect(block=True)
        return control

    def _branch(self, args: Any) -> str:
        return self.branch or branch_name(
            args.run_name or os.path.basename(os.path.normpath(args.output_dir))
        )

    def _take_due(self, args: Any, state: Any, control: Any) -> None:
        """In state mode, takes over a save the Trainer is about to make. Its tensors are
        read at the next callback, after the save's evaluation (nothing changes them in
        between)."""
        if self.source != "state" or not control.should_save:
            return
        if state.is_world_process_zero and state.global_step != self._committed_step:
            self._due = {"step": state.global_step}
            self._note_save_point(args, control)
        control.should_save = False

    def _note_save_point(self, args: Any, control: Any) -> None:
        """Keeps the RNG states and control flags of a save taken over as the Trainer would
        save them: as they stand once the save's logging and evaluation are done (evaluating
        draws from the RNG), with ``should_save`` set."""
        if self._due is not None:
            flags = control.state()
            flags["args"]["should_save"] = True
            self._due["control"] = flags
            self._due["rng"] = None if args.save_only_model else _rng_states()

    def _commit_due(self, args: Any, state: Any, kwargs: dict) -> None:
        due, self._due = self._due, None
        if due is None:
            return
        trainer_state = dataclasses.asdict(state)  # a deep copy, as the Trainer writes it
        if "TrainerControl" in trainer_state.get("stateful_callbacks", {}):
            trainer_state["stateful_callbacks"]["TrainerControl"] = due["control"]
        saved: dict[str, Any] = {
            "trainer_state": json.dumps(trainer_state, indent=2, sort_keys=True) + "\n",
            "rng": due["rng"],
        }
        scheduler = kwargs.get("lr_scheduler")
        if not args.save_only_model and scheduler is not None:
            saved["scheduler"] = scheduler.state_dict()
        handle = self.repo.commit_state(
            kwargs["model"],
            None if args.save_only_model else kwargs.get("optimizer"),
            {TRAINER_KEY: saved},
            step=due["step"],
            metrics=_metrics(state.log_history),
            message=f"checkpoint-{due['step']}",
            branch=self._branch(args),
            lossy=self.lossy,
            epsilon=self.epsilon,
        )
        self._committed_step = due["step"]
        self._started(handle, None)

    def _started(self, handle: CommitHandle, folder: str | None) -> None:
        self.handles.append(handle)
        self._pending.append((handle, folder))
        self._collect(block=False)

    def _collect(self, block: bool) -> None:
        """Settles finished commits (all, when ``block``): raises a failure, deletes folders."""
        still = []
        for handle, folder in self._pending:
            if block or handle.done():
                handle.wait()
                if self.delete_checkpoints and folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)
            else:
                still.append((handle, folder))
        self._pending = still


# The key of a state commit's extra state that holds what the Trainer's folder adds to the
# model and optimizer.
TRAINER_KEY = "transformers"


def _check_state_source(args: Any) -> None:
    """Raises for Trainer set-ups whose checkpoint a callback cannot take from live state."""
    reasons = []
    if getattr(args, "world_size", 1) > 1:
        reasons.append("several processes (use mdl.dcp for sharded training)")
    if getattr(args, "fp16", False):
        reasons.append("fp16 (the grad scaler's state is not reachable from a callback)")
    if getattr(args, "deepspeed", None) or getattr(args, "fsdp", None):
        reasons.append("DeepSpeed or FSDP")
    if getattr(args, "load_best_model_at_end", False):
        reasons.append("load_best_model_at_end (it reloads the Trainer's own folders)")
    if reasons:
        raise ValueError(f"MdlCallback(source='state') does not support {'; '.join(reasons)}: use source='folder'")


def _rng_states() -> dict[str, Any]:
    """The RNG states a single-process Trainer saves in ``rng_state.pth``, storable (numpy's
    key as a list of ints)."""
    import torch

    kind, key, pos, has_gauss, cached = np.random.get_state()
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, [int(k) for k in key], pos, has_gauss, cached),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.random.get_rng_state()
    return states


def checkout_checkpoint(
    repo: Repository | str | os.PathLike[str], rev: str, folder: str | os.PathLike[str]
) -> str:
    """Writes commit ``rev`` into ``folder`` (created; must be empty) for
    ``trainer.train(resume_from_checkpoint=folder)``; returns the folder.

    A commit of a checkpoint folder is checked out byte for byte. A commit made by
    ``MdlCallback(source="state")`` becomes the folder the Trainer would have written
    (``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth``,
    ``trainer_state.json``), written aside and moved into place whole."""
    repo = repo if isinstance(repo, Repository) else Repository.open(repo)
    commit = repo.resolve(rev)
    paths = {f["path"] for f in repo.show(commit)["files"]}
    if _state.STATE_FILE not in paths:
        repo.checkout(commit, folder)
        return os.fspath(folder)
    state = repo.load_state(commit)
    saved = state.extra.get(TRAINER_KEY) if isinstance(state.extra, dict) else None
    if saved is None:
        raise ValueError(f"commit {commit[:12]} holds live state not saved by MdlCallback: use Repository.load_state")
    folder = os.fspath(folder)
    if os.path.exists(folder) and (not os.path.isdir(folder) or os.listdir(folder)):
        raise FileExistsError(f"{folder} exists and is not an empty folder")
    aside = f"{os.path.normpath(folder)}.mdl-{uuid.uuid4().hex[:8]}"
    try:
        _write_trainer_folder(aside, state, saved)
        os.replace(aside, folder)  # replaces an empty folder too
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return folder


def _write_trainer_folder(folder: str, state: Any, saved: dict) -> None:
    import torch
    from safetensors.torch import save_file

    os.makedirs(folder)
    model = {k: v.contiguous() for k, v in state.model.items()}
    save_file(model, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    if state.optimizer is not None:
        torch.save(state.optimizer, os.path.join(folder, "optimizer.pt"))
    if saved.get("scheduler") is not None:
        torch.save(saved["scheduler"], os.path.join(folder, "scheduler.pt"))
    if saved.get("rng") is not None:
        rng = dict(saved["rng"])
        kind, key, pos, has_gauss, cached = rng["numpy"]
        rng["numpy"] = (kind, np.array(key, dtype=np.uint32), pos, has_gauss, cached)
        torch.save(rng, os.path.join(folder, "rng_state.pth"))
    with open(os.path.join(folder, "trainer_state.json"), "w") as f:
        f.write(saved["trainer_state"])
