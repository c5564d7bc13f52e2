"""Guarded final verification: hidden cases, the static scan, the verdict judged from raw
measurements (reason codes in reasons.REASONS), what of it an agent may see (verdict_view), and
the cheat corpus (cheats/: cpu/, gpu/ and honest/ kernels, package data) it is tested against.

Side of the trust boundary: trusted; hidden cases never leave it.
"""

from .reasons import REASONS
from .scan import scan_workspace
from .step_verify import guarded_step_verify
from .verdict import Verdict
from .verdict_view import public_verdict
from .verify import guarded_verify

__all__ = [
    "REASONS",
    "Verdict",
    "guarded_step_verify",
    "guarded_verify",
    "public_verdict",
    "scan_workspace",
]
