"""The hint of an error: what to do next, as an action each client words its own way.

Re-exported by :mod:`forkvm.models`; :class:`~forkvm.models.ErrorDetail` carries one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .models import Model, _StrEnum


class HintAction(_StrEnum):
    """What an error says to do next, as an action each client words its own way."""

    LIST_SANDBOXES = "list_sandboxes"
    LIST_SNAPSHOTS = "list_snapshots"
    LIST_IMAGES = "list_images"
    LIST_PROCESSES = "list_processes"
    REMOVE_SANDBOX = "remove_sandbox"
    REMOVE_SANDBOXES = "remove_sandboxes"
    RESUME_SANDBOX = "resume_sandbox"
    READ_LOGS = "read_logs"
    FREE_SPACE = "free_space"
    REMOVE_SNAPSHOT = "remove_snapshot"
    FORCE_REMOVE_SNAPSHOT = "force_remove_snapshot"
    FLATTEN_SNAPSHOT = "flatten_snapshot"
    PUSH_SNAPSHOT = "push_snapshot"
    CHECK_HOST = "check_host"
    CREATE_VOLUME = "create_volume"
    REMOVE_VOLUME = "remove_volume"
    GET_IMAGE = "get_image"
    REMOVE_IMAGE = "remove_image"
    IMPORT_IMAGE = "import_image"


@dataclass
class ErrorHint(Model):
    """A next step named as an action; ``target`` is what it applies to."""

    action: HintAction
    target: Optional[str] = None
