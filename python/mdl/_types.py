"""What the API returns: plain dataclasses built from the library's reports (the native
module hands them over as dicts, in the shapes `mdl --json` prints)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


def _build(cls, data: dict) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class CommitResult:
    """A stored commit: its id and what storing it cost."""

    id: str
    branch: str
    raw_bytes: int
    stored_bytes: int
    ratio: float | None
    seconds: float
    tensors: int
    new_tensors: int
    lossy_tensors: int

    @staticmethod
    def of(report: dict) -> "CommitResult":
        return _build(CommitResult, report)


@dataclass(frozen=True)
class LogEntry:
    """One commit of the history."""

    id: str
    parents: list[str]
    time: str
    author: str
    message: str
    step: int | None
    metrics: dict[str, float]
    raw_bytes: int
    stored_bytes: int
    lossy_tensors: int
    refs: list[str] = field(default_factory=list)
    expired_tensors: int = 0


@dataclass(frozen=True)
class Ref:
    """A branch or tag."""

    name: str
    target: str
    current: bool = False
    message: str | None = None


@dataclass(frozen=True)
class TensorInfo:
    """A tensor of a commit, as listed without decoding it."""

    file: str
    name: str
    dtype: str
    shape: list[int]
    lossy: bool
    #: Its content id: equal ids, equal bytes.
    id: str = ""


def log_entries(reports: list[dict]) -> list[LogEntry]:
    return [_build(LogEntry, e) for e in reports]


def refs(reports: list[dict]) -> list[Ref]:
    return [_build(Ref, r) for r in reports]


def tensor_infos(reports: list[dict]) -> list[TensorInfo]:
    return [_build(TensorInfo, t) for t in reports]
