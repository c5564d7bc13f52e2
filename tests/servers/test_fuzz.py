"""Property: no argument dict, however wrong, crashes the task server. Every call answers with a
result or a ToolError (never an internal error or a protocol failure), and the server keeps
serving. The server runs on a CannedLauncher (no runner) inside one blocking portal, so each
example costs a millisecond round trip."""

from __future__ import annotations

import anyio
import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client

from harnesslab.servers.builtin import BUILTINS
from harnesslab.servers.task_server import build_task_server

from .support import SMALL, CannedLauncher, kernel_workspace, state_for, text_of
from .support import settings as make_settings

TOOLS = [
    "inspect_context",
    "run_objective",
    "sweep_kernel_config",
    "numerical_probe",
    "guarded_final_verify",
    "rank_history",
    "restore_best_checkpoint",
    "profile_kernel",
    "remote_health_check",
]
KNOWN_KEYS = [
    "recent", "cases", "warmup", "repeats", "space", "max_configs", "apply", "show", "probes",
    "dtypes", "show_passed", "rotate", "mode", "offset", "limit", "include_failed", "candidate",
    "case", "runner", "chart",
]  # fmt: skip
NASTY_TEXT = ["..", "../x", "a;b", "$(id)", "`id`", "\x00", "dev", "final", SMALL, "num_warps"]

CASES = [SMALL, "768x2048_fp16", "nope", "..", "a b"]
KNOBS = ["num_warps", "num_stages", "rows_per_program", "bogus", ".."]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=300),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(NASTY_TEXT + CASES),
    st.text(max_size=12),
    st.text(alphabet="0123456789abcdef", max_size=20),  # candidate-hash-like
)
plausible = st.one_of(
    st.lists(st.sampled_from(CASES), max_size=3),
    st.lists(st.sampled_from(["float16", "bfloat16", "float32", "int8"]), max_size=3),
    st.lists(st.sampled_from(["zero_rows", "single_row", "nope", "a;b"]), max_size=3),
    st.dictionaries(
        st.sampled_from(KNOBS),
        st.lists(st.one_of(st.integers(0, 40), st.booleans(), st.text(max_size=3)), max_size=4),
        max_size=3,
    ),
    st.sampled_from(["dev", "final", "sweep", "best"]),
)
values = st.recursive(
    st.one_of(scalars, plausible),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KNOBS), inner, max_size=3)
    ),
    max_leaves=8,
)


def from_schema(prop: dict):
    """Values the argument's JSON schema allows (names drawn from plausible ones), so calls
    get past validation into the tools' own checks."""
    if "anyOf" in prop:
        return st.one_of([from_schema(p) for p in prop["anyOf"]])
    kind = prop.get("type")
    if "enum" in prop:
        return st.sampled_from(prop["enum"])
    if kind == "integer":
        return st.integers(prop.get("minimum", -10), prop.get("maximum", 10_000))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(
            from_schema(prop.get("items", {})), max_size=min(prop.get("maxItems", 4), 4)
        )
    if kind == "object":
        return plausible
    return st.sampled_from([*CASES, "zero_rows", "single_row", "deadbeef", "0123456789abcdef"])


def tool_calls(tool: str):
    """Schema-valid values, the tool's own names with any values, or any names at all."""
    model = BUILTINS[tool].input_model
    props = model.model_json_schema().get("properties", {})
    valid = st.fixed_dictionaries({}, optional={k: from_schema(p) for k, p in props.items()})
    own = st.dictionaries(st.sampled_from(list(props) or ["x"]), values, max_size=len(props))
    anything = st.dictionaries(
        st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=8)), values, max_size=4
    )
    return st.tuples(st.just(tool), st.one_of(valid, valid, own, anything))


@pytest.fixture(scope="module")
def portal_client(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    state = state_for(kernel_workspace(tmp).root, tmp, CannedLauncher(make_settings(tmp)))
    server = build_task_server(state)
    with start_blocking_portal("asyncio") as portal:
        with portal.wrap_async_context_manager(Client(server, mode="legacy")) as client:
            yield portal, client, state
        portal.call(state.aclose)


def call(portal, client, tool, args):
    async def go():
        with anyio.fail_after(30):
            return await client.call_tool(tool, args)

    return portal.call(go)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=st.sampled_from(TOOLS).flatmap(tool_calls))
def test_no_argument_dict_crashes_the_server(portal_client, case):
    portal, client, _ = portal_client
    tool, args = case
    res = call(portal, client, tool, args)
    if res.is_error:
        text = text_of(res)
        assert text and "internal error" not in text, text
        assert "Next" in text, text


def test_the_server_still_answers_after_the_fuzzing(portal_client):
    portal, client, state = portal_client
    assert not call(portal, client, "inspect_context", {}).is_error
    crashes = [r for r in state.telemetry.records() if r["status"] == "crash"]
    assert crashes == []
