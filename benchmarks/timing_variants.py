"""Variants of tools/gpu/timing.py for an A/B of the runner's timing cost (issue 30: warm
run_objective <= 0.2 s, back-to-back agreement <= 1%), applied by exact text replacement so a
variant that no longer applies fails loudly instead of measuring the base twice.

    python benchmarks/timing_variants.py VARIANT SRC DST   # write SRC (a timing.py) as VARIANT

Variants (combine with "+", e.g. "window250+sleep1"):
  base        unchanged
  window250   a CUDA-graph sample (and a guarded verify's replay window) of ~250 us of device
              time instead of ~500 us: half the calls captured, half the device time a sample
  sleep1      isolated samples: the sleep that covers the host's enqueue only before the first
              sample of a batch (later samples are enqueued while earlier ones run)
  floor8      adaptive sampling's floor 8 samples instead of 10
"""

from __future__ import annotations

import sys
from pathlib import Path

EDITS: dict[str, list[tuple[str, str]]] = {
    "base": [],
    "window250": [("BATCH_STEP, WINDOW_US = 4, 500.0", "BATCH_STEP, WINDOW_US = 4, 250.0")],
    "sleep1": [
        (
            "            for start, end in pairs:\n"
            "                self.flush_l2()\n"
            "                torch.cuda._sleep(sleep_cycles)\n",
            "            for j, (start, end) in enumerate(pairs):\n"
            "                self.flush_l2()\n"
            "                if j == 0:\n"
            "                    torch.cuda._sleep(sleep_cycles)\n",
        )
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
