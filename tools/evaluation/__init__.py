"""The agent's tools, library half: run the objective (kernel, command and step tasks), sweep launch
configs, probe numerics, profile with Nsight Compute, rank history and restore, orient.

Side of the trust boundary: trusted host code; dev numbers come from the candidate's own
sandboxed process and are feedback, never a verdict (that is integrity/).

`overview.overview` and `sweep.sweep` share their module's name, so they are exported by
harnesslab.tools only (here the name is the module).
"""

from .history import rank_history, restore_candidate
from .objective import run_objective, run_step_objective
from .probe import numerical_probe
from .profiling import profile_kernel
from .recording import record, record_run
from .request import MAX_REPEATS, MAX_WARMUP, kernel_request
from .results import CaseResult, EnvInfo, EvalResult, StepBucket

__all__ = [
    "MAX_REPEATS",
    "MAX_WARMUP",
    "CaseResult",
    "EnvInfo",
    "EvalResult",
    "StepBucket",
    "kernel_request",
    "numerical_probe",
    "profile_kernel",
    "rank_history",
    "record",
    "record_run",
    "restore_candidate",
    "run_objective",
    "run_step_objective",
]
