"""The dashboard's inline SVG: a run's verified scores against iterations or wall time (the
baseline as a dashed line, the best so far as a step line, the final re-verify apart, a score
that did not pass as a cross on the axis), drawn on the server: the page needs no plotting
library and no script to show it.
"""

from __future__ import annotations

import html

from harnesslab.tools.dashboard.models import Point, RunView

WIDTH, HEIGHT = 360, 190
LEFT, RIGHT, TOP, BOTTOM = 58, 12, 22, 34


def fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}"


def _scale(lo: float, hi: float, a: float, b: float):
    span = (hi - lo) or 1.0

    def f(v: float) -> float:
        return a + (v - lo) / span * (b - a)

    return f


def _minutes(t_s: float) -> str:
    return f"{t_s / 60:.1f}m" if t_s >= 60 else f"{t_s:.0f}s"


def score_plot(run: RunView, axis: str) -> str:
    """An SVG of `run`'s points; axis 'iteration' or 'time'."""
    points = run.points
    title = "score by iteration" if axis == "iteration" else "score by wall time"
    direction = "higher is better" if run.higher_is_better else "lower is better"
    head = (
        f'<svg class="plot" data-axis="{axis}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{title}">'
        f'<text class="plot-title" x="{LEFT}" y="14">{title} ({html.escape(run.unit)}, '
        f"{direction})</text>"
    )
    scored = [p for p in points if p.score is not None]
    if not scored:
        why = "no verified score yet" if not points else "no passing score yet"
        return (
            head + f'<text class="plot-empty" x="{WIDTH / 2}" y="{HEIGHT / 2}" '
            f'text-anchor="middle">{why}</text>{_crosses(points, axis, run)}</svg>'
        )
    ys = [p.score for p in scored if p.score is not None]
    lo, hi = min(ys), max(ys)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.05 or 1.0
    lo, hi = lo - pad, hi + pad
    y = _scale(lo, hi, HEIGHT - BOTTOM, TOP)
    x = _x(points, axis, run)
    parts = [head, _axes(lo, hi, y)]
    parts.append(_x_labels(points, axis, x, run))
    if run.baseline is not None and run.baseline.score is not None:
        by = y(run.baseline.score)
        parts.append(
            f'<line class="baseline" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{by:.1f}" y2="{by:.1f}"/>'
        )
    parts.append(_best_line(points, x, y))
    for p in scored:
        assert p.score is not None
        cls = f"pt pt-{p.kind}" + (" pt-best" if p.new_best else "")
        parts.append(
            f'<circle class="{cls}" data-kind="{p.kind}" data-iteration="{p.iteration}" '
            f'cx="{x(p):.1f}" cy="{y(p.score):.1f}" r="{5 if p.kind != "iteration" else 4}">'
            f"<title>{html.escape(_tip(p, run))}</title></circle>"
        )
    parts.append(_crosses(points, axis, run, x))
    parts.append("</svg>")
    return "".join(parts)


def _tip(p: Point, run: RunView) -> str:
    where = p.label if p.kind != "iteration" else f"iteration {p.iteration}"
    score = f"{fmt(p.score)} {run.unit}" if p.score is not None else "no score"
    return f"{where}: {score} ({p.verdict}) at {_minutes(p.t_s)}"


def _x(points: list[Point], axis: str, run: RunView):
    if axis == "iteration":
        last = max([run.planned + 1, *(p.iteration for p in points)])
        f = _scale(0, last, LEFT + 8, WIDTH - RIGHT - 8)
        return lambda p: f(p.iteration)
    end = max([1.0, *(p.t_s for p in points)])
    g = _scale(0, end, LEFT + 8, WIDTH - RIGHT - 8)
    return lambda p: g(p.t_s)


def _axes(lo: float, hi: float, y) -> str:
    bottom = HEIGHT - BOTTOM
    out = [
        f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{bottom}"/>',
        f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}"/>',
    ]
    for v in (lo, (lo + hi) / 2, hi):
        out.append(
            f'<text class="tick" x="{LEFT - 4}" y="{y(v) + 4:.1f}" text-anchor="end">'
            f"{fmt(v, 3)}</text>"
        )
    return "".join(out)


def _x_labels(points: list[Point], axis: str, x, run: RunView) -> str:
    out = []
    base = HEIGHT - BOTTOM + 14
    seen: set[str] = set()
    for p in points:
        label = {"baseline": "base"}.get(p.label, p.label) if axis == "iteration" else ""
        if axis == "time":
            label = _minutes(p.t_s)
        if label in seen:
            continue
        seen.add(label)
        out.append(
            f'<text class="tick" x="{x(p):.1f}" y="{base}" text-anchor="middle">{label}</text>'
        )
    name = "iteration" if axis == "iteration" else "wall time since the run began"
    out.append(
        f'<text class="axis-name" x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 4}" '
        f'text-anchor="middle">{name}</text>'
    )
    return "".join(out)


def _best_line(points: list[Point], x, y) -> str:
    """The run's best so far as a step line: the baseline, then each iteration the loop took as
    a new best (its decision, which may rest on a side-by-side timing, not on these scores)."""
    best: float | None = None
    coords = []
    for p in points:
        if p.kind == "final":
            continue
        if p.score is not None and (p.kind == "baseline" or p.new_best or best is None):
            if best is not None:
                coords.append(f"{x(p):.1f},{y(best):.1f}")
            best = p.score
        if best is not None:
            coords.append(f"{x(p):.1f},{y(best):.1f}")
    if len(coords) < 2:
        return ""
    return f'<polyline class="best-line" points="{" ".join(coords)}"/>'


def _crosses(points: list[Point], axis: str, run: RunView, x=None) -> str:
    """Scores that did not pass: a cross on the x axis."""
    x = x or _x(points, axis, run)
    out = []
    base = HEIGHT - BOTTOM
    for p in points:
        if p.score is not None:
            continue
        cx = x(p)
        out.append(
            f'<path class="pt-failed" data-kind="{p.kind}" data-iteration="{p.iteration}" '
            f'd="M{cx - 4:.1f},{base - 4} l8,-8 m-8,0 l8,8">'
            f"<title>{html.escape(_tip(p, run))}</title></path>"
        )
    return "".join(out)


__all__ = ["fmt", "score_plot"]
