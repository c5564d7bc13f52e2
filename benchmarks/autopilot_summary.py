"""Print a `harnesslab run --runner autopilot --json` summary as a score curve: the verified
score and the best so far against wall time and iterations, then the baseline, the best and the
final re-verify (benchmarks/autopilot_hg.sh, benchmarks/autopilot_step.sh).

    python3 benchmarks/autopilot_summary.py SUMMARY.json
"""

import json
import sys


def main(path: str) -> None:
    s = json.loads(open(path).read())
    base, best, final = s.get("baseline") or {}, s.get("best") or {}, s.get("final") or {}
    print(
        f"status {s['status']} ({s['stop_reason']}), {s['iterations_done']} iterations, wall {s['wall_s']} s, "
        f"GPU-backed work {s['gpu_work_s']}"
    )
    print(
        "| iteration | ended at (s) | candidate | verified score (us) | best so far (us) | new best |"
    )
    print("|---|---|---|---|---|---|")
    bsf = base.get("score_us")  # the loop's best: moves only when it says new_best
    print(f"| baseline | - | {base.get('candidate')} | {bsf} | {bsf} | |")
    for it in s["iterations"]:
        sc = it.get("score") or {}
        if it["new_best"]:
            bsf = sc.get("score_us")
        print(
            f"| {it['iteration']} | {it['at_s']} | {sc.get('candidate')} | "
            f"{sc.get('score_us') if sc.get('score_us') is not None else sc.get('verdict')} | {bsf} | "
            f"{'yes' if it['new_best'] else ''} |"
        )
    print(
        f"baseline {base.get('score_us')} us on {base.get('case_set')}; best {best.get('score_us')} us "
        f"(iteration {best.get('iteration')}, {s.get('improvement_pct')} %); final re-verify "
        f"{final.get('verdict')} {final.get('score_us')} us on {final.get('case_set')}; restored {s.get('restored')}"
    )


if __name__ == "__main__":
    main(sys.argv[1])
