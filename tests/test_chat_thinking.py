"""Reasoning models' <think>...</think>: the splitter at every chunk boundary, and the TUI (pilot) over a backend
whose stream emits think tags the way Qwen3 does, one token per piece."""

from __future__ import annotations

import asyncio
import time

import pytest

from minisgl_cli.tui.app import ChatApp
from minisgl_cli.tui.session import ChatSession
from minisgl_cli.tui.store import ChatStore
from minisgl_cli.tui.thinking import ThinkSplitter
from minisgl_cli.tui.turn import Piece
from minisgl_cli.tui.widgets import AssistantMessage, ThinkingBlock
from tests.chat_pilot import errors, idle, notices, panel_text, run_app, run_pilot, send, wait_for
from tests.conftest import make_llm

TOKENS = ["<think>", "\n", "The user", " asks", " 6*7", ".", "</think>", "\n\n", "It is", " **42**", "."]
THINKING, ANSWER = "The user asks 6*7.", "It is **42**."


def split_all(chunks: list[str], opened: bool = False) -> tuple[str, str]:
    s = ThinkSplitter(opened)
    parts = [s.feed(c) for c in chunks] + [s.flush()]
    return "".join(t for t, _ in parts), "".join(a for _, a in parts)


def test_splitter_at_every_boundary():
    text = "".join(TOKENS)
    for size in range(1, len(text) + 1):  # the same text cut into chunks of every size
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        thinking, answer = split_all(chunks)
        assert (thinking.strip(), answer) == (THINKING, ANSWER), size
    assert split_all(["Plain answer, no <think> here"]) == ("", "Plain answer, no <think> here")
    assert split_all(["  <thin", "king is not a tag"]) == ("", "  <thinking is not a tag")
    # Leading newlines of an answer are dropped as it streams, so what is shown is what the session keeps (a sampled
    # "\n" first token once made the TUI's answer and the saved message differ).
    assert split_all(["\n", "\nHi\n", "there"]) == ("", "Hi\nthere")
    assert split_all(["reasoning", "</think>answer"], opened=True) == ("reasoning", "answer")
    assert split_all(["<think>cut off mid-thought</th"]) == ("cut off mid-thought</th", "")


class ScriptedAnswer:
    def __init__(self, tokens: list[str], gap: float, hold: asyncio.Event | None) -> None:
        self.started = time.perf_counter()
        self.opens_in_thinking = False
        self.tokens, self.gap, self.hold = tokens, gap, hold

    async def __aiter__(self):
        for i, tok in enumerate(self.tokens):
            if tok == "</think>" and self.hold is not None:
                await self.hold.wait()  # the test looks at the screen mid-thought
            await asyncio.sleep(self.gap)
            last = i == len(self.tokens) - 1
            yield Piece(
                tok,
                token_times=[time.perf_counter()],
                finished=last,
                finish_reason="stop" if last else None,
                prompt_tokens=12,
                cache_hit_tokens=0,
            )

    def stop(self) -> None:
        pass


class ScriptedBackend:
    """Streams a fixed reasoning answer; records what each turn was sent with."""

    title, model, context_limit = "scripted reasoning model", "scripted-qwen3", 4096
    switches_models = False

    def __init__(self, thinking_switch: bool | None, gap: float = 0.01) -> None:
        self.thinking_switch, self.gap = thinking_switch, gap
        self.sent: list[tuple[list[dict[str, str]], bool | None]] = []
        self.hold: asyncio.Event | None = None  # set: the first answer waits for it before closing its thinking

    async def ready(self) -> None:
        pass

    def start(self, messages, params, thinking):
        self.sent.append((messages, thinking))
        hold = self.hold if len(self.sent) == 1 else None
        return ScriptedAnswer(TOKENS, self.gap, hold)

    async def load(self):
        return None

    async def models(self) -> list[str]:
        return [self.model]

    def use_model(self, model: str) -> None:
        raise ValueError("a scripted backend has one model")

    async def aclose(self) -> None:
        pass


def test_thinking_streams_apart_and_is_counted(tmp_path):
    backend = ScriptedBackend(thinking_switch=True)
    store = ChatStore(tmp_path / "chat.db")

    async def scenario(app: ChatApp, pilot) -> None:
        backend.hold = asyncio.Event()
        await send(pilot, "/think off")
        await send(pilot, "/think on")
        await send(pilot, "what is 6*7?")
        reply = app.query_one(AssistantMessage)
        await wait_for(pilot, lambda: reply.thinking is not None, what="the thinking block")
        block = reply.thinking
        assert block is not None
        await wait_for(pilot, lambda: "6*7." in block.body.source, what="thinking")
        assert not block.collapsed and reply.answer.source == ""  # open while it thinks, no answer yet
        await wait_for(pilot, lambda: block.title == "Thinking… 6 tokens", what="thinking tokens counted")
        assert app.generating
        backend.hold.set()
        await idle(app, pilot)
        await pilot.pause()
        assert block.body.source.strip() == THINKING and reply.answer.source == ANSWER
        assert block.collapsed and block.title == "Thought · 7 tokens"
        message = app.session.history[-1]
        assert (message.content, message.reasoning) == (ANSWER, THINKING)
        assert app.turn.output_tokens == len(TOKENS) and app.turn.reasoning_tokens == 7
        assert "thinking   7 tokens" in panel_text(app, "turn")
        assert not app.query_one("#kv").display  # no load numbers from this backend: the section is hidden
        await send(pilot, "and 6*8?")
        await idle(app, pilot)
        # The thinking is never sent back: only the answer is the assistant's message.
        assert backend.sent[-1][0][1] == {"role": "assistant", "content": ANSWER}
        assert [t for _, t in backend.sent] == [True, True]

    app = ChatApp(backend, ChatSession(max_tokens=64, max_tokens_limit=4096), store)
    run_pilot(app, scenario)
    assert "thinking off" in notices(app) and "thinking on" in notices(app)

    session, _ = store.load(app.session.id)
    assert session.thinking is True and session.history[1].reasoning == THINKING
    assert session.history[1].stats.reasoning_tokens == 7

    async def resumed(app: ChatApp, pilot) -> None:
        await pilot.pause()
        blocks = list(app.query(ThinkingBlock))
        assert len(blocks) == 2 and all(b.collapsed and b.title == "Thought · 7 tokens" for b in blocks)
        assert blocks[0].body.source == THINKING

    run_pilot(ChatApp(ScriptedBackend(True), session, store), resumed)


def test_think_switch_refused_without_enable_thinking():
    llm = make_llm("dummy:tiny-llama", num_pages=64)
    assert llm.tokenizer.thinking_switch is False

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "/think on")
        await send(pilot, "/think maybe")
        await pilot.pause()
        assert "no enable_thinking switch" in errors(app)[-2] and "on or off" in errors(app)[-1]
        assert app.session.thinking is None

    run_app(llm, scenario)


@pytest.mark.parametrize("flag", [True, False])
def test_enable_thinking_reaches_the_chat_template(flag):
    """The in-process backend passes /think to templates that read enable_thinking (here one written like Qwen3's)."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models
    from transformers import PreTrainedTokenizerFast

    from engine.tokenizer import Tokenizer

    raw = RawTokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]")
    hf.chat_template = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"
        "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    )
    tok = Tokenizer(hf)
    assert tok.thinking_switch
    prompt = tok.chat_prompt([{"role": "user", "content": "hi"}], enable_thinking=flag)
    assert prompt.endswith("</think>\n\n") is (not flag)
