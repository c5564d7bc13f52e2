"""Generated servers: the spec and manifest (genserver), qualification in a clean room, the
registry that decides what is projected into the clients (projection, skills, client_setup),
and the sandboxed host of a generated server's custom tools (custom_host, custom_worker).

Side of the trust boundary: the registry, qualification reports and qualified bundles are in the
trusted store; the agent's server folder and custom code are hostile input.

Names are imported on first use: a generated server's process imports custom_host only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_surface

if TYPE_CHECKING:
    from .genserver import Manifest, ServerSpec, generate, load_manifest
    from .qualification import QualificationReport, qualify, qualify_workspace_server
    from .registry import list_servers, quarantine, register

_NAMES = {
    "Manifest": "genserver",
    "ServerSpec": "genserver",
    "generate": "genserver",
    "load_manifest": "genserver",
    "QualificationReport": "qualification",
    "qualify": "qualification",
    "qualify_workspace_server": "qualification",
    "list_servers": "registry",
    "quarantine": "registry",
    "register": "registry",
}
__getattr__, __dir__ = lazy_surface(__name__, _NAMES)
__all__ = [
    "Manifest",
    "QualificationReport",
    "ServerSpec",
    "generate",
    "list_servers",
    "load_manifest",
    "qualify",
    "qualify_workspace_server",
    "quarantine",
    "register",
]
