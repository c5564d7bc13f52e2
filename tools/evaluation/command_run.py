"""Running a command task's objective: placeholders, the sandbox, and reading its JSON.

Shared by the dev objective (tools/command_task.py: run_objective, in the agent's workspace) and
the final one (tools/command_verify.py: the loop and guarded_final_verify, in a fresh copy of
the task's files). Side of the trust boundary: trusted code around a hostile command. The
command runs inside tools/sandbox.py through the launcher's executor; its stdout is parsed as
data, and what it says reaches a reason verbatim only for dev runs (the agent's own feedback).
A verdict's reason is composed here from which fields were set, never from their text: a run
fed hidden cases could spell them out in an error message.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from typing import Any

from ..errors import UsageError
from ..execution import CommandResult
from ..execution.launcher import Launcher, Slot, sandbox_level
from ..gpu import wire
from ..gpu.isolation.sandbox_policy import limit_hit, take_reports
from ..task.spec import PLACEHOLDER_RE

MAX_OUTPUT_KEYS = 40
MAX_ERROR_TEXT = 600
ERROR_KEYS = ("error", "errors", "reason", "message", "failure")
FAILED_STATUSES = ("failed", "fail", "error", "rejected", "timeout", "crashed")
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([A-Za-z0-9_.]{1,80})'")


def expand(command: str, values: dict[str, str]) -> str:
    """`command` with each {placeholder} replaced by its shell-quoted value. Unknown names were
    refused when task.toml was parsed; a known one without a value here is a UsageError."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in values:
            raise UsageError(
                f"the objective command uses {{{name}}}, which has no value here.",
                next_step=f"remove {{{name}}} from the objective, or give it a default",
            )
        return shlex.quote(values[name])

    return PLACEHOLDER_RE.sub(sub, command)


async def run_sandboxed(
    launcher: Launcher,
    slot: Slot,
    command: str,
    *,
    cwd: str,
    read: list[str],
    write: list[str],
    env: dict[str, str] | None = None,
    timeout_s: float,
    require: bool = False,
) -> tuple[CommandResult, str, str]:
    """`sh -c command` in the sandbox on `slot`'s executor (the caller holds the GPU lock).
    Returns the result with the sandbox's own report lines taken off stdout, the sandbox level
    the first reported (what the outer, trusted process applied), and the limit its exit report
    names ('' when none ended the run)."""
    # Installed bytecode: a command task's objective imports torch in a fresh process every
    # run, and compiling it from source into the sandbox's empty bytecode prefix tripled a run
    # (6 s -> 16 s on a 2-core CI box). The folders it runs in either are the agent's own (dev:
    # a planted .pyc only fools its own feedback) or were written fresh by the toolkit (final).
    launch = await launcher.sandboxed_argv(
        slot,
        ["sh", "-c", command],
        read=read,
        write=write,
        cwd=cwd,
        env=env,
        require=require,
        installed_bytecode=True,
    )
    res = await slot.executor.run(launch.argv, cwd=cwd, timeout_s=timeout_s, stdin=launch.stdin)
    start, end, rest = take_reports(res.stdout, launch.token)
    update: dict[str, Any] = {"stdout": rest}
    limit = limit_hit(end)  # the sandbox's own count, after every process of it is gone
    if limit:
        update["stderr"] = res.stderr + (
            f"\nsandbox: resource_limit: {limit} (a limit of the sandbox ended it)"
        )
    return res.model_copy(update=update), sandbox_level(start) if start else "none", limit


def parse_output(stdout: str, score_key: str) -> tuple[dict[str, Any] | None, str]:
    """The command's JSON object: the whole stdout, or else its last line that is a JSON
    object holding `score_key` (or, failing that, any JSON object: a failed run's error report
    often has no score). Returns (object or None, why not)."""
    text = stdout.strip()
    chunks = [text] + [ln.strip() for ln in reversed(text.splitlines())]
    fallback: dict[str, Any] | None = None
    for chunk in chunks:
        if not chunk.startswith("{"):
            continue
        obj = wire.json_object(chunk)  # hostile: size and nesting bounded, objects only
        if obj is not None:
            if score_key in obj:
                return obj, ""
            fallback = fallback or obj
    if fallback is not None:
        return fallback, f"the objective's JSON has no key {score_key!r}"
    if not text:
        return None, "the objective command printed nothing on stdout"
    return None, f"no JSON object with key {score_key!r} on stdout (last line: {text[-200:]!r})"


def score_of(obj: dict[str, Any], key: str) -> tuple[float | None, str]:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, f"{key}={value!r} is not a number"
    if not math.isfinite(value):
        return None, f"{key}={value!r} is not finite"
    return float(value), ""


def says_failed(obj: dict[str, Any]) -> bool:
    """The objective's own JSON reports a failure (status, verified or passed)."""
    status = obj.get("status")
    if isinstance(status, str) and status.lower() in FAILED_STATUSES:
        return True
    return obj.get("verified") is False or obj.get("passed") is False


def meaningful_of(obj: dict[str, Any] | None) -> bool | None:
    """What the objective says of its timings (`meaningful`), or None when it does not say."""
    value = (obj or {}).get("meaningful")
    return value if isinstance(value, bool) else None


def error_fields(obj: dict[str, Any] | None, *, names: bool = False) -> list[tuple[str, Any]]:
    """(path, value) of every error-like field the objective's JSON sets: top-level error,
    errors, reason, message, failure, and the same in each of `cases` (`names`: with the case's
    own name in the path, which only a dev run may show: a final one's could spell a shape)."""
    out: list[tuple[str, Any]] = []
    if not obj:
        return out
    for key in ERROR_KEYS:
        if obj.get(key) not in (None, "", [], {}):
            out.append((key, obj[key]))
    cases = obj.get("cases")
    if isinstance(cases, list):
        for i, case in enumerate(cases[:256]):
            if not isinstance(case, dict):
                continue
            for key in ERROR_KEYS:
                if case.get(key) not in (None, "", [], {}):
                    name = case.get("name") if names else None
                    label = f"cases[{i}]" + (f" ({name})" if isinstance(name, str) else "")
                    out.append((f"{label}.{key}", case[key]))
    return out


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "; ".join(_text(v) for v in value)
    return value if isinstance(value, str) else json.dumps(value, default=str)


def dev_reason(
    res: CommandResult, obj: dict[str, Any] | None, why: str, timeout_s: float, python: str
) -> str:
    """Why a dev run failed, for the agent: the objective's own error fields (its text: the
    agent's own run), then the exit and stderr. '' when it passed."""
    parts: list[str] = []
    if res.timed_out:
        parts.append(f"the objective command timed out after {timeout_s:.0f}s and was killed")
    errors = error_fields(obj, names=True)
    if errors:
        parts.append(
            "the objective reports: "
            + " | ".join(f"{path}: {_text(value)}" for path, value in errors)[:MAX_ERROR_TEXT]
        )
    elif obj is not None and says_failed(obj):
        parts.append(f"the objective's JSON says status={obj.get('status')!r} with no error field")
    if not res.timed_out and res.exit_code != 0:
        tail = res.stderr_tail(3).replace("\n", " | ").strip()
        parts.append(
            f"the objective command exited with {res.exit_code}"
            + (f": {tail[-300:]}" if tail else " (nothing on stderr)")
        )
    missing = _MISSING_MODULE.search(res.stderr)
    if missing:
        parts.append(missing_module_hint(missing.group(1), python))
    if not parts and why:
        parts.append(why)
    return "; ".join(parts)


def missing_module_hint(module: str | None, python: str) -> str:
    what = f"has no module {module!r}" if module else "is missing a module it imports"
    return (
        f"the objective's Python {what}: a bare `python3` resolves on the server's PATH "
        f"(often not your venv); write {{python}} in task.toml's objective for the toolkit's "
        f"interpreter ({python}), or an absolute path to one that has it"
    )


def verdict_reason(
    res: CommandResult,
    obj: dict[str, Any] | None,
    why: str,
    timeout_s: float,
    python: str,
    *,
    hidden: bool = True,
) -> list[dict[str, str]]:
    """Why a final run failed, as {code, detail} in the harness's fixed words: that the
    objective reported an error or a failure, exited nonzero, timed out. On hidden cases never its
    text, nor which fields or cases, nor its exit status: the run was fed the hidden cases, and
    each of those is a value it chooses (the store's hidden results keep its output for the
    operator). A run on the verifier's own fixed cases (`hidden=False`) had nothing to hide: its
    error text is quoted, marked as its own words ("CUDA is not available" was withheld before,
    leaving nothing to act on)."""
    reasons: list[dict[str, str]] = []
    if res.timed_out:
        reasons.append(
            {
                "code": "timeout",
                "detail": f"the final objective timed out after {timeout_s:.0f}s and was killed",
            }
        )
    if error_fields(obj):
        if hidden:
            said = (
                " (which fields and cases, and their text, are withheld: they were computed on "
                "the hidden cases; run the dev objective to see messages)"
            )
        else:
            quoted = " | ".join(f"{p}: {_text(v)}" for p, v in error_fields(obj, names=True))
            said = f"; in its own words: {quoted[:MAX_ERROR_TEXT]}"
        reasons.append(
            {
                "code": "objective_error",
                "detail": "the final objective's JSON reports an error" + said,
            }
        )
    elif obj is not None and says_failed(obj):
        reasons.append(
            {
                "code": "objective_failed",
                "detail": "the final objective's JSON reports a failure (its status, verified "
                "or passed field)",
            }
        )
    if not res.timed_out and res.exit_code != 0:
        tail = "" if hidden else res.stderr_tail(3).replace("\n", " | ").strip()[-300:]
        reasons.append(
            {
                "code": "objective_exit",
                "detail": "the final objective exited with a nonzero status"
                + ("" if hidden else f" ({res.exit_code})")
                + (f"; its stderr ends: {tail}" if tail else ""),
            }
        )
    missing = _MISSING_MODULE.search(res.stderr)
    if missing:
        module = None if hidden else missing.group(1)
        reasons.append({"code": "missing_module", "detail": missing_module_hint(module, python)})
    if not reasons and why:
        reasons.append({"code": "no_score", "detail": _harness_why(why)})
    return reasons


def _harness_why(why: str) -> str:
    """parse_output/score_of's message without the objective's own text in it."""
    if why.startswith("no JSON object"):
        return why.split(" (last line", 1)[0]
    if " is not " in why:  # "best_us='...' is not a number": the value is the objective's
        key = why.split("=", 1)[0]
        return f"{key} is not a finite number"
    return why


def capped_output(obj: dict[str, Any] | None) -> dict[str, Any]:
    return dict(list((obj or {}).items())[:MAX_OUTPUT_KEYS])


__all__ = [
    "capped_output",
    "dev_reason",
    "error_fields",
    "expand",
    "meaningful_of",
    "missing_module_hint",
    "parse_output",
    "run_sandboxed",
    "says_failed",
    "score_of",
    "verdict_reason",
]
