"""Verifier of the fused RMSNorm + SiLU gate task: the benchmark's suite, plus `verified`."""

from __future__ import annotations

import json
import sys

from benchmark import parse_args, run_suite


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    result = run_suite(args.mode, args.warmup, args.repeats, args.cases, args.cases_file)
    result["verified"] = result["status"] == "passed"
    print(json.dumps(result, sort_keys=True))
    return 0 if result["verified"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
