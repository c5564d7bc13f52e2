"""`report` is the one way a progress step reaches its callback: a plain function, a coroutine
function (awaited), or none."""

from __future__ import annotations

import pytest

from harnesslab.tools.progress import report


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_step_reaches_a_plain_or_an_async_callback_and_no_callback_is_fine():
    seen: list[tuple[float, float, str]] = []

    async def later(done: float, total: float, message: str) -> None:
        seen.append((done, total, message))

    await report(lambda *step: seen.append(step), 1, 2, "plain")
    await report(later, 2, 2, "awaited")
    await report(None, 0, 1, "nobody listens")
    assert seen == [(1, 2, "plain"), (2, 2, "awaited")]
