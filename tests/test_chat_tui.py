"""The chat TUI driven through Textual's pilot against real engines: the embedded SmolLM2 for a real answer,
the tiny random model elsewhere (fast, no EOS, so answers run to max_tokens)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import re
import time

import pytest
from textual import events
from textual.content import Content
from textual.widgets import Sparkline
from textual.widgets._markdown import MarkdownParagraph
from textual.widgets._toast import Toast

from engine.remote_llm import RemoteLLM
from engine.sampling_params import SamplingParams
from engine.streams import END as _END
from engine.streams import RequestStream
from minisgl_cli.report import latency_stats
from minisgl_cli.tui.app import ChatApp
from minisgl_cli.tui.local import LocalAnswer, LocalBackend
from minisgl_cli.tui.session import ChatMessage, ChatSession
from minisgl_cli.tui.store import ChatStore
from minisgl_cli.tui.turn import TurnReader, TurnStats
from minisgl_cli.tui.widgets import AnswerMarkdown, AssistantMessage, MetricsPanel, NoteMessage, PromptBox, UserMessage
from tests.chat_pilot import (
    LocalEngine,
    burst,
    engine,
    errors,
    idle,
    known,
    load,
    notices,
    notified,
    panel_text,
    rendered,
    run_app,
    run_pilot,
    send,
    wait_for,
)
from tests.conftest import checked, make_llm
from tests.test_chat_thinking import ScriptedAnswer, ScriptedBackend


@pytest.fixture(scope="module")
def tiny():
    return make_llm("dummy:tiny-llama", num_pages=512)


def test_real_model_streams_answer_and_reuses_prefix(smollm, monkeypatch):
    appended: list[str] = []  # every fragment the reply widget was given, to show it grew while streaming
    append = AnswerMarkdown.append
    monkeypatch.setattr(AnswerMarkdown, "append", lambda self, md: (appended.append(md), append(self, md))[1])

    async def scenario(app: ChatApp, pilot) -> None:
        assert "SmolLM2" in app.sub_title and "cpu" in app.sub_title and "TP 1" in app.sub_title
        await send(pilot, "What is the capital of France?", typed=True)
        await wait_for(pilot, lambda: not app.generating, what="first answer")
        reply = app.query_one(AssistantMessage)
        first = reply.answer.source
        assert re.search(r"\bParis\b", first), first
        assert len(re.findall(r"[A-Za-z]{2,}", first)) >= 3, first
        assert app.turn.finish_reason == "stop" and app.turn.ttft and app.turn.ttft > 0
        assert app.session.messages() == [
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": first},
        ]
        assert re.search(r"TTFT\s+\d+\.\d ms", panel_text(app, "turn"))

        # Second turn: its prompt starts with the whole first turn, which the radix cache holds.
        first_prompt = app.turn.prompt_tokens
        await send(pilot, "And of Germany?")
        await wait_for(pilot, lambda: not app.generating, what="second answer")
        assert len(app.query(AssistantMessage)) == 2 and len(app.session.history) == 4
        assert app.turn.cache_hit_tokens >= first_prompt - engine(app).llm.engine.cache.page_size
        assert app.turn.cache_hit_tokens > 0
        assert re.search(rf"cache hit\s+{app.turn.cache_hit_tokens} tokens", panel_text(app, "turn"))

    run_app(smollm, scenario, temperature=0.0, max_tokens=48)
    # The first answer arrived in pieces, not as one block at the end.
    prefixes = ["".join(appended[: i + 1]) for i in range(len(appended))]
    parts_until_paris = next(i for i, text in enumerate(prefixes) if "Paris" in text) + 1
    assert parts_until_paris >= 3, appended


def test_metrics_panel_updates_during_generation(tiny, monkeypatch):
    # The tiny model's 1,500 tokens can come faster than the app renders them: on a loaded machine (CI at 6b0e512) the
    # engine had finished, its pages no longer in use, while the app still streamed the answer, and no metrics read
    # saw pages in use. Past its first 60 steps the engine takes 20 ms a step, so the answer lasts ~30 s, in which the
    # app catches up and reads (metrics are served between steps; esc ends the answer at the next one). The engine's
    # step, not the LLM's: the chat's engine loop steps llm.engine (the LLM's step, patched here until the fifty-seventh
    # session, was never called, and the flake stayed).
    step, steps = tiny.engine.step, itertools.count()
    monkeypatch.setattr(tiny.engine, "step", lambda: (time.sleep(0.02 if next(steps) > 60 else 0), step())[1])

    async def scenario(app: ChatApp, pilot) -> None:
        await wait_for(pilot, lambda: app.last_metrics is not None, what="first metrics read")
        assert load(app).kv_pages_in_use == 0 and re.search(r"running\s+0", panel_text(app, "sched"))
        await send(pilot, "hello there")
        await wait_for(
            pilot, lambda: known(load(app).kv_pages_in_use) > 0 and app.turn.output_tokens > 40, what="pages in use"
        )
        assert app.generating and load(app).running == 1
        kv = panel_text(app, "kv")
        assert re.search(rf"█ in use\s+{load(app).kv_pages_in_use}\b", kv), kv
        usage = known(load(app).kv_usage) * 100
        shown = re.search(r"(\d+\.\d+)% in use", kv)
        assert shown and float(shown.group(1)) == pytest.approx(usage, abs=0.01) and usage > 0
        assert re.search(r"running\s+1", panel_text(app, "sched"))
        turn = app.turn
        assert known(turn.ttft) > 0 and turn.decode_tps > 0 and len(turn.itls) == turn.output_tokens - 1
        assert re.search(r"TTFT\s+\d+\.\d ms", panel_text(app, "turn"))
        assert re.search(r"decode\s+\d+\.\d tok/s", panel_text(app, "turn"))
        assert re.search(r"p50 / p90\s+\d+\.\d / \d+\.\d ms", panel_text(app, "tbt"))
        panel = app.query_one(MetricsPanel)
        assert len(panel.tbt_ms) == min(MetricsPanel.WINDOW, len(turn.itls))
        assert app.query_one("#tbt-spark", Sparkline).data == list(panel.tbt_ms)

        await pilot.press("escape")
        # Once idle the pages the answer used are cached (evictable), none in use.
        await wait_for(
            pilot,
            lambda: (
                not app.generating
                and load(app).running == 0
                and load(app).kv_pages_in_use == 0
                and known(load(app).kv_pages_cached) > 0
            ),
            what="idle metrics",
        )
        assert re.search(r"in use\s+0\b", panel_text(app, "kv")) and re.search(r"running\s+0", panel_text(app, "sched"))

    run_app(tiny, scenario, max_tokens=1500)
    assert next(steps) > 60  # the slowed step is the one the loop ran


def test_second_turn_reports_cache_hits(tiny):
    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "first question")
        await wait_for(pilot, lambda: not app.generating, what="first answer")
        assert app.turn.cache_hit_tokens == 0
        await send(pilot, "second question")
        await wait_for(pilot, lambda: not app.generating, what="second answer")
        # The byte-level template repeats "system: ...\nuser: first question\nassistant:" (> 2 pages).
        assert app.turn.cache_hit_tokens >= 32
        assert re.search(rf"cache hit\s+{app.turn.cache_hit_tokens} tokens", panel_text(app, "turn"))

    run_app(tiny, scenario, system="You are terse.", max_tokens=8)


def test_stop_aborts_and_frees_pages(tiny):
    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "tell me a long story")
        await wait_for(pilot, lambda: app.turn.output_tokens >= 5, what="first tokens")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.generating, what="abort")
        assert app.turn.finish_reason == "abort" and app.turn.output_tokens < 2000
        assert app.query_one(AssistantMessage).has_class("-stopped")
        assert len(app.session.history) == 2  # the partial answer stays in the conversation
        await wait_for(pilot, lambda: load(app).running == 0 and load(app).kv_pages_in_use == 0, what="pages back")
        m = engine(app).call(lambda llm: checked(llm).metrics())
        assert m.kv_pages_in_use == 0 and m.kv_pages_free + m.kv_pages_cached == m.kv_pages_total

    run_app(tiny, scenario, max_tokens=2000)


def test_reset_and_new_conversation_clear_history(tiny):
    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "   ")  # blanks alone: nothing is sent, and the box is emptied (they stayed in it)
        await pilot.pause()
        assert app.query_one(PromptBox).value == "" and app.session.history == []
        await send(pilot, "hi")
        await wait_for(pilot, lambda: not app.generating, what="answer")
        assert len(app.session.history) == 2 and app.query(UserMessage)
        await send(pilot, "/reset")
        await pilot.pause()
        assert app.session.history == [] and not app.query(UserMessage) and not app.query(AssistantMessage)

        # Ctrl+N mid-answer: the request is aborted and its partial answer does not leak into the new history.
        await send(pilot, "/max-tokens 1500")
        await send(pilot, "hi again")
        await wait_for(pilot, lambda: app.turn.output_tokens >= 2, what="tokens")
        await pilot.press(*"next")  # a question drafted for the new chat: ctrl+n emptied the box
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert not app.generating and app.session.history == [] and not app.query(AssistantMessage)
        assert app.query_one(PromptBox).value == "next"
        panel = app.query_one(MetricsPanel)  # the old chat's last turn and TBTs are not shown for the new one
        assert app.turn.output_tokens == 0 and panel.turn.output_tokens == 0 and not panel.tbt_ms
        await wait_for(pilot, lambda: load(app).running == 0 and load(app).kv_pages_in_use == 0, what="pages back")
        await send(pilot, "/max-tokens 4")
        await send(pilot, "fresh start")
        await wait_for(pilot, lambda: not app.generating, what="answer")
        assert [m.content for m in app.session.history if m.role == "user"] == ["fresh start"]
        # ctrl+n during an edit (ctrl+g): the message under edit is the old chat's, so it does not stay as the draft
        await pilot.press("ctrl+g")
        await pilot.pause()
        assert app.query_one(PromptBox).value == "fresh start" and app.editing is not None
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.query_one(PromptBox).value == "" and app.editing is None and app.session.history == []

    run_app(tiny, scenario, max_tokens=4)


def test_turn_ends_when_its_whole_answer_was_queued_with_empty_deltas(tiny):
    """A fast engine can queue a whole answer before the turn's worker first runs. If every delta is also empty
    (the tiny model's bytes 128-255 are held back as incomplete UTF-8) the worker never yields to the event loop,
    so its Markdown stream's render task is cancelled before it ever ran. Such a turn once never ended (the reset
    test above timed out waiting for a 4-token answer, ~1 in 8 suite runs)."""

    async def scenario(app: ChatApp, pilot) -> None:
        params = app.session.params()
        assert isinstance(app.backend, LocalBackend)
        remote = app.backend.remote
        outs = [out async for out in remote.submit("hi", params, "real")]  # a real answer
        assert outs[-1].finished and len(outs[-1].token_ids) == 4
        stream = RequestStream("held-back", outs[0].prompt_token_ids, asyncio.get_running_loop())
        for out in outs:  # the same outputs, all queued already, with their text still held back
            stream.put(dataclasses.replace(out, delta_text=""))
        stream.put(_END)
        app.session.add(ChatMessage("user", "hi"))
        reply = AssistantMessage(1)
        await app.query_one("#conversation").mount(reply)
        app.answer = LocalAnswer(remote, stream)
        app.generate(app.answer, reply)
        await wait_for(pilot, lambda: not app.generating, timeout=10, what="the turn to end")
        await pilot.pause()
        assert [m.role for m in app.session.history] == ["user", "assistant"]
        assert any("cut at 4 tokens" in n for n in notices(app))  # it ran to its end

    run_app(tiny, scenario, max_tokens=4)


def test_slash_commands_and_bad_values(tiny):
    async def scenario(app: ChatApp, pilot) -> None:
        bad = {
            "/temp abc": "not a number",
            "/temp 5": "temperature must be",
            "/temp": "needs a value",
            "/max-tokens 0": "max_tokens must be >= 1",
            "/max-tokens 2.5": "not an integer",
            "/max-tokens 4096": "context of 2048",
            "/nope": "/help lists",
            "/temp [/]": "'[/]' is not",
        }
        for line, why in bad.items():
            await send(pilot, line)
            await pilot.pause()
            assert errors(app) and why in errors(app)[-1], (line, errors(app))
        assert app.session.temperature == 0.7 and app.session.max_tokens == 16 and app.is_running

        await send(pilot, "/temp 0")
        await send(pilot, "/max-tokens 6")
        await send(pilot, "/system [b]x[/")
        assert app.session.system == "[b]x[/"
        await send(pilot, "/system answer in French")
        await pilot.pause()
        assert (app.session.temperature, app.session.max_tokens, app.session.system) == (0, 6, "answer in French")
        infos = [m for m, severity in notified(app) if severity == "information"]
        assert infos[-4:] == [
            "temperature = 0",
            "max tokens = 6",
            "system prompt set: [b]x[/",
            "system prompt set: answer in French",
        ]

        await send(pilot, "/help")
        await send(pilot, "/stats")
        await pilot.pause()
        help_note, stats_note = [rendered(n.content) for n in app.query(NoteMessage)[-2:]]
        assert "/max-tokens" in help_note and "answer the last message again" in help_note and "esc" in help_note
        assert "/copy [code [n]]" in help_note and "/export md|json [path]" in help_note  # brackets, not markup
        m = load(app)
        assert f"KV pages  0 in use, {m.kv_pages_cached} cached, {m.kv_pages_free} free of 512" in stats_note
        assert re.search(r"TTFT\s+-", stats_note), stats_note
        # the settings the next turn goes with (typing /system to see the prompt cleared it)
        assert re.search(r"system prompt\s+answer in French", stats_note), stats_note
        assert re.search(r"temperature\s+0\b", stats_note) and re.search(r"max tokens\s+6\b", stats_note)

        # A prompt that cannot fit the context is refused with a notification; the app keeps going.
        await send(pilot, "/max-tokens 2040")
        await send(pilot, "x" * 40)
        await pilot.pause()
        assert not app.generating and "context" in errors(app)[-1]
        await send(pilot, "/max-tokens 6")
        await send(pilot, "ok")
        await wait_for(pilot, lambda: not app.generating and app.turn.output_tokens == 6, what="answer")
        assert app.session.history[0].content == "ok"

    run_app(tiny, scenario, max_tokens=16)


def test_a_conversation_that_outgrows_the_context_says_what_to_do():
    # A context of 128 tokens: the first turn fits, the second no longer does (the tiny model's random answer
    # re-encodes to more tokens than it made). The refusal says why and what to do, nothing is sent (no page held),
    # and /max-tokens or /reset gets the chat going again. It said only "(try /reset or a smaller /max-tokens)",
    # suggesting /max-tokens where no answer length could fit, and the plain mode and --url said nothing at all.
    llm = make_llm("dummy:tiny-llama", num_pages=64, max_model_len=128)

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "hello")
        await idle(app, pilot)
        await send(pilot, "x " * 30)
        await pilot.pause()
        why = errors(app)[-1]
        assert re.match(r"conversation too long: prompt \(\d+ tokens\) \+ max_tokens \(40\) = \d+ exceeds", why), why
        assert why.endswith("/reset starts a new chat (unless this message alone is too long)"), why
        assert not app.generating and [m.role for m in app.session.history] == ["user", "assistant"]
        assert app.query_one(PromptBox).value == "x " * 30  # the message stays in the box
        m = engine(app).call(lambda llm: checked(llm).metrics())
        assert m.kv_pages_in_use == 0 and m.running == 0
        assert int(re.search(r"prompt \((\d+) tokens", why).group(1)) >= 128  # type: ignore[union-attr]
        assert "/max-tokens" not in why  # no answer length can fit: it said "try ... a smaller /max-tokens"
        await send(pilot, "/reset")
        await send(pilot, "/max-tokens 127")
        await send(pilot, "again")
        await pilot.pause()
        why = errors(app)[-1]
        prompt = int(re.search(r"prompt \((\d+) tokens", why).group(1))  # type: ignore[union-attr]
        assert why.startswith("message too long: ") and f"/max-tokens {128 - prompt} or less leaves room" in why, why
        await send(pilot, f"/max-tokens {128 - prompt}")
        await send(pilot, "again")
        await idle(app, pilot)
        assert [m.content for m in app.session.history if m.role == "user"] == ["again"]
        assert app.turn.output_tokens == 128 - prompt

    run_app(llm, scenario, max_tokens=40)


def test_input_history_recall(tiny):
    async def scenario(app: ChatApp, pilot) -> None:
        box = app.query_one(PromptBox)
        for line in ("/temp 0.5", "/temp 0.25"):
            await send(pilot, line)
        await pilot.press("u", "p")
        await pilot.press("up")
        assert box.value == "/temp 0.25"
        await pilot.press("up", "up")
        assert box.value == "/temp 0.5"
        await pilot.press("down", "down")
        assert box.value == "up"  # back to the draft
        await pilot.press("up", "enter")
        await pilot.pause()
        assert app.session.temperature == 0.25

    run_app(tiny, scenario)


def test_multiline_input(tiny):
    async def scenario(app: ChatApp, pilot) -> None:
        box = app.query_one(PromptBox)
        await pilot.click("#prompt")
        await pilot.press(*"line one", "ctrl+j", *"line two", "enter")  # one burst, as a paste or tmux sends it
        await wait_for(pilot, lambda: not app.generating and len(app.session.history) == 2, what="answer")
        assert app.session.history[0].content == "line one\nline two" and box.value == ""
        assert "line one\nline two" in rendered(app.query_one(UserMessage).content)

        await pilot.press("f2")  # multi-line mode: enter adds lines, ctrl+s sends
        assert box.multiline and box.has_class("-multiline")
        await pilot.press(*"a", "enter", *"b", "enter", *"c")
        assert box.value == "a\nb\nc" and len(app.session.history) == 2
        await pilot.press("up")  # inside the text, up moves the cursor, not through the history
        assert box.value == "a\nb\nc"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not app.generating and len(app.session.history) == 4, what="second answer")
        assert app.session.history[2].content == "a\nb\nc"
        await pilot.press("f2", "up")
        assert not box.multiline and box.value == "a\nb\nc"  # the history holds whole messages

    run_app(tiny, scenario, max_tokens=3)


def test_ctrl_c_shows_textuals_quit_hint_rendered(tiny):
    """Our notices are plain text; Textual's own (ctrl+c's hint) keep their markup."""

    async def scenario(app: ChatApp, pilot) -> None:
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: len(app._notifications) > 0, what="the hint")
        toast = Toast(list(app._notifications)[-1])  # the pilot shows no toasts: mount one as Textual would
        await app.screen.mount(toast)
        shown = toast.render()
        assert isinstance(shown, Content)
        assert "Press ctrl+q to quit the app" in shown.plain and "[b]" not in shown.plain

    run_app(tiny, scenario)


def test_tbt_percentiles_are_the_benchmarks(tiny):
    """The chat's TBT p50/p90 (the panel, /stats, the saved numbers) interpolate as the benchmarks' reports do; they
    once took the nearest rank, so the same gaps gave other numbers (here p90 10.0 ms against 7.9 ms)."""
    gaps = [0.001, 0.002, 0.003, 0.010]
    expected = latency_stats(gaps)
    turn = TurnStats(itls=gaps)
    assert (turn.tbt_p50 * 1e3, turn.tbt_p90 * 1e3) == pytest.approx((expected["p50"], expected["p90"]))
    assert TurnStats().tbt_p50 == 0.0

    async def scenario(app: ChatApp, pilot) -> None:
        panel = app.query_one(MetricsPanel)
        panel.show_turn(TurnStats(itls=gaps))
        assert re.search(r"p50 / p90\s+2\.5 / 7\.9 ms", panel_text(app, "tbt")), panel_text(app, "tbt")

    run_app(tiny, scenario)


def test_single_newlines_in_an_answer_are_line_breaks():
    """A poem keeps its lines, streamed and reopened (Markdown alone made a single newline a space)."""
    tokens = ["Roses are red,", "\n", "violets", " are blue.", "\n\n", "Second", " verse\nends."]

    class Poem(ScriptedBackend):
        def start(self, messages, params, thinking):
            return ScriptedAnswer(tokens, 0.001, None)

    def paragraphs(app: ChatApp) -> list[str]:
        return [p._content.plain for p in app.query_one(AssistantMessage).answer.query(MarkdownParagraph)]

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "a poem, please")
        await idle(app, pilot)
        await pilot.pause()
        assert paragraphs(app) == ["Roses are red,\nviolets are blue.", "Second verse\nends."]
        await app.query_one("#conversation").remove_children()
        await app.show_history()  # as a resumed or opened chat shows it
        await pilot.pause()
        assert paragraphs(app) == ["Roses are red,\nviolets are blue.", "Second verse\nends."]

    run_pilot(ChatApp(Poem(thinking_switch=None), ChatSession(max_tokens=64, max_tokens_limit=4096)), scenario)


def test_text_that_looks_like_html_is_shown_as_written():
    """A model's `std::vector<int>`, `<<Title>>` or `<div>` is text: markdown-it's html option made them HTML tokens,
    which Textual drops (the screen showed `std::vector v;` and `<>`)."""
    tokens = ["In C++: std::vector<int> v;", " <<The History>>", "\n\n", '<div class="x">hello</div> and <b>bold</b>.']

    class Html(ScriptedBackend):
        def start(self, messages, params, thinking):
            return ScriptedAnswer(tokens, 0.001, None)

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "some code, please")
        await idle(app, pilot)
        await pilot.pause()
        shown = [p._content.plain for p in app.query_one(AssistantMessage).answer.query(MarkdownParagraph)]
        assert shown == ["In C++: std::vector<int> v; <<The History>>", '<div class="x">hello</div> and <b>bold</b>.']

    run_pilot(ChatApp(Html(thinking_switch=None), ChatSession(max_tokens=64, max_tokens_limit=4096)), scenario)


def test_lines_typed_in_one_burst_are_each_their_own():
    """Enter submits what the box holds at that moment; keys after it belong to the next line. The box was emptied
    only when the app handled the message, after the burst's later keys were in it: `/temp 0.3` then `/temp 0.4`
    became "'0.3/temp 0.4' is not a number", and a line typed right after a refused one was lost."""

    class Slow(ScriptedBackend):
        def start(self, messages, params, thinking):
            return ScriptedAnswer(["word "] * 40, 0.05, None)

    async def burst(app: ChatApp, pilot, *keys: str) -> None:
        """Keys as a terminal delivers a burst: all queued before any is handled (the pilot's press waits for
        each key's handling, messages included, so it cannot show this)."""
        for key in keys:
            char = {"enter": "\r", "space": " "}.get(key, key)
            app.post_message(events.Key(key, char))
        await pilot.pause()
        await pilot.pause()

    async def scenario(app: ChatApp, pilot) -> None:
        await pilot.click("#prompt")
        await burst(app, pilot, *"/temp", "space", *"0.3", "enter", *"/temp", "space", *"0.4", "enter")
        assert app.session.temperature == 0.4 and not errors(app), errors(app)
        await send(pilot, "a long one")
        await wait_for(pilot, lambda: app.generating, what="the answer")
        await burst(app, pilot, *"too", "space", *"early", "enter", "space", *"and", "space", *"more")
        assert app.generating and "still answering" in notices(app)[-1]
        assert app.query_one(PromptBox).value == "too early and more"
        await wait_for(pilot, lambda: not app.generating, what="the answer's end")

    run_pilot(ChatApp(Slow(thinking_switch=None), ChatSession(max_tokens=64, max_tokens_limit=4096)), scenario)


def test_esc_says_stopping_while_the_engine_ends_its_step():
    """A stop takes effect between engine steps, after a long prefill tens of seconds on a CPU: the app once showed
    nothing meanwhile. An answer still running a second after esc is said to be stopping."""

    class Slow(ScriptedBackend):
        def start(self, messages, params, thinking):  # its stop() does nothing: the answer runs on for ~2 s
            return ScriptedAnswer(["word "] * 40, 0.05, None)

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "a long one")
        await wait_for(pilot, lambda: app.generating, what="the answer")
        await pilot.press("escape")
        await wait_for(pilot, lambda: any(n.startswith("stopping:") for n in notices(app)), what="the notice")
        assert app.generating
        await wait_for(pilot, lambda: not app.generating, what="the answer's end")

    run_pilot(ChatApp(Slow(thinking_switch=None), ChatSession(max_tokens=64, max_tokens_limit=4096)), scenario)


def test_an_empty_answer_is_said_so():
    """An answer of EOS alone (a long prompt can end so) left an empty bubble and no word."""

    class Mute(ScriptedBackend):
        def start(self, messages, params, thinking):
            return ScriptedAnswer([""], 0.001, None)

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "anything?")
        await idle(app, pilot)
        await pilot.pause()
        assert "the model ended its answer without a word" in notices(app)[-1]

    run_pilot(ChatApp(Mute(thinking_switch=None), ChatSession(max_tokens=64, max_tokens_limit=4096)), scenario)


def test_a_long_step_keeps_the_last_load_shown(tiny, monkeypatch):
    """A metrics read that times out (the engine in a step longer than METRICS_TIMEOUT, e.g. a long prompt's prefill
    on a CPU) keeps the last figures shown, marked stale; the sections once went away as if the engine were gone."""

    async def scenario(app: ChatApp, pilot) -> None:
        await wait_for(pilot, lambda: app.last_metrics is not None, what="first metrics read")

        async def timed_out(self, timeout: float = 10.0) -> None:
            return None  # what RemoteLLM.metrics gives when the engine does not answer in time

        monkeypatch.setattr(RemoteLLM, "metrics", timed_out)
        await wait_for(pilot, lambda: load(app).stale, what="a read that timed out")
        assert app.query_one("#kv").display and app.query_one("#sched").display
        assert "as of the last step" in panel_text(app, "kv") and re.search(r"running\s+0", panel_text(app, "sched"))

    run_app(tiny, scenario)


def test_the_metrics_panel_gives_way_on_a_narrow_terminal():
    """Below 90 columns the panel is hidden, and a notice says where it went (it vanished without a word in an 80-column
    terminal), once each time the terminal turns narrow."""

    async def scenario(app: ChatApp, pilot) -> None:
        def said() -> int:
            return sum("the live metrics panel shows from 90 columns" in n for n in notices(app))

        panel, conversation = app.query_one(MetricsPanel), app.query_one("#conversation")
        assert panel.display and panel.region.width == 40
        await pilot.pause(0.5)
        assert said() == 0
        await pilot.resize_terminal(60, 15)
        await pilot.pause()
        assert not panel.display and conversation.region.width == 60
        await wait_for(pilot, lambda: said() == 1, what="the narrow notice")
        assert "(this terminal: 60): widen it, or /stats" in notices(app)[-1]
        await pilot.pause(0.5)
        assert said() == 1  # once, not at every poll
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert panel.display and panel.region.width == 40
        await pilot.pause(0.5)
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: said() == 2, what="the notice again")

    run_pilot(ChatApp(ScriptedBackend(thinking_switch=None), ChatSession(max_tokens_limit=4096)), scenario)


def test_ttft_counts_from_before_the_request_is_submitted(tiny, monkeypatch):
    """The engine may stamp the first token before submit() returns (its thread, or process, runs meanwhile): TTFT
    counts from before the submit. Counted from after it, the pilot and plain-mode tests saw TTFT -0.1 ms."""
    submit = RemoteLLM.submit

    def slow_return(self, *args, **kwargs):
        stream = submit(self, *args, **kwargs)
        time.sleep(0.3)  # the engine answers meanwhile
        return stream

    monkeypatch.setattr(RemoteLLM, "submit", slow_return)
    eng = LocalEngine(tiny)

    async def turn() -> TurnStats:
        backend = eng.backend()
        await backend.ready()
        answer = backend.start([{"role": "user", "content": "hi"}], ChatSession(max_tokens=2).params(), None)
        reader = TurnReader(answer.started)
        async for piece in answer:
            reader.add(piece)
        await backend.aclose()
        return reader.stats

    try:
        stats = asyncio.run(turn())
    finally:
        eng.shutdown()
    assert stats.output_tokens == 2 and known(stats.ttft) > 0


@pytest.mark.parametrize("end", ["shut down", "crash"])
def test_an_engine_shut_down_mid_answer_stops_it_and_a_crash_fails_it(end):
    """A closing terminal's SIGHUP reaches both processes: when the engine's loop ended first, its last word failed
    the answer ("error", saved as failed) where the chat's own exit saves it as stopped. A shutdown now stops the
    answer; a crash still fails it, naming why."""
    # an engine of its own, not the module's `tiny`: the crash leaves its step replaced, and either end leaves the
    # answer's request in the engine, for the tests after this one to run into
    eng = LocalEngine(make_llm("dummy:tiny-llama", num_pages=512))

    def boom() -> None:
        raise RuntimeError("the step broke")

    async def turn() -> list:
        backend = eng.backend()
        await backend.ready()
        params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
        answer = backend.start([{"role": "user", "content": "hi"}], params, None)
        pieces = []
        async for piece in answer:
            pieces.append(piece)
            if len(pieces) == 2:
                if end == "crash":
                    eng.call(lambda llm: setattr(llm.engine, "step", boom))
                else:
                    eng.loop.stop()
        await backend.aclose()
        return pieces

    try:
        pieces = asyncio.run(turn())
    finally:
        eng.shutdown()
    last = pieces[-1]
    assert last.finished and sum(len(p.token_times) for p in pieces) < 400
    if end == "crash":
        assert last.finish_reason == "error" and "the step broke" in last.error
    else:
        assert last.finish_reason == "abort" and last.error == "engine shut down"


def test_a_multi_line_system_prompt_is_a_command():
    """`/system` with ctrl+j (or f2, or a paste) for a prompt of several lines was sent to the model as a user message,
    the system prompt unchanged, without a word; a multi-line text that starts with another "/" (a pasted path) is
    still a message."""
    backend = ScriptedBackend(thinking_switch=None)

    async def scenario(app: ChatApp, pilot) -> None:
        await pilot.click("#prompt")
        await pilot.press(*"/system You are terse.", "ctrl+j", *"Never use more than five words.", "enter")
        await pilot.pause()
        assert app.session.system == "You are terse.\nNever use more than five words."
        assert not app.session.history and not backend.sent and not app.query(UserMessage)
        await pilot.press(*"/system", "ctrl+j", *"Only this line.", "enter")
        await pilot.pause()
        assert app.session.system == "Only this line."
        await pilot.press(*"/usr/bin/python crashes", "ctrl+j", *"why?", "enter")
        await idle(app, pilot)
        assert backend.sent[-1][0] == [
            {"role": "system", "content": "Only this line."},
            {"role": "user", "content": "/usr/bin/python crashes\nwhy?"},
        ]

    run_pilot(ChatApp(backend, ChatSession(max_tokens=64, max_tokens_limit=4096)), scenario)


def test_an_answer_nested_too_deep_for_markdown_is_shown():
    """SmolLM2 looping "1. 1. 2. 3. ..." (a real 400-token answer, each `N. ` a list inside the last) showed an
    empty answer: markdown-it drops whatever is nested past 20 levels. The text is shown as it is, streamed and
    reopened, and ordinary nested lists stay lists."""
    looped = "1. " + " ".join(f"{i}." for i in range(1, 120))
    tokens = [looped[i : i + 4] for i in range(0, len(looped), 4)] + ["\n\n", "The end."]

    class Looping(ScriptedBackend):
        def start(self, messages, params, thinking):
            return ScriptedAnswer(tokens, 0.001, None)

    def shown(app: ChatApp) -> str:
        return " ".join(p._content.plain for p in app.query_one(AssistantMessage).answer.query(MarkdownParagraph))

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "a guide to baking bread, step by step")
        await idle(app, pilot)
        await pilot.pause()
        assert "118. 119." in shown(app) and "The end." in shown(app), shown(app)
        await app.query_one("#conversation").remove_children()
        await app.show_history()  # as a resumed or opened chat shows it
        await pilot.pause()
        assert "118. 119." in shown(app) and "The end." in shown(app), shown(app)
        await app.query_one(AssistantMessage).answer.update("1. one\n   - two\n     - three")
        assert shown(app) == "one two three"  # three paragraphs, in three nested lists

    run_pilot(ChatApp(Looping(thinking_switch=None), ChatSession(max_tokens=512, max_tokens_limit=4096)), scenario)


def test_typing_after_a_click_on_a_message_goes_to_the_input():
    """A click on a message copies it and gives the conversation the focus (so does tab, to scroll with the keys):
    the next question typed was lost, key by key, with nothing on the screen."""

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "hi")
        await idle(app, pilot)
        await pilot.click(AssistantMessage)
        await pilot.pause()
        assert app.clipboard and app.focused is app.query_one("#conversation")
        await pilot.press(*"next one")
        box = app.query_one(PromptBox)
        assert box.value == "next one" and app.focused is box
        await pilot.press("tab", "pageup", "home", "?")  # the conversation's own keys still scroll it
        assert box.value == "next one?" and app.focused is box
        await pilot.press("enter")
        await idle(app, pilot)
        assert [m.content for m in app.session.history if m.role == "user"] == ["hi", "next one?"]

    run_pilot(
        ChatApp(ScriptedBackend(thinking_switch=None), ChatSession(max_tokens=64, max_tokens_limit=4096)), scenario
    )


async def answered_then_conversation_focused(app: ChatApp, pilot) -> None:
    """One turn ("hi"), then a click on its answer: the conversation, not the input box, has the focus."""
    await send(pilot, "hi")
    await idle(app, pilot)
    await pilot.click(AssistantMessage)
    await pilot.pause()
    assert app.focused is app.query_one("#conversation")


def test_a_paste_while_the_conversation_has_the_focus_goes_to_the_input():
    """A terminal's bracketed paste comes as one Paste event, not keys: with the conversation focused (after a click
    on a message, or tab) it went there and was lost. It goes into the input box now, its newlines lines of the
    message as when pasted there (nothing sent)."""

    async def scenario(app: ChatApp, pilot) -> None:
        box = app.query_one(PromptBox)
        await answered_then_conversation_focused(app, pilot)
        app.post_message(events.Paste("pasted\nlines\n"))  # as the terminal's driver posts it
        await pilot.pause()
        assert box.value == "pasted\nlines\n" and app.focused is box and len(app.session.history) == 2
        app.post_message(events.Paste(" and more"))  # in the box now: pasted once, by the box itself
        await pilot.pause()
        assert box.value == "pasted\nlines\n and more"

    run_pilot(
        ChatApp(ScriptedBackend(thinking_switch=None), ChatSession(max_tokens=64, max_tokens_limit=4096)), scenario
    )


def test_enter_in_the_same_burst_as_the_text_typed_into_the_conversation_goes_to_the_input():
    """Keys typed while the conversation has the focus go to the input box, which takes the focus back; in a burst (a
    paste ending in a newline, a fast typist) the Enter came before the focus had moved, reached the conversation and
    was lost: the text waited in the box, unsent. It now does what it does in the box: sends (f2 mode: a new line)."""

    async def scenario(app: ChatApp, pilot) -> None:
        box = app.query_one(PromptBox)
        await answered_then_conversation_focused(app, pilot)
        await burst(pilot, *"next one", "enter")
        await wait_for(pilot, lambda: len(app.session.history) == 4, what="the burst's message answered")
        assert [m.content for m in app.session.history if m.role == "user"] == ["hi", "next one"]
        assert box.value == "" and app.focused is box
        await pilot.press("f2")  # multi-line mode: enter adds a line there
        await pilot.click(AssistantMessage)
        await pilot.pause()
        assert app.focused is app.query_one("#conversation")
        await burst(pilot, "a", "enter", "b", "ctrl+j", "c")
        assert box.value == "a\nb\nc" and app.focused is box and len(app.session.history) == 4

    run_pilot(
        ChatApp(ScriptedBackend(thinking_switch=None), ChatSession(max_tokens=64, max_tokens_limit=4096)), scenario
    )


def test_the_usual_editing_keys_work_in_the_input_box(tmp_path):
    """Readline's and editors' keys edit the message: ctrl+delete deleted the open chat instead (its first press
    asked, the second deleted it: two ctrl+deletes to delete two words lost the chat), and alt+d, alt+b and alt+f,
    which a terminal sends with their letter (ESC d: alt+d, "d"), typed the letter. Deleting the chat is
    ctrl+shift+delete now."""
    store = ChatStore(tmp_path / "chat.db")

    async def scenario(app: ChatApp, pilot) -> None:
        box = app.query_one(PromptBox)
        await send(pilot, "saved")
        await idle(app, pilot)

        async def edit(*keys: str, text: str = "one two three", at: int = 4) -> tuple[str, int]:
            box.value = text
            box.move_cursor((0, at))
            for key in keys:  # as a terminal hands them over: alt+d (ESC d) with its letter as the character
                app.post_message(events.Key(key, key[-1] if key.startswith("alt+") and len(key) == 5 else None))
                await pilot.pause()
            return box.text, box.cursor_location[1]

        assert await edit("ctrl+delete") == ("one  three", 4)
        assert await edit("ctrl+delete", "ctrl+delete") == ("one ", 4)  # twice: two words, the chat kept
        assert await edit("alt+d") == ("one  three", 4)
        assert await edit("alt+delete") == ("one  three", 4)
        assert await edit("ctrl+w", at=8) == ("one three", 4)
        assert await edit("ctrl+backspace", at=8) == ("one three", 4)
        assert await edit("alt+backspace", at=8) == ("one three", 4)
        assert await edit("alt+b", at=8) == ("one two three", 4)
        assert await edit("ctrl+left", at=8) == ("one two three", 4)  # alt+b as most terminals send it (ESC b)
        assert await edit("alt+f") == ("one two three", 7)
        assert await edit("ctrl+right") == ("one two three", 7)  # alt+f (ESC f)
        assert await edit("home", at=8) == ("one two three", 0)
        assert await edit("end") == ("one two three", 13)
        assert await edit("ctrl+a", at=8) == ("one two three", 0)
        assert await edit("ctrl+e") == ("one two three", 13)
        assert await edit("ctrl+u", at=8) == ("three", 0)
        assert await edit("ctrl+k", at=8) == ("one two ", 8)
        assert [i.title for i in store.sessions()] == ["saved"] and app.session.history  # nothing deleted
        assert not [m for m in notices(app) if "delete" in m]
        await pilot.press("ctrl+shift+delete")
        assert notices(app)[-1] == "press ctrl+shift+delete again to delete 'saved'"
        asked = re.fullmatch(r"press (\S+) again to delete 'saved'", notices(app)[-1])
        assert await edit("alt+x", at=3) == ("onex two three", 4)  # other alt keys type their letter, as TextArea does
        await send(pilot, "/help")
        await pilot.pause()
        assert "delete a word left / right" in rendered(app.query(NoteMessage)[-1].content)
        # f1's list named the key as Textual's footer does, "shift+^del", where the notice says "ctrl+shift+delete"
        await pilot.press("f1")
        await pilot.pause()
        rows = [line.split("  ")[0] for line in rendered(app.query(NoteMessage)[-1].content).splitlines()]
        assert asked is not None and asked[1] in rows, rows
        assert rows.count(asked[1]) == 1 and "/delete" in rows and not [r for r in rows if "^" in r], rows
        assert {"esc", "ctrl+n", "ctrl+r", "ctrl+o", "f1", "ctrl+q"} <= set(rows), rows  # as the welcome names them

    run_pilot(
        ChatApp(ScriptedBackend(thinking_switch=None), ChatSession(max_tokens=8, max_tokens_limit=4096), store),
        scenario,
    )


def test_an_answers_last_text_for_a_message_already_gone_is_dropped_not_raised():
    """ctrl+q mid-answer: the app removed the message while its Markdown stream still held text, and the stream's last
    flush, run by stop_markdown as the cancelled turn ended, mounted it into the detached widget: Textual's MountError
    replaced the turn's cancellation, and the worker failed instead of ending (seen once in CI's pilot test of a cut
    answer). The text is dropped (the answer itself is kept from the engine's tokens, not from the widget)."""
    from textual.app import App
    from textual.widgets import Markdown

    from minisgl_cli.tui.app import stop_markdown

    async def scenario() -> None:
        async with App().run_test():
            detached = Markdown()  # as the message's Markdown once the quitting app has taken its screen down
            stream = Markdown.get_stream(detached)
            await stream.write("the tokens before ")  # taken by the stream, which starts to append them
            await stream.write("the last tokens")  # pending: the stream's last flush appends them as it stops
            await stop_markdown(stream)  # raised MountError("Can't mount widget(s) before Markdown() is mounted")

    asyncio.run(scenario())
