"""The operator's dashboard, as data: what `harnesslab dashboard` (and the `/dashboard` route of
`harnesslab serve --transport http`) shows of a workspace's runs, ledger, tool usage, generated
servers, lab and compare reports, gathered through the readers that own each file (gather,
reports) and a candidate's kernel against the best (diff). servers/dashboard_*.py render it.

Side of the trust boundary: trusted, read-only, the operator's: it never reads the store's
hidden results, and a final record shows only its public fields.
"""

from .diff import candidate_diff
from .gather import gather, workspace_missing
from .models import CandidateDiff, Dashboard
from .reports import compare_view, lab_view
from .source import Source

__all__ = [
    "CandidateDiff",
    "Dashboard",
    "Source",
    "candidate_diff",
    "compare_view",
    "gather",
    "lab_view",
    "workspace_missing",
]
