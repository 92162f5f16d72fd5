"""mdl: version control for deep-learning checkpoints, in-process.

Three lines in a training loop::

    repo = mdl.open("runs/gpt", create=True)
    ...
    repo.commit_state(model, optimizer, step=step, metrics={"loss": loss})  # returns at once

The commit is compressed and written in the background; ``repo.load_state(rev, model,
optimizer)`` restores it. Integrations: :mod:`mdl.transformers` (a ``TrainerCallback``) and
:mod:`mdl.lightning` (a ``CheckpointIO`` plugin). docs/PYTHON.md has the whole API.

Failures raise :class:`MdlError` or one of its kinds (:class:`NotFound`, :class:`Conflict`,
:class:`Busy`, :class:`Corrupt`, ...), each with ``.code``, the stable error code.
"""

from ._mdl import (
    Busy,
    Conflict,
    Corrupt,
    Expired,
    InvalidInput,
    MdlError,
    NotFound,
    PermissionDenied,
    Unavailable,
    Unsupported,
    __version__,
)
from ._repo import WARM_BYTES, CommitHandle, Repository, State, open
from ._types import CommitResult, LogEntry, Ref, TensorInfo


def init(path, *, wait: float = 60.0, warm_bytes: int = WARM_BYTES) -> Repository:
    """Creates a repository in ``path`` (created if missing); see :meth:`Repository.open`."""
    return Repository.init(path, wait=wait, warm_bytes=warm_bytes)


__all__ = [
    "Busy",
    "CommitHandle",
    "CommitResult",
    "Conflict",
    "Corrupt",
    "Expired",
    "InvalidInput",
    "LogEntry",
    "MdlError",
    "NotFound",
    "PermissionDenied",
    "Ref",
    "Repository",
    "State",
    "TensorInfo",
    "Unavailable",
    "Unsupported",
    "init",
    "open",
    "__version__",
]
