"""PyTorch Distributed Checkpoint storage in an mdl repository.

Every rank of a sharded save writes its own shards into the repository, and the coordinator
publishes them as one commit::

    import torch.distributed.checkpoint as dcp
    import mdl.dcp

    dcp.save(state, storage_writer=mdl.dcp.Writer("runs/gpt", step=step))
    dcp.load(state, storage_reader=mdl.dcp.Reader("runs/gpt", "main"))

``dcp.load`` reads with any number of ranks: DCP's planner reshards, the reader serves the
stored pieces. A save's commit holds one safetensors file per rank, ``part-NNNNN.safetensors``
(NNNNN: the rank's place in DCP's plan; each tensor piece under its name, ``fqn@offsets`` for
a shard that does not start at 0), ``part-NNNNN.bin`` for the non-tensor values DCP
serializes, and ``.metadata``, DCP's own metadata (pickled, as torch's file system storage
writes it). Nothing read is executed: the reader unpickles ``.metadata`` admitting only DCP's
metadata types, ``torch.Size``, dtypes, layouts, memory formats and plain containers, and
checks every non-tensor value as ``torch.load(weights_only=True)`` does before DCP's planner
sees it; anything else is refused naming its class (``torch.serialization.add_safe_globals``
admits more, as for ``torch.load``).
A shard is stored like any tensor: identical shards from different ranks are stored once,
and a rank's shard is delta-coded against the same shard of the branch's previous save.

How a save runs: each rank commits its files onto a branch of its own,
``dcp/<save>/part-NNNNN`` (started at the target branch's commit, so its deltas have their
bases); then the coordinator commits ``.metadata`` the same way, assembles the parts into
one commit on the target branch (nothing is read or encoded again) and deletes the part
branches. A save that fails before the assembly publishes nothing; the part branches it
leaves (``mdl branch``) can be deleted, and gc then reclaims their records.

On one machine the ranks' commits take turns on the repository's writer (each waits up to
``wait`` seconds); their staging, and the bytes each copies, are the rank's own.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import uuid
from typing import Any, Mapping, Union

import torch

from torch.distributed.checkpoint import Metadata, StorageReader, StorageWriter
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from . import _state
from ._mdl import MdlError
from ._repo import Repository, _options
from ._repo import open as open_repository
from ._types import CommitResult

PathLike = Union[str, "os.PathLike[str]"]

METADATA_FILE = ".metadata"
# How long a rank waits for the repository's writer (the other ranks commit meanwhile).
WAIT = 600.0


def _part(index: int) -> str:
    return f"part-{index:05d}"


def _name(index: MetadataIndex) -> str:
    """A stored piece's tensor name: its fqn, with its offsets when it does not start at 0."""
    offset = index.offset
    if offset is None or not any(offset):
        return index.fqn
    return f"{index.fqn}@{','.join(str(o) for o in offset)}"


def _repository(repo: Repository | PathLike, create: bool) -> Repository:
    if isinstance(repo, Repository):
        return repo
    return open_repository(repo, create=create, wait=WAIT)


def _done(value: Any) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


class Writer(StorageWriter):
    """A ``torch.distributed.checkpoint`` storage writer that commits into an mdl repository.

    ``repo``: a :class:`mdl.Repository` or its path (created by the coordinator when
    missing). ``branch``: where the save's commit goes (HEAD's branch when None); the other
    arguments are those of :meth:`mdl.Repository.commit` and describe the save's commit.
    Each rank makes its own Writer; after ``dcp.save`` returns, the coordinator's
    :attr:`result` is the commit's :class:`mdl.CommitResult`.
    """

    def __init__(
        self,
        repo: Repository | PathLike,
        *,
        branch: str | None = None,
        message: str = "",
        step: int | None = None,
        metrics: Mapping[str, float] | None = None,
        lossy: bool | None = None,
        epsilon: float | None = None,
        author: str | None = None,
    ):
        super().__init__()
        self._where = repo
        self._repo: Repository | None = repo if isinstance(repo, Repository) else None
        self._branch = branch
        self._commit = dict(message=message, step=step, metrics=metrics, author=author)
        self._codec = dict(lossy=lossy, epsilon=epsilon)
        self._staging = _state.Staging()
        self._save: str | None = None
        self._tip: str | None = None
        self.result: CommitResult | None = None

    def _open(self, create: bool = False) -> Repository:
        if self._repo is None:
            self._repo = _repository(self._where, create)
        return self._repo

    def _commit_part(
        self, repo: Repository, save: str, tip: str | None, label: str, files: list, ready=(), on_gpu=()
    ) -> str:
        """Commits ``files`` onto the part branch ``dcp/<save>/<label>``, started at ``tip``;
        the branch. ``ready`` and ``on_gpu``: the device snapshots among them, as
        :meth:`_state.Staging.stage` gives them."""
        branch = f"dcp/{save}/{label}"
        if tip is not None:
            repo.branch(branch, tip)
        author = self._commit["author"]
        options = _options(f"dcp save {save}: {label}", None, None, branch, author=author, **self._codec)
        options["working"] = True  # a part branch: HEAD never follows it
        repo._commit_files(files, options, list(ready), list(on_gpu))
        return branch

    # The StorageWriter protocol.

    def reset(self, checkpoint_id: PathLike | None = None) -> None:
        self._save = None
        self._tip = None
        self.result = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # The coordinator names the save and fixes the commit its parts start from.
        repo = self._open(create=True)
        self._save = uuid.uuid4().hex[:12]
        try:
            self._tip = repo.resolve(self._branch or "HEAD")
        except MdlError:
            self._tip = None  # an unborn branch: the parts start where a commit would
        return [
            dataclasses.replace(p, storage_data=(self._save, i, self._tip))
            for i, p in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        save, index, tip = plan.storage_data
        stem = _part(index)
        tensors = _state.Tensors(f"{stem}.safetensors")
        blobs = bytearray()
        results = []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                where = ("bytes", f"{stem}.bin", len(blobs), len(raw))
                blobs += raw
                results.append(WriteResult(index=item.index, size_in_bytes=len(raw), storage_data=where))
            else:
                t = data.detach()
                name = _name(item.index)
                tensors.add(name, t)
                size = t.numel() * t.element_size()
                results.append(
                    WriteResult(index=item.index, size_in_bytes=size, storage_data=("tensor", tensors.path, name))
                )
        files, ready, on_gpu = [], [], []
        if tensors.items:
            # CUDA tensors are snapshotted on their GPU where there is room (as commit_state
            # does), and the commit's GPU engine reads the snapshot there.
            array, event, where = self._staging.stage(tensors, "auto")
            files.append((tensors.path, array))
            if event is not None:
                ready.append(event)
                on_gpu.append((tensors.path, *where))
        if blobs:
            files.append((f"{stem}.bin", blobs))
        if files:
            self._commit_part(self._open(), save, tip, stem, files, ready, on_gpu)
        return _done(results)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        repo = self._open()
        save, tip = self._save, self._tip
        assert save is not None, "finish before prepare_global_plan"
        parts = [f"dcp/{save}/{_part(i)}" for i, written in enumerate(results) if written]
        # Where each piece went: what the reader finds it by.
        metadata.storage_data = {r.index: r.storage_data for written in results for r in written}
        try:
            meta = bytearray(pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL))
            parts.append(self._commit_part(repo, save, tip, "metadata", [(METADATA_FILE, meta)]))
            c = self._commit
            self.result = repo._assemble(
                parts, _options(c["message"], c["step"], c["metrics"], self._branch, author=c["author"], **self._codec)
            )
        finally:
            for branch in parts:
                try:
                    # Its commits are the published commit's tree now, not its history.
                    repo.delete_branch(branch, force=True)
                except MdlError:
                    pass  # a part that was never committed

    def storage_meta(self) -> None:
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: PathLike) -> bool:
        return False  # a Writer is always given explicitly


# What a save's `.metadata` may name: DCP's metadata types, and the torch values and plain
# containers they hold. Nothing else is looked up, so nothing else can run while it is read.
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ADMITTED = {
    ("torch", "Size"),
    # How torch pickles a layout: a lookup among torch's layouts by name.
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("builtins", "complex"),
    ("copyreg", "_reconstructor"),
    ("builtins", "object"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata, refusing every global but the admitted ones."""

    def find_class(self, module: str, name: str) -> Any:
        value = None
        if "." in name:  # a dotted name reaches through attributes: never admitted
            pass
        elif module == _METADATA_MODULE or (module, name) in _ADMITTED:
            value = super().find_class(module, name)
        elif module == "torch":
            found = getattr(torch, name, None)
            if isinstance(found, (torch.dtype, torch.layout, torch.memory_format)):
                value = found
        if value is None or (module == _METADATA_MODULE and not isinstance(value, type)):
            raise pickle.UnpicklingError(
                f"{module}.{name} is not admitted in a DCP save's metadata (nothing read from a "
                "repository is executed)"
            )
        return value


def _metadata(data: bytes) -> Metadata:
    """A save's ``.metadata``, read without executing anything (:class:`_MetadataUnpickler`)."""
    try:
        meta = _MetadataUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as e:
        raise MdlError(f"refused .metadata: {e}") from None
    except Exception as e:  # a damaged pickle: any of the unpickler's own errors
        raise MdlError(f"refused .metadata: not a pickle of DCP metadata ({e})") from None
    if not isinstance(meta, Metadata):
        raise MdlError(f"refused .metadata: a {type(meta).__name__}, not DCP metadata")
    return meta


def _checked_bytes(path: str, data: bytes) -> io.BytesIO:
    """A non-tensor value of a save, for DCP's planner (which unpickles it with ``torch.load``),
    once ``torch.load(weights_only=True)`` has read it without refusing anything."""
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:
        # torch's message is several paragraphs; the line naming what was refused says it.
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        why = next((line for line in lines if "GLOBAL" in line), lines[0] if lines else repr(e))
        raise MdlError(
            f"refused a value stored in {path}: {why} (values are read as "
            "torch.load(weights_only=True) reads them; torch.serialization.add_safe_globals "
            "admits more)"
        ) from None
    return io.BytesIO(data)


class Reader(StorageReader):
    """A ``torch.distributed.checkpoint`` storage reader of a save committed by
    :class:`Writer`: commit ``rev`` of ``repo`` (a :class:`mdl.Repository` or its path).

    Each rank resolves ``rev`` for itself: name a commit id or a tag when the branch may move
    during the load.
    """

    def __init__(self, repo: Repository | PathLike, rev: str = "HEAD"):
        super().__init__()
        self._repo = _repository(repo, create=False)
        self._rev = rev
        self._commit: str | None = None
        self._stored: dict[MetadataIndex, Any] = {}

    def reset(self, checkpoint_id: PathLike | None = None) -> None:
        self._commit = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        self._commit = self._repo.resolve(self._rev)
        try:
            data = self._repo._native.read_file(self._commit, METADATA_FILE)
        except MdlError as e:
            raise MdlError(f"commit {self._commit[:12]} is not a DCP save ({e})") from None
        return _metadata(bytes(data))

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._stored = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        commit = self._commit
        assert commit is not None, "read_data before read_metadata"
        # One stored piece at a time: what it serves is copied out before the next is decoded.
        by_place: dict[tuple, list] = {}
        for req in plan.items:
            by_place.setdefault(self._stored[req.storage_index], []).append(req)
        blobs: dict[str, bytearray] = {}
        for place, reqs in by_place.items():
            if place[0] == "bytes":
                _, path, at, n = place
                if path not in blobs:
                    blobs[path] = self._repo._native.read_file(commit, path)
                for req in reqs:
                    planner.load_bytes(req, _checked_bytes(path, bytes(blobs[path][at : at + n])))
                continue
            _, path, name = place
            ((dtype, shape, data),) = self._repo._native.read_tensors(commit, [(path, name)])
            stored = _state.to_tensor(data, dtype, shape, "torch")
            for req in reqs:
                if req.type != LoadItemType.TENSOR:
                    raise MdlError(f"{name} in {path} is a tensor, read as {req.type}")
                piece = stored
                for dim, (off, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                    piece = piece.narrow(dim, off, n)
                target = planner.resolve_tensor(req).detach()
                if target.size() != piece.size():
                    raise MdlError(f"{name} in {path}: stored piece {tuple(piece.size())}, asked {tuple(target.size())}")
                target.copy_(piece)
                planner.commit_tensor(req, target)
        return _done(None)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: PathLike) -> bool:
        return False


__all__ = ["Reader", "Writer", "METADATA_FILE"]
