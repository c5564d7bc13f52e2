"""The dashboard's web app (servers/dashboard_app.py) in process: the page and its live
sections, the diff, the guards it shares with `serve --transport http` (Host/Origin on loopback,
the token by header or login cookie), escaping of what the agent wrote, a failure answered with
a line instead of a traceback, and the `dashboard` command's refusal to serve off loopback
without a token."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from harnesslab.servers.cli import main
from harnesslab.servers.dashboard_app import COOKIE, dashboard_app, mount_dashboard
from harnesslab.servers.serve_cmd import BearerAuth
from harnesslab.tests.tools.dashboard.sample import RUN_ID, sample_workspace, settings
from harnesslab.tools.dashboard.source import Source

LOCAL = "http://127.0.0.1:8765"


def client(tmp_path: Path, *, host: str = "127.0.0.1", token: str | None = None) -> TestClient:
    ws = sample_workspace(tmp_path)
    source = Source(ws.root, settings(tmp_path))
    return TestClient(dashboard_app(source, host=host, token=token), base_url=LOCAL)


def test_the_page_shows_every_section_with_a_strict_content_security_policy(tmp_path: Path):
    c = client(tmp_path)
    r = c.get("/dashboard")
    assert r.status_code == 200
    for section in ("sec-runs", "sec-ledger", "sec-tools", "sec-servers", "sec-lab", "diff"):
        assert f'id="{section}"' in r.text
    assert f'data-run="{RUN_ID}"' in r.text and r.text.count('class="ledger-row"') == 3
    assert 'svg class="plot" data-axis="iteration"' in r.text
    assert "never shown here" in r.text  # the page says whose it is
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "<script>" not in r.text  # no inline script: the CSP would block it
    assert c.get("/dashboard/static/dashboard.js").status_code == 200
    assert c.get("/dashboard/static/..%2Fdashboard_app.py").status_code == 404


def test_live_answers_204_while_nothing_changed_and_the_new_sections_after_a_change(
    tmp_path: Path,
):
    c = client(tmp_path)
    first = c.get("/dashboard/live?v=none").json()
    assert set(first["sections"]) >= {"sec-runs", "sec-ledger", "sec-head"}
    assert c.get(f"/dashboard/live?v={first['v']}").status_code == 204
    ws = Source(tmp_path / "ws", settings(tmp_path)).workspace()
    assert ws is not None
    from harnesslab.tools.loop.state import RunStore  # noqa: PLC0415

    store = RunStore(ws, RUN_ID)
    state = store.load()
    state.iterations[-1].step = "done"
    state.status = "completed"
    store.save(state)
    after = c.get(f"/dashboard/live?v={first['v']}")
    assert after.status_code == 200 and after.json()["v"] != first["v"]
    assert 'data-status="completed"' in after.json()["sections"]["sec-runs"]


def test_a_ledger_rows_diff_is_served_highlighted_and_escaped(tmp_path: Path):
    c = client(tmp_path)
    page = c.get("/dashboard").text
    candidate = page.split('class="ledger-row" data-candidate="', 2)[2].split('"', 1)[0]
    r = c.get(f"/dashboard/diff?candidate={candidate}")
    assert r.status_code == 200 and 'class="diff"' in r.text
    assert '<span class="hl-com"># better</span>' in r.text and 'class="d-del"' in r.text
    assert "no checkpoint" in c.get("/dashboard/diff?candidate=0123456789abcdef").text


def test_text_the_agent_wrote_is_escaped(tmp_path: Path):
    text = client(tmp_path).get("/dashboard").text
    assert "<script>alert(1)</script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text  # a qualification check's evidence


def test_on_loopback_a_foreign_host_or_origin_is_refused(tmp_path: Path):
    c = client(tmp_path)
    assert c.get("/dashboard", headers={"Host": "evil.example:8765"}).status_code == 421
    assert c.get("/dashboard", headers={"Origin": "http://evil.example"}).status_code == 403
    assert c.get("/dashboard", headers={"Host": "localhost:9000"}).status_code == 200


def test_with_a_token_the_page_needs_it_by_header_or_by_the_login_cookie(tmp_path: Path):
    c = client(tmp_path, token="s3cret")
    refused = c.get("/dashboard")
    assert refused.status_code == 403 and 'action="/dashboard/login"' in refused.text
    assert RUN_ID not in refused.text and c.get("/dashboard/live").status_code == 403
    assert c.get("/dashboard", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert c.get("/dashboard", headers={"Authorization": "Bearer wrong"}).status_code == 403
    wrong = c.post("/dashboard/login", data={"token": "wrong"}, follow_redirects=False)
    assert wrong.status_code == 403 and COOKIE not in wrong.cookies
    ok = c.post("/dashboard/login", data={"token": "s3cret"}, follow_redirects=False)
    assert ok.status_code == 303 and "s3cret" not in ok.headers["set-cookie"]
    assert "httponly" in ok.headers["set-cookie"].lower()
    assert c.get("/dashboard").status_code == 200  # the client keeps the cookie
    c.cookies.set(COOKIE, "forged")
    assert c.get("/dashboard").status_code == 403


def test_serve_mounts_the_page_beside_mcp_and_both_need_the_token(tmp_path: Path):
    ws = sample_workspace(tmp_path)
    seen: list[str] = []

    async def mcp_app(scope, receive, send):
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"mcp"})

    app = mount_dashboard(
        BearerAuth(mcp_app, "tok"), Source(ws.root, settings(tmp_path)), host="127.0.0.1",
        token="tok",
    )  # fmt: skip
    c = TestClient(app, base_url=LOCAL)
    assert c.get("/mcp").status_code == 403 and seen == []
    assert c.get("/mcp", headers={"Authorization": "Bearer tok"}).text == "mcp"
    assert c.get("/dashboard").status_code == 403
    assert c.get("/dashboard", headers={"Authorization": "Bearer tok"}).status_code == 200
    assert seen == ["/mcp"]


def test_a_failure_is_answered_with_a_line_not_a_500_or_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    c = client(tmp_path)

    def boom(self, now=None):
        raise RuntimeError("secret detail")

    monkeypatch.setattr(Source, "snapshot", boom)
    page = c.get("/dashboard")
    assert page.status_code == 200 and "could not read this: RuntimeError" in page.text
    assert "Traceback" not in page.text and "secret detail" not in page.text
    live = c.get("/dashboard/live?v=x")
    assert live.status_code == 200 and "RuntimeError" in live.json()["error"]


def test_a_deleted_workspace_still_gets_a_page_that_says_so(tmp_path: Path):
    import shutil  # noqa: PLC0415

    c = client(tmp_path)
    shutil.rmtree(tmp_path / "ws")
    r = c.get("/dashboard")
    assert r.status_code == 200 and "not a harnesslab workspace yet" in r.text


def test_the_command_refuses_to_serve_off_loopback_without_a_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("HARNESSLAB_TOKEN", raising=False)
    assert main(["dashboard", "-w", str(tmp_path), "--host", "0.0.0.0"]) == 2
    assert "without a token" in capsys.readouterr().err


def test_the_plot_draws_passed_scores_as_points_a_rejected_one_as_a_cross_and_the_loops_best(
    tmp_path: Path,
):
    from harnesslab.servers.dashboard_plot import score_plot  # noqa: PLC0415
    from harnesslab.tools.dashboard.gather import gather  # noqa: PLC0415

    (run,) = gather(sample_workspace(tmp_path)).runs
    svg = score_plot(run, "iteration")
    assert svg.count("<circle") == 2  # the baseline and iteration 1
    assert 'data-kind="baseline"' in svg and 'data-iteration="1"' in svg
    assert svg.count('class="pt-failed" data-kind="iteration" data-iteration="2"') == 1
    # The best line: the baseline, a step down at iteration 1 (the loop's new best), flat after.
    points = svg.split('class="best-line" points="', 1)[1].split('"', 1)[0].split()
    ys = [float(p.split(",")[1]) for p in points]
    assert len(points) == 4 and ys[0] == ys[1] and ys[1] != ys[2] and ys[2] == ys[3]
    assert "no verified score yet" in score_plot(run.model_copy(update={"points": []}), "time")


def test_the_lab_section_shows_the_matrix_claims_and_serves_only_the_reports_plots(
    tmp_path: Path,
):
    quick = Path(__file__).resolve().parents[2] / "docs" / "lab" / "2026-11-21-h100-quick"
    ws = sample_workspace(tmp_path)
    source = Source(ws.root, settings(tmp_path), labs=[quick])
    c = TestClient(dashboard_app(source, host="127.0.0.1", token=None), base_url=LOCAL)
    text = c.get("/dashboard").text
    assert "Claims ledger" in text and 'class="matrix"' in text
    assert 'src="/dashboard/file/lab/0/softmax_perf.png"' in text
    png = c.get("/dashboard/file/lab/0/softmax_perf.png")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    assert c.get("/dashboard/file/lab/0/results.json").status_code == 404
    assert c.get("/dashboard/file/lab/0/..%2F..%2FREADME.md").status_code == 404
    assert c.get("/dashboard/file/lab/1/softmax_perf.png").status_code == 404


def test_the_highlighter_colours_python_and_escapes_everything_it_is_given():
    from harnesslab.servers.dashboard_highlight import highlight_lines  # noqa: PLC0415

    src = 'def k(x):  # </code><script>alert(1)</script>\n    return "<b>" * 2\n'
    first, second = highlight_lines("kernel.py", src)
    assert first.startswith('<span class="hl-kw">def</span> <span class="hl-def">k</span>')
    assert "<script>" not in first and "&lt;script&gt;" in first and "hl-com" in first
    assert '<span class="hl-str">&quot;&lt;b&gt;&quot;</span>' in second and "hl-num" in second
    (json_line,) = highlight_lines("kernel_config.json", '{"num_warps": 4}')
    assert '<span class="hl-num">4</span>' in json_line
    unclosed = highlight_lines("kernel.py", 'x = """never closed\n<i>')
    assert unclosed == ["x = &quot;&quot;&quot;never closed", "&lt;i&gt;"]


def test_the_login_page_gets_its_stylesheet_but_nothing_else_without_the_token(tmp_path: Path):
    c = client(tmp_path, token="s3cret")
    assert c.get("/dashboard/static/dashboard.css").status_code == 200
    assert c.get("/dashboard/diff?candidate=0123456789abcdef").status_code == 403
    assert c.get("/dashboard/file/lab/0/x.png").status_code == 403
