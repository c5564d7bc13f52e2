"""Variants of tools/gpu/timing.py for an A/B of the runner's timing cost (issue 30: warm
run_objective <= 0.2 s, back-to-back agreement <= 1%), applied by exact text replacement so a
variant that no longer applies fails loudly instead of measuring the base twice.

    python benchmarks/timing_variants.py VARIANT SRC DST   # write SRC (a timing.py) as VARIANT

Variants (combine with "+"):
  base        unchanged
  legacy      timing.py as of 39952d8: 500 us windows, nvidia-smi run for every env block,
              capture through torch.cuda.graph() (which empties the allocator's caches), ten
              single calls (the first A/B, at 39952d8, measured 250 us windows and one sleep a
              batch as "window250" and "sleep1"; its sleep before every isolated sample is no
              longer an edit: each isolated sample has its own since the thirteenth session)
  floor8      adaptive sampling's floor 8 samples instead of 10
  oneset      isolated (bandwidth-bound) cases time one input set, not a rotation: the flush
              before each sample already cleans L2, and two alternating sets whose memory times
              differently make the median (an even count: the mean of the two middle samples,
              one of each set) the mean of the faster set's slowest and the slower set's
              fastest sample, two extremes; timing_phases_gpu.py's "set gap" column says
              whether the sets differ. Worth it only where that gap is wider than the spread
              (a simulation with a 1% gap under 0.5-1.5% noise showed no gain). Also one input
              set fewer to draw per isolated case.
  isofloor    isolated cases take at least 20 samples (the floor of 10 lets a run stop at 14
              while another runs to the cap of 30: the 1.10% disagreement of 4096x8192 bf16;
              benchmarks/agreement_sim.py finds little gain alone, 3.5% -> 2.8% of runs at 1%
              noise, and 0.6% with isocap60)
  isocap60    isolated cases may take up to 60 samples (still stopping once stable): where a
              sample's own noise is ~1.5% (timing_phases_gpu.py's spread ~4%), the median of 30
              misses 1% between two runs on some of the six isolated cases in ~1 run of 5; of 60,
              ~1 of 10 (benchmarks/agreement_sim.py: the adaptive sampler, Gaussian noise)
  window125   graph samples of ~125 us of back-to-back calls instead of ~250 us: half the
              captured calls (the capture's host launches are most of the graph path's cost;
              event resolution, ~0.5 us, is 0.4% of a sample and the median is over 10 or more)
  cloneset    the timing's input sets after the first are copies of it (distinct memory, one
              draw: a clone is one kernel per tensor, a draw a generator and several), for the
              graph-timed cases' 14-21 sets each; timings are of the same values in each set
  singles3    three single eager calls per case instead of five (launch overhead is reported,
              never scored; the isolated sleep is sized from their median)
"""

from __future__ import annotations

import sys
from pathlib import Path

EDITS: dict[str, list[tuple[str, str]]] = {
    "base": [],
    "legacy": [
        ("BATCH_STEP, WINDOW_US = 4, 250.0", "BATCH_STEP, WINDOW_US = 4, 500.0"),
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
    "oneset": [
        (
            "        n_sets = env.sets_needed(nbytes)\n",
            '        n_sets = 1 if env.method_for(nbytes) == "isolated" else env.sets_needed(nbytes)\n',
        )
    ],
    "isofloor": [
        (
            "                call, floor, host_us=statistics.median(single), cap=samples\n",
            "                call, max(floor, min(20, samples)), host_us=statistics.median(single),\n"
            "                cap=samples\n",
        )
    ],
    "isocap60": [
        (
            "cap=samples\n            )\n        else:\n",
            "cap=max(samples, 60)\n            )\n        else:\n",
        )
    ],
    "window125": [("BATCH_STEP, WINDOW_US = 4, 250.0", "BATCH_STEP, WINDOW_US = 4, 125.0")],
    "cloneset": [
        (
            "            sets = [make(11 + s) for s in range(n_sets)]\n",
            "            first = make(11)\n"
            "            sets = [first] + [\n"
            "                (tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in first[0]),\n"
            "                 dict(first[1]))\n"
            "                for _ in range(n_sets - 1)\n"
            "            ]\n",
        )
    ],
    "singles3": [("for i in range(5)]", "for i in range(3)]")],
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
