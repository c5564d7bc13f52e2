"""The kernel lab, host side: run the matrix where the GPU is (matrix), judge the claims ledger
(claims) and write the report (report). The GPU side is gpu/kernel_lab/lab.py."""

from .claims import claims_ledger
from .matrix import LabOptions, run_lab
from .report import build_report

__all__ = ["LabOptions", "build_report", "claims_ledger", "run_lab"]
