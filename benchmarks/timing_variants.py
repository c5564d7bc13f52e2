"""Variants of tools/gpu/timing.py for an A/B of the runner's timing cost (issue 30: warm
run_objective <= 0.2 s, back-to-back agreement <= 1%), applied by exact text replacement so a
variant that no longer applies fails loudly instead of measuring the base twice.

    python benchmarks/timing_variants.py VARIANT SRC DST   # write SRC (a timing.py) as VARIANT

Variants (combine with "+"):
  base        unchanged
  legacy      timing.py as of 39952d8: 500 us windows, a sleep before every isolated sample,
              nvidia-smi run for every env block, capture through torch.cuda.graph() (which
              empties the allocator's caches), ten single calls (the first A/B, at 39952d8,
              measured 250 us windows and one sleep a batch as "window250" and "sleep1")
  floor8      adaptive sampling's floor 8 samples instead of 10
"""

from __future__ import annotations

import sys
from pathlib import Path

EDITS: dict[str, list[tuple[str, str]]] = {
    "base": [],
    "legacy": [
        ("BATCH_STEP, WINDOW_US = 4, 250.0", "BATCH_STEP, WINDOW_US = 4, 500.0"),
        ("                if j == 0 or sleep_each:\n", "                if True:\n"),
        ("@functools.cache  # once a process", "# once a process"),
        (
            "        with torch.cuda.stream(side):\n"
            "            graph.capture_begin()\n"
            "            try:\n"
            "                for i in range(calls):\n"
            "                    call(i)\n"
            "            finally:\n"
            "                graph.capture_end()\n",
            "        with torch.cuda.graph(graph):\n"
            "            for i in range(calls):\n"
            "                call(i)\n",
        ),
        ("for i in range(5)]", "for i in range(max(5, min(samples, 10)))]"),
    ],
    "floor8": [("MIN_SAMPLES, RELATIVE_CI = 10, 0.005", "MIN_SAMPLES, RELATIVE_CI = 8, 0.005")],
}


def apply(variant: str, text: str) -> str:
    for name in variant.split("+"):
        for old, new in EDITS[name]:
            if text.count(old) != 1:
                raise SystemExit(f"variant {name}: its anchor is not in timing.py once: {old!r}")
            text = text.replace(old, new)
    return text


def main() -> int:
    variant, src, dst = sys.argv[1:4]
    Path(dst).write_text(apply(variant, Path(src).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
