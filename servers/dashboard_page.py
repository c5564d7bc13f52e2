"""The dashboard's HTML: the page and each live section, rendered on the server from
tools/dashboard's models. Every value is HTML-escaped (run ids, reasons, tool and server names
and kernel code come from the agent's side); the page carries no inline script or style, so its
Content-Security-Policy allows the package's own files only (servers/dashboard_app.py).
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable

from harnesslab.tools.dashboard.models import (
    CandidateDiff,
    CompareView,
    Dashboard,
    LabView,
    RunView,
    ScoreView,
)

from .dashboard_highlight import highlight_lines
from .dashboard_plot import fmt, score_plot

BASE = "/dashboard"
SECTIONS = ("head", "runs", "ledger", "tools", "servers", "lab", "compare")
NOTICE = (
    "The operator's page: it reads the trusted store. Hidden cases (their shapes and per-case "
    "timings) are never shown here; keep this page, and its port, away from the agent."
)


def e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def when(t: float | None) -> str:
    return "-" if not t else time.strftime("%H:%M:%S", time.gmtime(t)) + "Z"


def duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m{seconds % 60:02.0f}s"
    return f"{seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"


def table(headers: list[str], rows: list[str], cls: str = "") -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    return (
        f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
    )


def badge(text: str, kind: str = "") -> str:
    return f'<span class="badge b-{e(kind or text)}">{e(text)}</span>'


def problem(text: str) -> str:
    return f'<p class="problem">{e(text)}</p>' if text else ""


# -- sections ---------------------------------------------------------------------------------


def head_section(page: Dashboard) -> str:
    missing = "".join(f"<li>{e(m)}</li>" for m in page.missing)
    return (
        f'<p class="notice">{e(NOTICE)}</p>'
        f"<p>workspace <code>{e(page.workspace)}</code> · task <b>{e(page.task or '-')}</b> · "
        f'read at {when(page.generated_at)} · <span id="live-state">live</span></p>'
        + (f'<ul class="missing">{missing}</ul>' if missing else "")
    )


def score_cell(score: ScoreView | None, unit: str) -> str:
    if score is None:
        return "-"
    value = f"{fmt(score.score)} {e(unit)}" if score.score is not None else ""
    return f"{value} {badge(score.verdict)}".strip()


def run_card(run: RunView) -> str:
    if run.problem:
        return f'<div class="run" data-run="{e(run.run_id)}"><h3>{e(run.run_id)}</h3>{problem(run.problem)}</div>'
    unit = run.unit
    meaningful = (
        "" if run.meaningful else '<p class="warn">CPU interpreter: timings are not meaningful</p>'
    )
    best = (
        f"{fmt(run.best_score)} {e(unit)} (iteration {run.best_iteration}, "
        f"<code>{e((run.best_candidate or '')[:12])}</code>)"
        if run.best_score is not None
        else "-"
    )
    summary = (
        f"<dl><dt>baseline</dt><dd>{score_cell(run.baseline, unit)}</dd>"
        f"<dt>best</dt><dd>{best}</dd>"
        f"<dt>final (new hidden cases)</dt><dd>{score_cell(run.final, unit)}</dd>"
        f"<dt>stop reason</dt><dd>{e(run.stop_reason or '-')}</dd></dl>"
    )
    rows = []
    for it in run.iterations:
        elapsed = (
            f'<span data-since="{it.started_at}">{duration(it.elapsed_s)}</span>'
            if it.running
            else duration(it.elapsed_s)
        )
        sc = it.score
        rows.append(
            f'<tr class="iter{" running" if it.running else ""}" data-iteration="{it.index}">'
            f"<td>{it.index}</td><td>{badge(it.phase, 'phase')}{' …' if it.running else ''}</td>"
            f"<td>{elapsed}</td>"
            f'<td title="{e(it.attempt_detail)}">{badge(it.attempt) if it.attempt else "-"}</td>'
            f"<td>{score_cell(sc, unit)}{' ★' if it.new_best else ''}</td>"
            f"<td>{e(sc.certifies if sc else '') or '-'}</td>"
            f"<td>{e(it.build or '-')}</td><td>{e(', '.join(it.servers) or '-')}</td>"
            f'<td>{it.tool_calls}</td><td class="reason">{e(it.error or (sc.reason if sc else ""))}</td></tr>'
        )
    iterations = table(
        ["#", "phase", "elapsed", "attempt", "verified score", "certifies", "build", "servers",
         "calls", "reason / error"],
        rows,
        "iterations",
    ) if rows else "<p>no iteration yet (scoring the baseline?)</p>"  # fmt: skip
    # A running run whose loop died (killed, machine rebooted) stays "running": its age tells.
    stale = (
        f' (<span data-since="{run.updated_at}">{duration(0)}</span> ago)'
        if run.status == "running"
        else ""
    )
    return (
        f'<div class="run" data-run="{e(run.run_id)}" data-status="{e(run.status)}">'
        f"<h3>{e(run.run_id)} {badge(run.status)}</h3>"
        f"<p>{e(run.task)} · runner {e(run.runner)} · "
        f"{sum(1 for i in run.iterations if not i.running)}/{run.planned} iterations · "
        f"started {when(run.created_at)} · updated {when(run.updated_at)}{stale}</p>"
        f"{meaningful}{problem(run.error)}{summary}"
        f'<div class="plots">{score_plot(run, "iteration")}{score_plot(run, "time")}</div>'
        f"{iterations}</div>"
    )


def runs_section(page: Dashboard) -> str:
    if not page.runs:
        return "<h2>Runs</h2><p>no loop run in this workspace yet.</p>"
    return f'<h2>Runs</h2><div class="runs">{"".join(run_card(r) for r in page.runs)}</div>'


def ledger_section(page: Dashboard) -> str:
    led = page.ledger
    if led.problem:
        return "<h2>Ledger</h2>" + problem(led.problem)
    rows = []
    for r in led.rows:
        best = " ★" if r.is_best else ""
        rows.append(
            f'<tr class="ledger-row" data-candidate="{e(r.candidate)}" data-mode="{e(r.mode)}" '
            f'tabindex="0" title="show this candidate\'s kernel against the best">'
            f"<td>{when(r.time)}</td><td>{e(r.mode)}</td>"
            f"<td><code>{e(r.candidate[:12])}</code>{best}</td><td>{badge(r.status)}</td>"
            f"<td>{fmt(r.score)}</td><td>{fmt(r.geomean_pct_of_copy_bw, 3)}</td>"
            f"<td>{e(r.certifies or '-')}</td><td>{e(r.sandbox or '-')}</td>"
            f'<td>{"yes" if r.meaningful else "no"}</td><td class="reason">{e(r.reason)}</td></tr>'
        )
    shown = f"{len(led.rows)} newest of {led.total} records" if led.total else "no records yet"
    body = table(
        ["time", "mode", "candidate", "verdict", f"score ({led.unit})", "geomean % of copy",
         "certifies", "sandbox", "meaningful", "reason"],
        rows,
        "ledger",
    ) if rows else ""  # fmt: skip
    return (
        f"<h2>Ledger</h2><p>{shown}; ★ = the best pointer of its mode; click a row for its "
        "kernel against the best. Final records show the public verdict only. Lines that do "
        f"not parse (a torn last line) are skipped.</p>{body}"
    )


def tools_section(page: Dashboard) -> str:
    tv = page.tools
    rows = [
        f'<tr class="tool-row"><td>{e(r.server)}</td><td>{e(r.tool)}</td><td>{r.calls}</td>'
        f'<td class="{"bad" if r.failures else ""}">{r.failures}</td>'
        f"<td>{e(', '.join(f'{k} {v}' for k, v in sorted(r.statuses.items())))}</td>"
        f"<td>{fmt(r.median_ms, 3)}</td><td>{fmt(r.p90_ms, 3)}</td><td>{fmt(r.max_ms, 3)}</td></tr>"
        for r in tv.rows
    ]
    out = [f"<h2>Tools</h2>{problem(tv.problem)}"]
    if not rows:
        return out[0] + "<p>no tool call recorded yet.</p>"
    out.append(f"<p>{tv.total_calls} calls, {tv.failures} not ok (telemetry).</p>")
    out.append(table(["server", "tool", "calls", "failures", "statuses", "median ms",
                      "p90 ms", "max ms"], rows, "tools"))  # fmt: skip
    names = sorted({k for it in tv.per_iteration for k in it.calls})[:14]
    if names:
        per = [
            f"<tr><td><code>{e(it.run_id[-8:])}</code></td><td>{it.iteration}</td>"
            + "".join(f"<td>{it.calls.get(n, '')}</td>" for n in names)
            + "</tr>"
            for it in tv.per_iteration
        ]
        out.append("<h3>Calls per iteration</h3>")
        out.append(table(["run", "iteration", *names], per, "per-iteration"))
    return "".join(out)


def servers_section(page: Dashboard) -> str:
    sv = page.servers
    if sv.problem:
        return "<h2>Generated servers</h2>" + problem(sv.problem)
    if not sv.servers:
        return "<h2>Generated servers</h2><p>no generated server yet.</p>"
    rows = []
    for s in sv.servers:
        checks = "".join(
            f"<li>{badge('pass' if c.passed else 'fail')} {e(c.name)}: {e(c.evidence)}</li>"
            for c in s.checks
        )
        report = (
            f"<details><summary>{'qualified' if s.qualified else 'failed'} at "
            f"{when(s.qualified_at)} in {fmt(s.duration_s, 3)} s, bundle "
            f"<code>{e(s.bundle_hash)}</code></summary><ul>{checks}</ul></details>"
            if s.qualified is not None
            else "no qualification by this toolkit yet"
        )
        rows.append(
            f'<tr class="server-row" data-server="{e(s.name)}"><td>{e(s.name)}</td>'
            f"<td>{badge(s.status)}</td><td>{e(', '.join(s.tools) or '-')}</td>"
            f'<td>{report}</td><td class="reason">{e(s.reason)}</td></tr>'
        )
    return "<h2>Generated servers</h2>" + table(
        ["server", "status", "registered tools", "qualification", "reason"], rows, "servers"
    )


def lab_block(lab: LabView, index: int) -> str:
    if lab.problem:
        return f"<h3>{e(lab.folder)}</h3>{problem(lab.problem)}"
    out = [f"<h3>{e(lab.date)} · {e(lab.device)}</h3><p><code>{e(lab.folder)}</code></p>"]
    if not lab.meaningful:
        out.append('<p class="warn">NOT MEANINGFUL: the Triton CPU interpreter ran it</p>')
    if lab.incomplete:
        out.append(problem(f"incomplete: {lab.incomplete}"))
    for task in lab.tasks:
        rows = []
        for case, cells in zip(task.cases, task.cells, strict=False):
            tds = []
            for c in cells:
                if c is None:
                    tds.append("<td>-</td>")
                elif not c.passed:
                    tds.append(f'<td class="bad">{e(c.status)}</td>')
                else:
                    up = f" · {c.speedup:.2f}x" if c.speedup else ""
                    tds.append(f"<td>{fmt(c.median_us)} us · {fmt(c.value, 3)}{up}</td>")
            rows.append(f"<tr><td>{e(case)}</td>{''.join(tds)}</tr>")
        out.append(
            f"<h4>{e(task.name)} (best: <code>{e(task.best_strategy)}</code>; cells: median · "
            f"{e(task.metric)} · speedup over eager)</h4>"
            + table(["case", *task.strategies], rows, "matrix")
        )
    out.append(
        '<div class="lab-plots">'
        + "".join(
            f'<img src="{BASE}/file/lab/{index}/{e(p)}" alt="{e(p)}" loading="lazy">'
            for p in lab.plots
        )
        + "</div>"
    )
    counts = ", ".join(f"{v} {k}" for k, v in lab.claim_counts.items())
    claims = [
        f"<tr><td>{badge(c.status)}</td><td>{e(c.statement)}</td><td>{e(c.target)}</td>"
        f'<td class="reason">{e(c.reason)}</td></tr>'
        for c in lab.claims
    ]
    out.append(f"<h4>Claims ledger ({e(counts)})</h4>")
    out.append(table(["status", "claim", "target", "reason"], claims, "claims"))
    return "".join(out)


def lab_section(page: Dashboard) -> str:
    if not page.labs:
        return "<h2>Lab</h2><p>no lab report named: add <code>--lab DIR</code> (the --out of `harnesslab lab`).</p>"
    return "<h2>Lab</h2>" + "".join(lab_block(lab, i) for i, lab in enumerate(page.labs))


def compare_block(cv: CompareView, index: int) -> str:
    if cv.problem:
        return f"<h3>{e(cv.folder)}</h3>{problem(cv.problem)}"
    diff = cv.difference
    arms = []
    for arm in cv.arms:
        trials = [
            f"<tr><td><code>{e(r.run_id)}</code></td><td>{badge(r.status)}</td>"
            f"<td>{fmt(r.best_score)}</td><td>{score_cell(r.final, cv.unit)}</td>"
            f'<td class="reason">{e(r.problem or r.stop_reason)}</td></tr>'
            for r in arm.runs
        ]
        arms.append(
            f'<div class="arm" data-arm="{e(arm.arm)}"><h4>{e(arm.arm)} '
            f"({e(arm.runner)}{', harnessed' if arm.harnessed else ''})</h4>"
            f"<p>{arm.valid}/{arm.trials} valid trials · median {fmt(arm.median)} {e(cv.unit)} "
            f"(p10 {fmt(arm.p10)}, p90 {fmt(arm.p90)})</p>"
            + table(["run", "status", "best", "final", "note"], trials, "trials")
            + "</div>"
        )
    plot = f'<img src="{BASE}/file/compare/{index}/scores.png" alt="scores">' if cv.plot else ""
    return (
        f"<h3>{e(cv.task)} <code>{e(cv.folder)}</code></h3>"
        f"<p>difference (B - A): {fmt(diff.get('value'))} {e(cv.unit)}, 95% interval "
        f"{e(diff.get('ci95'))}: {e(diff.get('verdict', '-'))}</p>"
        f'<div class="arms">{"".join(arms)}</div>{plot}'
    )


def compare_section(page: Dashboard) -> str:
    if not page.compares:
        return "<h2>Compare</h2><p>no compare report named: add <code>--compare DIR</code>.</p>"
    return "<h2>Compare</h2>" + "".join(compare_block(c, i) for i, c in enumerate(page.compares))


RENDER: dict[str, Callable[[Dashboard], str]] = {
    "head": head_section,
    "runs": runs_section,
    "ledger": ledger_section,
    "tools": tools_section,
    "servers": servers_section,
    "lab": lab_section,
    "compare": compare_section,
}


def sections(page: Dashboard) -> dict[str, str]:
    """Each live section's inner HTML, keyed by its element id."""
    return {f"sec-{name}": RENDER[name](page) for name in SECTIONS}


def page_html(page: Dashboard, version: str) -> str:
    body = "".join(
        f'<section id="{sid}">{inner}</section>' for sid, inner in sections(page).items()
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>harnesslab · {e(page.task or 'dashboard')}</title>"
        f'<link rel="stylesheet" href="{BASE}/static/dashboard.css">'
        f'<link rel="icon" href="{BASE}/static/favicon.svg"></head>'
        f'<body data-base="{BASE}" data-version="{e(version)}" data-now="{page.generated_at}">'
        f"<header><h1>harnesslab dashboard</h1></header><main>{body}"
        '<section id="diff-panel"><h2>Kernel diff</h2><div id="diff">click a ledger row to '
        "compare its kernel with the best.</div></section></main>"
        f'<script src="{BASE}/static/dashboard.js" defer></script></body></html>'
    )


def diff_html(diff: CandidateDiff) -> str:
    """A candidate's files against the best, side by side line numbers, highlighted."""
    if diff.problem:
        return problem(f"candidate {diff.candidate}: {diff.problem}")
    out = [
        f"<p>candidate <code>{e(diff.candidate)}</code> against "
        f"{e(diff.best_label)} <code>{e(diff.best or '-')}</code></p>"
    ]
    for f in diff.files:
        old = highlight_lines(f.path, f.old_text)
        new = highlight_lines(f.path, f.new_text)
        rows = []
        for line in f.lines:
            if line.tag == "skip":
                rows.append(
                    f'<tr class="d-skip"><td></td><td></td><td>… {line.count} unchanged lines</td></tr>'
                )
                continue
            src = new[line.new_no - 1] if line.new_no else old[(line.old_no or 1) - 1]
            mark = {"add": "+", "del": "-", "same": " "}[line.tag]
            rows.append(
                f'<tr class="d-{line.tag}"><td>{line.old_no or ""}</td><td>{line.new_no or ""}</td>'
                f"<td><code>{mark} {src}</code></td></tr>"
            )
        state = "changed" if f.changed else "unchanged"
        out.append(
            f'<h4>{e(f.path)} ({state})</h4><table class="diff" data-path="{e(f.path)}">'
            f"<tbody>{''.join(rows)}</tbody></table>"
        )
    return "".join(out)


def error_html(message: str) -> str:
    """A page that says what could not be shown (never a traceback)."""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>harnesslab</title>'
        f'<link rel="stylesheet" href="{BASE}/static/dashboard.css"></head><body><main>'
        f'<p class="problem">{e(message)}</p></main></body></html>'
    )


def login_html(message: str) -> str:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>harnesslab</title>'
        f'<link rel="stylesheet" href="{BASE}/static/dashboard.css"></head><body><main>'
        f"<h1>harnesslab dashboard</h1><p>{e(message)}</p>"
        f'<form method="post" action="{BASE}/login"><label>token <input type="password" '
        'name="token" autocomplete="current-password" autofocus></label> '
        '<button type="submit">open</button></form></main></body></html>'
    )


__all__ = ["BASE", "NOTICE", "diff_html", "error_html", "login_html", "page_html", "sections"]
