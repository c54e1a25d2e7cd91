"""Helpers for driving the chat app with Textual's pilot."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import Static

from engine.async_llm import AsyncLLM
from minisgl_cli.tui.app import ChatApp
from minisgl_cli.tui.local import LocalBackend
from minisgl_cli.tui.session import ChatSession
from minisgl_cli.tui.stats import Load
from minisgl_cli.tui.store import ChatStore
from minisgl_cli.tui.widgets import MetricsPanel, PromptBox

T = TypeVar("T")
_notified: dict[int, list[tuple[str, str]]] = {}  # id(app) -> every (notification, severity) it showed


def run_pilot(app: ChatApp, scenario: Callable[[ChatApp, Pilot], Awaitable[None]]) -> ChatApp:
    """Run `scenario(app, pilot)` inside the app, headless at 120x40; notices(app) keeps every notification
    (Textual drops them from the screen when they time out)."""
    seen: list[tuple[str, str]] = []
    _notified[id(app)] = seen
    show = app.notify

    def notify(message: str, **kw: Any) -> None:
        seen.append((message, kw.get("severity", "information")))
        show(message, **kw)

    setattr(app, "notify", notify)  # noqa: B010 (mypy refuses assigning to a method)

    async def main() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await scenario(app, pilot)

    asyncio.run(main())
    return app


def run_app(
    llm,
    scenario,
    store: ChatStore | None = None,
    session: ChatSession | None = None,
    inputs: list[str] | None = None,
    **settings,
) -> ChatApp:
    """run_pilot over a fresh AsyncLLM on `llm`; saved to `store` if given; `session` (with its input history) or a
    new one from `settings`."""
    engine = AsyncLLM(llm)
    if session is None:
        session = ChatSession(max_tokens_limit=llm.engine.max_model_len, **settings)
    app = ChatApp(LocalBackend(engine), session, store, inputs)
    try:
        run_pilot(app, scenario)
    finally:
        engine.shutdown()
    assert engine.error is None
    return app


async def wait_for(pilot, cond, timeout: float = 60.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, (
            f"timed out waiting for {what}; notices: {notices(pilot.app)}; "
            f"history: {[(m.role, m.content[:40]) for m in pilot.app.session.history]}"
        )
        await pilot.pause(0.02)


async def send(pilot, text: str, typed: bool = False) -> None:
    """Enter a line in the input box: key by key when `typed`, else set at once (faster) and press enter."""
    await pilot.click("#prompt")
    if typed:
        await pilot.press(*text)
    else:
        pilot.app.query_one(PromptBox).value = text
    await pilot.press("enter")


def rendered(renderable) -> str:
    console = Console(width=100, file=io.StringIO(), record=True)
    console.print(renderable)
    return console.export_text()


def panel_text(app: ChatApp, part: str) -> str:
    return rendered(app.query_one(MetricsPanel).query_one(f"#{part}", Static).content)


def notified(app: ChatApp) -> list[tuple[str, str]]:
    return _notified[id(app)]


def notices(app: ChatApp) -> list[str]:
    return [message for message, _ in notified(app)]


def errors(app: ChatApp) -> list[str]:
    return [message for message, severity in notified(app) if severity == "error"]


def known(value: T | None) -> T:
    """A number the test knows its source gives (Load's fields are None where a server does not say)."""
    assert value is not None
    return value


def load(app: ChatApp) -> Load:
    assert app.last_metrics is not None, "no load read yet"
    return app.last_metrics


def engine(app: ChatApp) -> AsyncLLM:
    assert isinstance(app.backend, LocalBackend)
    return app.backend.engine


async def idle(app: ChatApp, pilot, what: str = "the answer") -> None:
    """Wait until no answer is being generated and the last message is an answer."""
    await wait_for(
        pilot,
        lambda: not app.generating and app.session.history and app.session.history[-1].role == "assistant",
        what=what,
    )
