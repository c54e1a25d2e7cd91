"""Helpers for driving the chat app with Textual's pilot."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from rich.console import Console
from textual import events
from textual.pilot import Pilot
from textual.widgets import Static

from engine.engine_loop import engine_info
from engine.ipc import Addresses
from engine.llm import LLM
from engine.remote_llm import RemoteLLM
from engine.tokenizer import sampling_defaults
from minisgl_cli.tui.app import ChatApp
from minisgl_cli.tui.local import LocalBackend
from minisgl_cli.tui.session import ChatSession
from minisgl_cli.tui.stats import Load
from minisgl_cli.tui.store import ChatStore
from minisgl_cli.tui.widgets import MetricsPanel, PromptBox
from tests.server_harness import InspectableLoop

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


class LocalEngine:
    """The engine loop on a thread of its own, as `minisgl chat` runs it in its own process, and a LocalBackend
    (RemoteLLM) on it for the chat."""

    def __init__(self, llm: LLM) -> None:
        self.llm, self.addrs = llm, Addresses.temporary()
        self.loop = InspectableLoop(llm.engine, self.addrs, engine_info(llm))
        self.thread = threading.Thread(target=self.loop.run, name="engine-loop", daemon=True)
        self.thread.start()

    def backend(self) -> LocalBackend:
        """A new front end's handle; it connects on the event loop that first awaits its ready()."""
        defaults = sampling_defaults(self.llm.config.model)  # as the chat's process reads them
        return LocalBackend(RemoteLLM(self.llm.tokenizer, self.addrs), engine_info(self.llm), None, defaults)

    def call(self, fn: Callable[[LLM], T], timeout: float = 30.0) -> T:
        """fn(llm) on the engine loop's thread, between steps."""
        return cast(T, self.loop.call(lambda _: fn(self.llm), timeout))

    def shutdown(self) -> None:
        self.loop.stop()
        self.thread.join(timeout=30)
        self.loop.close()
        self.addrs.remove()


_engines: dict[int, LocalEngine] = {}  # id(app) -> the engine behind it


def run_app(
    llm,
    scenario,
    store: ChatStore | None = None,
    session: ChatSession | None = None,
    inputs: list[str] | None = None,
    **settings,
) -> ChatApp:
    """run_pilot over a LocalEngine on `llm`; saved to `store` if given; `session` (with its input history) or a
    new one from `settings`."""
    engine = LocalEngine(llm)
    if session is None:
        session = ChatSession(max_tokens_limit=llm.engine.max_model_len, **settings)
    app = ChatApp(engine.backend(), session, store, inputs)
    _engines[id(app)] = engine
    try:
        run_pilot(app, scenario)
    finally:
        engine.shutdown()
    assert engine.loop.error is None
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


async def burst(pilot: Pilot, *keys: str) -> None:
    """Keys as a terminal hands over a paste or fast typing: all queued before the app handles the first. pilot.press
    waits until the app is idle after each key, so what a key sets going (a focus change) is done before the next."""
    for key in keys:
        pilot.app.post_message(events.Key(key, key if len(key) == 1 else None))
    await pilot.pause()


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


def engine(app: ChatApp) -> LocalEngine:
    return _engines[id(app)]


async def idle(app: ChatApp, pilot, what: str = "the answer") -> None:
    """Wait until no answer is being generated and the last message is an answer."""
    await wait_for(
        pilot,
        lambda: not app.generating and app.session.history and app.session.history[-1].role == "assistant",
        what=what,
    )
