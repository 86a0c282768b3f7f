"""The few Flower internals the rest of the package needs, behind functions of ours (flwr 1.42, checked at import).

* :func:`transport_copy` — a message as the receiving side rebuilds it (the in-process engine's grid);
* :func:`serialized_bytes` — the exact bytes Flower's transport carries for a message or record (the audit's
  byte accounting, paper Table II's uplink);
* :func:`fab_bytes` — the bytes of a FAB built from an app folder, as ``flwr build`` makes it (the pinned app hash);
* :data:`SUPERLINK_NODE_ID`, :class:`ErrorCode`, :class:`TaskIdentity` — constants and the task identity a ClientApp
  expects to find set.
"""

from __future__ import annotations

from pathlib import Path

from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
from flwr.supercore.task_identity import TaskIdentity

from fcd_secure._flower.pins import require

require("internals")

__all__ = ["SUPERLINK_NODE_ID", "ErrorCode", "TaskIdentity", "fab_bytes", "serialized_bytes", "transport_copy"]


def transport_copy(msg):
    """``msg`` as the receiving side rebuilds it: every object of its tree deflated and inflated again (the
    content-addressed form Flower's transport carries; the message id travels beside the tree)."""
    contents = {oid: obj.deflate() for oid, obj in get_all_nested_objects(msg).items()}
    out = inflate_object_from_contents(msg.object_id, contents)
    out.metadata.__dict__["_message_id"] = msg.metadata.message_id
    return out


def serialized_bytes(obj) -> int:
    """The bytes Flower 1.42 serializes for ``obj`` (a Message or a record): every object of its tree, deflated."""
    return int(sum(len(o.deflate()) for o in get_all_nested_objects(obj).values()))


def fab_bytes(app_dir: str | Path) -> bytes:
    """The FAB that ``flwr build`` makes of ``app_dir`` (its SHA-256 is the app hash a site pins)."""
    # imported here, not with the module: only the coordinator builds FABs, and ``flwr.cli`` (with FastAPI and
    # Typer: 0.45 s of CPU on top of ``flwr.app``) would otherwise load in every process that imports the audit's
    # byte accounting
    from flwr.cli.build import build_fab_from_disk  # noqa: PLC0415

    return build_fab_from_disk(Path(app_dir))
