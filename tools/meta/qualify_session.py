"""The checks that need the server running: the MCP session over stdio (startup, tools/list,
each tool's probe call, verifier cheats, stdout noise, then the custom tools again in a server
started anew, as a served one is: `served_rerun`), the self-test and the server's own tests.
Each runs in its own clean room, bounded by its own limit and the overall deadline.

The session's server is started the way a client starts a registered one, and its custom tools
see what they will see when served: the clean room at the served workspace's own path, the
bundle at `<workspace>/.harnesslab/mcp/<name>`, the same environment (tools/meta/
custom_host.py; qualification.py sets it up). The rerun comes after that first session used the
room (its telemetry and files are there), so a tool that behaves until its workspace has been
used, or until a later start, is called there too."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from ..errors import ExecutorError
from ..execution import CommandResult, LocalExecutor
from ..gpu.isolation.sandbox_policy import Launch, Limits, python_argv
from .cleanroom import ProtocolSession, describe_sandbox, sandbox_report, sandboxed
from .genserver import LaunchSpec, Manifest, ManifestTool
from .qualify_checks import ENV_ALLOW, Cheat, Check, Lane, remaining, shell, verdict_of


def tools_list_check(
    reply: dict[str, Any] | None, manifest: Manifest, took: float
) -> tuple[dict[str, dict[str, Any]] | None, Check]:
    def fail(evidence: str, next_step: str) -> tuple[None, Check]:
        return None, Check(
            name="tools_list", passed=False, evidence=evidence, next_step=next_step, duration_s=took
        )

    if reply is None or not reply.get("ok"):
        why = (reply or {}).get("error", "no answer")
        return fail(f"tools/list failed: {why}", "make the server answer tools/list")
    listed = {t["name"]: t for t in reply.get("tools", [])}
    if not listed:
        return fail("tools/list is empty", "register at least one tool (check manifest 'enabled')")
    problems = []
    for name, tool in listed.items():
        for key in ("input_schema", "output_schema"):
            problem = _schema_problem(tool.get(key), required=key == "input_schema")
            if problem:
                problems.append(f"{name}.{key}: {problem}")
    missing = [t.name for t in manifest.enabled_tools() if t.name not in listed]
    if missing:
        problems.append(f"enabled in manifest.json but not listed: {', '.join(missing)}")
    if problems:
        _, check = fail("\n".join(problems), "fix the tool signatures/models named above")
        return listed, check
    return listed, Check(
        name="tools_list",
        passed=True,
        evidence=f"{len(listed)} tools, valid schemas: {', '.join(sorted(listed))}",
        duration_s=took,
    )


def _schema_problem(schema: Any, *, required: bool) -> str:
    if schema is None:
        return "missing" if required else ""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "the root must be a JSON Schema object with type 'object'"
    try:
        from jsonschema.exceptions import SchemaError
        from jsonschema.validators import validator_for
    except ImportError:  # pragma: no cover - jsonschema comes with the MCP SDK
        return ""
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        return f"invalid JSON Schema: {exc.message}"
    return ""


def _required(tool: dict[str, Any]) -> list[str]:
    return list((tool.get("input_schema") or {}).get("required") or [])


async def session_checks(
    manifest: Manifest,
    room: Path,
    launch: LaunchSpec,
    python: str,
    env: dict[str, str],
    deadline: float,
    cheats: list[Cheat],
    lane: Lane,
    io_dir: Path,
) -> None:
    """startup, tools_list, tool:<name>, verifier:<name>, then stdout_protocol_only. `launch`
    starts the server: for a generated one the toolkit's own command (its custom tools then
    run in their sandboxed worker), never the manifest's."""
    session = ProtocolSession(python, io_dir)
    rerun = False
    try:
        t0 = time.perf_counter()
        hello = await session.start(
            launch.argv,
            launch.cwd,
            {**launch.env, **env},  # the manifest's env cannot override the allowlist's own
            min(manifest.startup_timeout_s, remaining(deadline)),
        )
        took = round(time.perf_counter() - t0, 3)
        if not hello.get("started"):
            if hello.get("framing") == "content-length":
                fix = (
                    "serve MCP over stdio as the SDK does (one JSON message per line, e.g. "
                    "`MCPServer(...).run()`), or regenerate it with generate_server"
                )
            else:
                fix = (
                    f"run `{shell(launch.argv)}` from the workspace root and fix what it prints "
                    "on stderr"
                )
            stderr = session.stderr_tail().strip() or "(nothing)"
            await lane.add(
                Check(
                    name="startup",
                    passed=False,
                    evidence=f"{hello.get('error')}\n--- server stderr (last lines) ---\n{stderr}",
                    next_step=fix,
                    duration_s=took,
                )
            )
            return
        await lane.add(
            Check(
                name="startup",
                passed=True,
                evidence=f"answered initialize in {hello.get('startup_s', took):.2f}s",
                duration_s=took,
            )
        )
        t0 = time.perf_counter()
        reply = await session.request({"op": "tools"}, min(30.0, remaining(deadline)))
        listed, check = tools_list_check(reply, manifest, round(time.perf_counter() - t0, 3))
        await lane.add(check)
        if listed is None:
            return
        declared = {t.name: t for t in manifest.enabled_tools()}
        order = sorted(declared.values(), key=lambda t: not t.verifier)
        extra = [
            ManifestTool(name=n, timeout_s=manifest.tool_timeout_s)
            for n in sorted(listed)
            if n not in declared
        ]
        results: dict[str, dict[str, Any] | None] = {}
        unresponsive = ""
        for tool in [*order, *extra]:
            if tool.name not in listed:
                await lane.add(
                    Check(
                        name=f"tool:{tool.name}", passed=False, evidence="not listed by tools/list"
                    )
                )
                continue
            if unresponsive:
                await lane.add(
                    Check(
                        name=f"tool:{tool.name}",
                        passed=False,
                        evidence=f"not called: the server stopped answering after {unresponsive}",
                        next_step=f"fix {unresponsive} first",
                    )
                )
                continue
            if tool.name not in declared and _required(listed[tool.name]):
                await lane.add(
                    Check(
                        name=f"tool:{tool.name}",
                        passed=False,
                        evidence=f"requires {', '.join(_required(listed[tool.name]))} but "
                        "manifest.json declares no probe_args for it",
                        next_step="add the tool with probe_args to manifest.json 'tools'",
                    )
                )
                continue
            reply, check = await _call_tool(session, tool, deadline)
            results[tool.name] = reply
            await lane.add(check)
            if reply is None or reply.get("timed_out"):
                ping = await session.request({"op": "ping", "timeout_s": 3.0}, 10.0)
                if not (ping or {}).get("ok"):
                    unresponsive = f"{tool.name} timed out"
        for tool in order:
            if tool.verifier and tool.name in listed and not unresponsive:
                await lane.add(
                    await verifier_check(
                        session, tool, results.get(tool.name), cheats, room, deadline
                    )
                )
        rerun = not unresponsive
    finally:
        with anyio.CancelScope(shield=True):
            await session.close()
            await lane.add(_noise_check(session))
    custom = [t for t in manifest.enabled_tools() if t.kind == "custom"]
    if rerun and custom:
        again = ProtocolSession(python, io_dir)
        try:
            startup_s = min(manifest.startup_timeout_s, remaining(deadline))
            await lane.add(
                await served_rerun(again, custom, launch, env, startup_s, deadline, cheats, room)
            )
        finally:
            with anyio.CancelScope(shield=True):
                await again.close()


async def served_rerun(
    session: ProtocolSession,
    tools: list[ManifestTool],
    launch: LaunchSpec,
    env: dict[str, str],
    startup_s: float,
    deadline: float,
    cheats: list[Cheat],
    room: Path,
) -> Check:
    """`served_rerun`: the server started anew in the room the first session used, and each
    custom tool called again (these are its new worker's first calls): every one must answer
    its probe arguments, and a verifier must still reject the first cheat."""
    t0 = time.perf_counter()

    def result(problems: list[str], evidence: str = "") -> Check:
        took = round(time.perf_counter() - t0, 3)
        if problems:
            return Check(
                name="served_rerun",
                passed=False,
                evidence="\n".join(problems),
                next_step="a tool must behave the same on every call and in every workspace: "
                "make it answer from its arguments and the workspace's files only",
                duration_s=took,
            )
        return Check(name="served_rerun", passed=True, evidence=evidence, duration_s=took)

    hello = await session.start(launch.argv, launch.cwd, {**launch.env, **env}, startup_s)
    if not hello.get("started"):
        return result([f"the server did not start again: {hello.get('error')}"])
    problems = []
    for tool in tools:
        _, check = await _call_tool(session, tool, deadline)
        if not check.passed:
            problems.append(f"{tool.name}: {check.evidence.splitlines()[0]}")
        elif tool.verifier and cheats:
            verdict = verdict_of(await _call_with(session, tool, cheats[0], room, deadline))
            if verdict is not False:
                how = "ACCEPTED" if verdict else "gave no verdict for"
                problems.append(f"{tool.name}: {how} the cheating kernel '{cheats[0].name}'")
    return result(problems, f"{len(tools)} custom tools answered again in a fresh server")


async def _call_with(
    session: ProtocolSession, tool: ManifestTool, cheat: Cheat, room: Path, deadline: float
) -> dict[str, Any] | None:
    """Call `tool` with the cheat's files in the room, then put the room's files back."""
    saved = {
        rel: (room / rel).read_bytes() if (room / rel).is_file() else None for rel in cheat.files
    }
    for rel, text in cheat.files.items():
        (room / rel).parent.mkdir(parents=True, exist_ok=True)
        (room / rel).write_text(text)
    try:
        reply, _ = await _call_tool(session, tool, deadline)
    finally:
        for rel, data in saved.items():
            if data is None:
                (room / rel).unlink(missing_ok=True)
            else:
                (room / rel).write_bytes(data)
    return reply


async def _call_tool(
    session: ProtocolSession, tool: ManifestTool, deadline: float
) -> tuple[dict[str, Any] | None, Check]:
    # A little grace past the tool's own limit, so a server that enforces it can say so itself.
    timeout_s = min(tool.timeout_s + 2.0, max(remaining(deadline) - 2.0, 1.0))
    t0 = time.perf_counter()
    reply = await session.request(
        {"op": "call", "tool": tool.name, "args": tool.probe_args, "timeout_s": timeout_s},
        timeout_s + 10.0,
    )
    took = round(time.perf_counter() - t0, 3)
    args = json.dumps(tool.probe_args)
    name = f"tool:{tool.name}"
    if reply is None or reply.get("timed_out"):
        return reply, Check(
            name=name,
            passed=False,
            evidence=f"timed out: no answer to probe_args {args} within {timeout_s:g}s",
            next_step=f"make {tool.name} finish within its timeout_s (no blocking calls in async "
            "code), or use smaller probe_args / a larger timeout_s",
            duration_s=took,
        )
    if not reply.get("ok"):
        return reply, Check(
            name=name,
            passed=False,
            evidence=f"error for probe_args {args}: {reply.get('text', '')}\n"
            f"--- server stderr (last lines) ---\n{session.stderr_tail(12)}",
            next_step=f"make {tool.name} succeed with its probe_args, or fix probe_args",
            duration_s=took,
        )
    return reply, Check(
        name=name,
        passed=True,
        evidence=f"answered {args} in {took:.2f}s: {(reply.get('text') or '')[:160]}",
        duration_s=took,
    )


async def verifier_check(
    session: ProtocolSession,
    tool: ManifestTool,
    honest: dict[str, Any] | None,
    cheats: list[Cheat],
    room: Path,
    deadline: float,
) -> Check:
    """The honest baseline (the probe call, made before any cheat) must be accepted; every
    cheating kernel must be rejected. Stops at the first cheat accepted."""
    name, t0 = f"verifier:{tool.name}", time.perf_counter()

    def result(passed: bool, evidence: str, next_step: str = "") -> Check:
        took = round(time.perf_counter() - t0, 3)
        return Check(
            name=name, passed=passed, evidence=evidence, next_step=next_step, duration_s=took
        )

    verdict = verdict_of(honest)
    if verdict is not True:
        why = "no verdict in its result" if verdict is None else "it rejected it"
        return result(
            False,
            f"the honest baseline was not accepted ({why}): {((honest or {}).get('text') or '')[:400]}",
            "a verifier must accept a correct kernel; return {'verdict': 'passed'} for it",
        )
    if not cheats:
        return result(True, "accepted the honest baseline; no cheating kernels apply to this task")
    rejected = []
    for cheat in cheats:
        reply = await _call_with(session, tool, cheat, room, deadline)
        verdict = verdict_of(reply)
        if verdict is True:
            return result(
                False,
                f"ACCEPTED the cheating kernel '{cheat.name}' ({cheat.description})",
                "a verifier must compare against the reference on fresh hidden inputs; wrap the "
                "built-in guarded_final_verify instead of checking by hand",
            )
        if verdict is None:
            text = ((reply or {}).get("text") or "no answer")[:300]
            return result(False, f"no verdict for the cheating kernel '{cheat.name}': {text}")
        rejected.append(cheat.name)
    return result(
        True,
        f"accepted the honest baseline; rejected {len(rejected)} cheats: {', '.join(rejected)}",
    )


def _noise_check(session: ProtocolSession) -> Check:
    if session.noise:
        return Check(
            name="stdout_protocol_only",
            passed=False,
            evidence=f"{len(session.noise)} line(s) on stdout that are not JSON-RPC, first: "
            f"{session.noise[0]!r}\n" + "\n".join(session.noise[1:10]),
            next_step="stdout carries the protocol only: log with `logging` (stderr) or "
            "print(..., file=sys.stderr); remove print() calls",
        )
    if session.group is None:
        return Check(name="stdout_protocol_only", passed=False, evidence="the server never ran")
    return Check(name="stdout_protocol_only", passed=True, evidence="only JSON-RPC lines on stdout")


@dataclass
class Confined:
    """How a lane runs the agent's processes: in the sandbox (cleanroom.sandboxed), writable
    clean room and private state dir only, the room shown at `served` (the served workspace's
    path) where the sandbox can mount it. `levels` collects what each sandbox reported."""

    python: str
    require: bool
    limits: Limits = field(default_factory=Limits)
    served: Path | None = None  # None where the sandbox cannot mount (mounts_available)
    levels: dict[str, str] = field(default_factory=dict)

    def shown(self, room: Path) -> Path:
        """Where the lane's processes see `room` (argv names that path)."""
        return self.served or room

    def launch(self, argv: list[str], room: Path, state_dir: Path, env: dict[str, str]) -> Launch:
        return sandboxed(
            argv, room, state_dir, env, python=self.python, require=self.require,
            limits=self.limits, shown=self.shown(room),
        )  # fmt: skip

    async def run(
        self, lane: str, argv: list[str], room: Path, state_dir: Path, env: dict[str, str],
        timeout_s: float,
    ) -> CommandResult:  # fmt: skip
        """Run `argv` sandboxed in `room`; the sandbox's report is taken off its stdout."""
        self.levels[lane] = "not started"
        launch = self.launch(argv, room, state_dir, env)
        res = await LocalExecutor(room).run(
            launch.argv,
            cwd=str(room),
            timeout_s=timeout_s,
            stdin=launch.stdin,
            env_allow=ENV_ALLOW,  # the sandbox's own process; what runs inside gets `env` only
        )
        report, limit, res.stdout = sandbox_report(res.stdout, launch.token)
        if report:
            self.levels[lane] = describe_sandbox(report)
        if limit:  # the sandbox's own count: say it where the evidence is read
            res.stderr += f"\nsandbox: resource_limit: {limit} (a limit of the sandbox ended it)"
        return res


async def self_test_check(
    manifest: Manifest,
    room: Path,
    argv: list[str],
    state_dir: Path,
    env: dict[str, str],
    deadline: float,
    lane: Lane,
    confined: Confined,
) -> None:
    """`argv` (the self-test command: for a generated server the toolkit's, calling its custom
    tools) run sandboxed in the clean room."""
    if manifest.self_test is None:
        await lane.add(
            Check(
                name="self_test",
                passed=False,
                evidence="manifest.json declares no self_test",
                next_step='add "self_test": {"args": [..., "--self-test"]} to manifest.json and '
                "make --self-test call every tool, exiting 0 only when all work",
            )
        )
        return
    timeout_s = min(manifest.self_test.timeout_s, remaining(deadline))
    try:
        res = await confined.run("self-test", argv, room, state_dir, env, timeout_s)
    except ExecutorError as exc:
        await lane.add(
            Check(
                name="self_test",
                passed=False,
                evidence=f"`{shell(argv)}` did not start: {exc.message}",
                next_step="fix manifest.json command/args so the self-test can start",
            )
        )
        return
    lines = (res.stdout + res.stderr).strip().splitlines()
    tail = "\n".join(lines[-12:])
    if res.timed_out or res.exit_code != 0:
        how = f"timed out after {timeout_s:g}s" if res.timed_out else f"exited {res.exit_code}"
        fail = next((x for x in lines if x.startswith("FAIL")), "")
        how += f" ({fail[:200]})" if fail else ""
        await lane.add(
            Check(
                name="self_test",
                passed=False,
                evidence=f"`{shell(argv)}` {how}\n{tail}",
                next_step="run the self-test from the workspace root and fix what it reports",
                duration_s=round(res.duration_s, 3),
            )
        )
        return
    await lane.add(
        Check(
            name="self_test",
            passed=True,
            evidence=f"exit 0 in {res.duration_s:.1f}s\n{tail}",
            duration_s=round(res.duration_s, 3),
        )
    )


async def tests_check(
    manifest: Manifest,
    room: Path,
    srv_rel: str,
    state_dir: Path,
    env: dict[str, str],
    deadline: float,
    lane: Lane,
    confined: Confined,
) -> None:
    """The server's own pytest files (the agent's code) run sandboxed in the clean room."""
    if manifest.tests is None:  # "tests": null: the manifest says there are none
        await lane.add(
            Check(
                name="own_tests",
                passed=True,
                evidence='not run: manifest.json says "tests": null (the server has no tests)',
            )
        )
        return
    tests = room / srv_rel / manifest.tests
    if not manifest.tests or not tests.is_dir():
        await lane.add(
            Check(
                name="own_tests",
                passed=False,
                evidence=f"no tests folder ({srv_rel}/{manifest.tests or 'tests'})",
                next_step="add pytest tests that call the server's tools in process",
            )
        )
        return
    argv = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    if manifest.generator.startswith("harnesslab"):
        # Generated tests need only the anyio plugin (autoloading the rest costs ~1 s), and
        # their built-in probes repeat what the session and the self-test already called.
        env = {**env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        argv += ["-p", "anyio", "-k", "not builtin_tool"]
    seen = confined.shown(room)
    argv += ["--rootdir", str(seen / srv_rel), str(seen / srv_rel / manifest.tests)]
    argv = python_argv(confined.python, argv)
    timeout_s = remaining(deadline)
    try:
        res = await confined.run("own tests", argv, room, state_dir, env, timeout_s)
    except ExecutorError as exc:
        await lane.add(Check(name="own_tests", passed=False, evidence=f"pytest: {exc.message}"))
        return
    tail = "\n".join(res.stdout.strip().splitlines()[-15:])
    passed = res.exit_code == 0
    if res.timed_out:
        evidence = f"pytest timed out after {timeout_s:g}s\n{tail}"
    elif res.exit_code == 5:
        evidence = "pytest collected no tests"
    else:
        evidence = f"pytest exited {res.exit_code}\n{tail}\n{res.stderr_tail(5)}".strip()
    await lane.add(
        Check(
            name="own_tests",
            passed=passed,
            evidence=evidence,
            next_step="" if passed else f"run `python -m pytest {srv_rel}/tests` and fix it",
            duration_s=round(res.duration_s, 3),
        )
    )


__all__ = [
    "Confined",
    "self_test_check",
    "served_rerun",
    "session_checks",
    "tests_check",
    "tools_list_check",
    "verifier_check",
]
