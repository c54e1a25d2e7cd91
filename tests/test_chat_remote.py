"""`minisgl chat --url`: the TUI (pilot) and the plain mode against a real `minisgl serve` on loopback: streamed
answers with client-side TTFT/TBT, the KV panel from the server's /metrics, stop, a 4xx, and a server killed
mid-answer; against the mock server (minisgl_cli/mock_server.py), TBT stamped as chunks arrive however busy the UI
loop is. Also the /metrics parser on vLLM's and SGLang's names."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from minisgl_cli.mock_server import MockConfig, mock_server_process
from minisgl_cli.tui.app import ChatApp
from minisgl_cli.tui.prom import load_from_metrics
from minisgl_cli.tui.remote import RemoteError
from minisgl_cli.tui.server_backend import ServerBackend
from minisgl_cli.tui.session import ChatSession
from minisgl_cli.tui.store import ChatStore
from minisgl_cli.tui.widgets import AssistantMessage, NoteMessage
from tests.chat_pilot import errors, idle, known, load, notices, panel_text, rendered, run_pilot, send, wait_for
from tests.conftest import free_port, serve_subprocess
from tests.test_chat_plain import MINISGL, TINY


@contextlib.contextmanager
def serve(tmp_path: Path, num_pages: int = 256) -> Iterator[tuple[str, subprocess.Popen]]:
    with serve_subprocess(tmp_path, "--num-pages", str(num_pages)) as running:
        yield running


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    with serve(tmp_path_factory.mktemp("serve")) as (url, _):
        yield url


def remote_app(url: str, store: ChatStore | None = None, **settings) -> ChatApp:
    backend = ServerBackend.connect(url, None, None)
    return ChatApp(backend, ChatSession(max_tokens_limit=backend.context_limit, **settings), store)


def test_url_streams_an_answer_and_fills_the_panel(tmp_path):
    # Its own server of a larger model: the tiny one streams 1,500 tokens in ~1.5 s, and the UI loop, busy drawing
    # them, could miss the whole answer in the server's /metrics (a flaky failure in CI).
    model = "dummy:SmolLM2-135M"

    async def scenario(app: ChatApp, pilot) -> None:
        assert app.sub_title == f"{model} · {server}/v1"
        await wait_for(pilot, lambda: app.last_metrics is not None, what="the server's /metrics")
        assert load(app).source == "minisgl" and app.query_one("#kv").display
        await send(pilot, "hello over http")
        await wait_for(pilot, lambda: app.turn.output_tokens >= 20, what="tokens streaming in")
        assert app.generating and known(app.turn.ttft) > 0
        assert re.search(r"TTFT\s+\d+\.\d ms", panel_text(app, "turn"))
        await wait_for(pilot, lambda: load(app).running == 1 and known(load(app).kv_pages_in_use) > 0, what="KV in use")
        assert re.search(r"running\s+1", panel_text(app, "sched"))
        assert re.search(r"█ in use\s+[1-9]", panel_text(app, "kv")) and "from minisgl /metrics" in panel_text(
            app, "kv"
        )
        await pilot.press("escape")  # closes the stream: the server aborts the request
        await idle(app, pilot)
        assert app.turn.finish_reason == "abort" and app.query_one(AssistantMessage).has_class("-stopped")
        # a stopped stream brings no usage: its prompt size is not known (it read "0 prompt", "0 / 0")
        assert re.search(r"tokens\s+- in / \d+ out", panel_text(app, "turn")), panel_text(app, "turn")
        assert re.search(r"cache hit\s+-", panel_text(app, "turn")), panel_text(app, "turn")
        await wait_for(
            pilot,
            lambda: load(app).running == 0 and load(app).kv_pages_in_use == 0,
            what="pages back on the server",
        )
        await pilot.press("ctrl+n")  # the stopped answer's byte tokens could leave the next prompt no room
        await send(pilot, "/max-tokens 12")
        await send(pilot, "and again")
        await idle(app, pilot)
        turn = app.turn
        assert turn.finish_reason == "length" and turn.output_tokens == 12  # the server's usage count
        assert turn.prompt_tokens > 0 and known(turn.ttft) > 0 and turn.decode_tps > 0 and turn.itls
        assert app.query(AssistantMessage).last().answer.source == app.session.history[-1].content != ""
        assert re.search(r"cached\s+[1-9]", panel_text(app, "kv"))

    with serve_subprocess(tmp_path, "--num-pages", "256", model=model) as (server, _):
        run_pilot(remote_app(server, max_tokens=1500), scenario)


def test_url_4xx_is_a_notice_and_keeps_the_conversation(server, tmp_path):
    store = ChatStore(tmp_path / "chat.db")

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "/max-tokens 2040")  # below the context, but not with the prompt on top
        await send(pilot, "a prompt that is too long for the room left")
        await wait_for(pilot, lambda: errors(app), what="the refusal")
        await pilot.pause()
        assert "server answered 400" in errors(app)[-1] and "your message is kept" in errors(app)[-1]
        # the server's context_length_exceeded says what to do, as the local engine's refusal does
        assert "message too long: server answered 400" in errors(app)[-1]
        # the server's message names the prompt's tokens and the limit: the hint says how short an answer fits
        assert re.search(r"/max-tokens \d+ or less leaves room for a shorter answer", errors(app)[-1]), errors(app)
        assert [m.role for m in app.session.history] == ["user"]
        await send(pilot, "/max-tokens 5")
        await pilot.press("ctrl+r")  # answers the kept message
        await idle(app, pilot)
        assert [m.role for m in app.session.history] == ["user", "assistant"]

    app = run_pilot(remote_app(server, store), scenario)
    saved, _ = ChatStore(tmp_path / "chat.db").load(app.session.id)
    assert [(m.role, m.content) for m in saved.history][0] == ("user", "a prompt that is too long for the room left")
    assert len(saved.history) == 2 and saved.model == "dummy:tiny-llama"


def test_server_killed_mid_answer(tmp_path):
    # A server of the larger dummy model, as in the streaming-panel test: the tiny one can stream all 1,500 tokens
    # before a UI loop on a loaded CI machine sees the tenth and kills it (a flaky failure in CI).
    store = ChatStore(tmp_path / "chat.db")
    with serve_subprocess(tmp_path, "--num-pages", "256", model="dummy:SmolLM2-135M") as (url, proc):

        async def scenario(app: ChatApp, pilot) -> None:
            await send(pilot, "first")
            await idle(app, pilot)
            await send(pilot, "/max-tokens 1500")
            await send(pilot, "a long answer please")
            await wait_for(pilot, lambda: app.turn.output_tokens >= 10, what="tokens streaming in")
            os.killpg(proc.pid, signal.SIGKILL)
            await idle(app, pilot, "the failed answer")
            await pilot.pause()
            assert any("generation failed" in e and "partial answer kept" in e for e in errors(app)), notices(app)
            assert app.query(AssistantMessage).last().has_class("-error") and app.turn.finish_reason == "error"
            await wait_for(pilot, lambda: not app.query_one("#kv").display, what="the panel's load section hidden")
            await send(pilot, "anyone there?")  # the server is gone: a notice, and the message is kept
            await wait_for(pilot, lambda: len(errors(app)) >= 2, what="the second failure")
            assert "generation failed" in errors(app)[-1] and app.is_running

        app = run_pilot(remote_app(url, store, max_tokens=4), scenario)
    saved, _ = ChatStore(tmp_path / "chat.db").load(app.session.id)
    assert [m.role for m in saved.history] == ["user", "assistant", "user", "assistant", "user"]
    partial = saved.history[3]
    assert partial.stats.finish_reason == "error" and partial.stats.output_tokens >= 10 and partial.content


def test_url_tbt_is_stamped_on_arrival_however_busy_the_ui():
    """TBT is the gap between chunks as they reach the client, not as the UI loop gets round to them: a server
    sending a token every 20 ms to a chat whose UI loop is held 100 ms at a time. Read on the UI's loop, the chunks
    that waited through a hold were stamped together (TBT p50 / p90 0.0 / 110 ms); now 20 / 21-27 ms. Esc still ends
    the answer at once, and no thread is left behind."""
    gap = 0.02

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "/max-tokens 1000")
        await send(pilot, "go on")
        await wait_for(pilot, lambda: app.turn.output_tokens >= 5, what="tokens streaming in")
        pressed = time.perf_counter()
        await pilot.press("escape")  # read off the UI loop, the stream is still stopped at once
        await idle(app, pilot, "the stopped answer")
        assert app.turn.finish_reason == "abort" and time.perf_counter() - pressed < 1.0
        await send(pilot, "/max-tokens 40")
        loop, holding = asyncio.get_running_loop(), True

        def hold() -> None:  # the UI loop busy in Python 100 ms at a time, as a long Markdown redraw holds it
            end = time.perf_counter() + 0.1
            while time.perf_counter() < end:
                pass
            if holding:
                loop.call_later(0.005, hold)

        hold()
        await send(pilot, "count slowly")
        await idle(app, pilot)
        holding = False
        t = app.turn
        assert t.finish_reason == "length" and t.output_tokens == 40 and len(t.itls) == 39
        assert 0.5 * gap < t.tbt_p50 < 1.5 * gap and t.tbt_p90 < 3 * gap, t.itls  # margin for a busy machine

    with mock_server_process(MockConfig(tpot=gap), free_port()) as url:
        run_pilot(remote_app(url), scenario)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("minisgl-chat")]  # the reading thread too


def test_plain_mode_over_url(server):
    p = subprocess.run(
        [MINISGL, "chat", "--no-tui", "--url", server + "/v1", "--max-tokens", "7", "--no-save"],
        # /think sends chat_template_kwargs, which minisgl serve refused (a 400); /model lists serve's one model
        input="/think off\nhi\n/stats\n/model\n/model dummy:tiny-llama\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert f"dummy:tiny-llama · {server}/v1" in p.stderr
    assert re.search(r"\[length · TTFT \d+\.\d ms · \d+\.\d tok/s · 7 tokens · cache hit 0/\d+ · KV 0 in use", p.stderr)
    assert re.search(r"source\s+minisgl", p.stderr) and p.stdout.strip()
    assert re.search(r"1  dummy:tiny-llama \(answering\)\n\s*the only model the server serves\n", p.stderr)
    assert "dummy:tiny-llama answers already" in p.stderr


def test_stop_strings_reach_the_server_as_openais_stop_list(server, tmp_path):
    """`--stop` and `/set stop` go to the server as the request's `stop` list, and the server's answer ends before
    the earliest of them (finish reason stop), as the whole greedy answer shows; the saved chats keep them."""
    db = tmp_path / "chat.db"
    p = subprocess.run(
        [MINISGL, "chat", "--no-tui", "--url", server, "--temperature", "0", "--max-tokens", "32", "--db", str(db)],
        input="/set stop off\nhi\n/reset\n/set stop <372> 'x;'\nhi\n/reset\n/set stop off\nhi\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert re.findall(r"\[(\w+) · TTFT", p.stderr) == ["length", "stop", "length"], p.stderr
    store = ChatStore(db)
    whole_chat, cut_chat, again = (store.load(c.id)[0] for c in reversed(store.sessions()))
    whole = whole_chat.history[1].content
    assert again.history[1].content == whole and "<372>" in whole and "x;" in whole, whole
    assert cut_chat.history[1].content == whole[: min(whole.index("<372>"), whole.index("x;"))]
    assert cut_chat.sampling == {"stop": ["<372>", "x;"]}
    p = subprocess.run(
        [MINISGL, "chat", "--no-tui", "--url", server, "-t", "0", "--max-tokens", "32", "--no-save", "--stop", "<372>"],
        input="hi\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and "[stop · TTFT" in p.stderr and "<372>" not in p.stdout, p.stderr


def test_url_errors_are_clear():
    port = free_port()  # nothing listens there
    p = subprocess.run(
        [MINISGL, "chat", "--url", f"http://127.0.0.1:{port}"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 2 and "cannot reach" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([MINISGL, "chat", "--url", "localhost:8000"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "must start with http://" in p.stderr
    with pytest.raises(RemoteError, match="cannot reach"):
        ServerBackend.connect(f"http://127.0.0.1:{port}", None, None)
    # flags that only a local engine would use, and a served model without a server, are refused, not ignored
    url = ["--url", f"http://127.0.0.1:{port}"]
    for args, says in (
        ([*url, "--model", "dummy:tiny-llama", "--tp", "4"], "--model, --tp: set the local engine"),
        ([*url, "--seed", "3"], "--seed: set the local engine"),
        (["--served-model", "m", "--no-tui"], "names a model at --url, and there is no --url"),
    ):
        env = dict(os.environ, COLUMNS="300")  # the error box on one line
        p = subprocess.run([MINISGL, "chat", *args], capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode == 2 and says in p.stderr and "cannot reach" not in p.stderr, p.stderr


def test_served_model_must_exist(server):
    with pytest.raises(RemoteError, match=r"does not serve 'nope' \(it serves: dummy:tiny-llama\)"):
        ServerBackend.connect(server, None, "nope")
    assert ServerBackend.connect(server, "key", "dummy:tiny-llama").model == "dummy:tiny-llama"


def test_model_lists_a_servers_models_and_switches(tmp_path):
    """--url to a server of several models (vLLM, ollama, LM Studio) took the first, and only --served-model at start
    chose another: /model lists them and switches (by name or number); the chat is then saved under the model
    answering. The plain mode does the same."""
    store = ChatStore(tmp_path / "chat.db")
    sent: list[str] = []  # the model each request asked for

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, "/max-tokens 3")
        await send(pilot, "hi")
        await idle(app, pilot)
        await send(pilot, "/model")
        await wait_for(pilot, lambda: bool(app.query(NoteMessage)), what="the list")
        listed = rendered(app.query(NoteMessage)[-1].content)
        served = r"1\s+alpha \(answering\)\s+2\s+beta\s+3\s+gamma/large\s+/model <name or number> switches"
        assert re.search(served, listed), listed
        await send(pilot, "/model beta")
        assert notices(app)[-1] == "model: beta answers from here on" and app.sub_title.startswith("beta · ")
        await send(pilot, "again")
        await idle(app, pilot)
        await send(pilot, "/model 3")
        assert app.session.model == "gamma/large"
        await send(pilot, "/model nope")
        assert re.search(r"does not serve 'nope' \(it serves: alpha, beta, gamma/large\)", errors(app)[-1])
        assert app.backend.model == "gamma/large"

    with mock_server_process(MockConfig(model="alpha", more_models="beta,gamma/large"), free_port()) as url:
        backend = ServerBackend.connect(url, None, None)
        stream = backend.client.stream

        def recorded(body):
            sent.append(body["model"])
            return stream(body)

        setattr(backend.client, "stream", recorded)  # noqa: B010 (mypy refuses assigning to a method)
        run_pilot(ChatApp(backend, ChatSession(max_tokens_limit=backend.context_limit), store), scenario)
        p = subprocess.run(
            [MINISGL, "chat", "--no-tui", "--url", url, "--db", str(tmp_path / "chat.db"), "--resume"],
            input="/model\n/model 2\nhi\n",
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert sent == ["alpha", "beta"]
    # --resume goes on with the model the chat was saved with, which the server still serves (it took the first)
    assert p.returncode == 0, p.stderr
    assert "3  gamma/large (answering)" in p.stderr and "model: beta answers" in p.stderr, p.stderr
    assert store.load(known(store.last_id()))[0].model == "beta"


def test_model_with_the_local_engine_says_a_restart_switches():
    """The in-process engine runs the model it loaded: /model names it, and asking for another says how."""
    p = subprocess.run(
        [MINISGL, "chat", *TINY, "--no-save"],
        input="/model\n/model other\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 1, p.stderr  # a refused command, from a pipe
    assert re.search(r"1\s+tiny-llama \(answering\)", p.stderr), p.stderr
    assert "another one needs a restart" in p.stderr
    assert "error: this chat's engine runs tiny-llama: another model needs a restart" in p.stderr


VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 2.0
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.25
vllm:num_preemptions_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 3.0
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 400.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="Qwen/Qwen3-0.6B"} 5.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="Qwen/Qwen3-0.6B"} 2.0
"""
SGLANG = """sglang:num_running_reqs{model_name="m"} 4.0
sglang:num_queue_reqs{model_name="m"} 0.0
sglang:token_usage{model_name="m"} 0.5
sglang:num_used_tokens{model_name="m"} 5000.0
sglang:max_total_num_tokens{model_name="m"} 10000.0
sglang:cache_hit_rate{model_name="m"} 0.75
"""


def test_metrics_of_vllm_and_sglang():
    v = load_from_metrics(VLLM)
    assert (v.source, v.running, v.waiting, v.kv_usage, v.preemptions, v.finished_requests) == (
        "vllm",
        2,
        1,
        0.25,
        3,
        7,
    )
    assert v.cache_hit_rate == 0.4 and v.kv_pages_total is None
    s = load_from_metrics(SGLANG)
    assert (s.source, s.running, s.kv_usage, s.kv_pages_in_use, s.kv_pages_free, s.cache_hit_rate) == (
        "sglang",
        4,
        0.5,
        5000,
        5000,
        0.75,
    )
    assert load_from_metrics("# nothing known\nprocess_cpu_seconds_total 1.5\n") is None


def test_one_prometheus_reader_for_the_panel_and_the_replay():
    """minisgl_cli/prometheus.py serves the chat's panel and bench-trace's cache-hit figure: counters with or without
    the `_total` suffix (some exporters drop it), summed over labels, values that are not finite skipped."""
    from minisgl_cli.prometheus import cache_counters, parse_prometheus
    from minisgl_cli.replay import cache_hit_rate

    bare = VLLM.replace("_total{", "{") + 'vllm:e2e_request_latency_seconds_sum{model_name="m"} NaN\n'
    m = parse_prometheus(bare)
    assert "vllm:e2e_request_latency_seconds_sum" not in m and m["vllm:request_success"] == 7.0
    assert cache_counters(m) == cache_counters(parse_prometheus(VLLM)) == (400.0, 1000.0)
    v = load_from_metrics(bare)
    assert (v.preemptions, v.finished_requests, v.cache_hit_rate) == (3, 7, 0.4)
    later = parse_prometheus(VLLM.replace("} 400.0", "} 700.0").replace("} 1000.0", "} 1500.0"))
    assert cache_hit_rate(parse_prometheus(VLLM), later) == 0.6
    assert cache_hit_rate({"up": 1.0}, later) == 700 / 1500  # no counters scraped before: from zero


def test_a_servers_context_refusal_gives_the_hint_its_numbers_allow():
    """A --url refusal for length always suggested "a smaller /max-tokens may leave room", also when the prompt
    alone was over the limit (no answer fits then). The counts come from the refusal's text: the engine's own
    wording (RequestLimits, as minisgl serve sends it) and vLLM's two."""
    from engine.limits import ContextOverflow, RequestLimits
    from engine.sampling_params import SamplingParams
    from minisgl_cli.tui.backend import too_long
    from minisgl_cli.tui.server_backend import overflow_counts

    def refusal(prompt: int, max_tokens: int, kv: int = 10_000) -> str:
        with pytest.raises(ContextOverflow) as e:
            RequestLimits(512, 2048, kv).check([1] * prompt, SamplingParams(max_tokens=max_tokens))
        return str(e.value)

    assert overflow_counts(refusal(2000, 100)) == (2000, 2048)
    assert overflow_counts(refusal(3000, 20)) == (3000, 2048)
    assert overflow_counts(refusal(1500, 600, kv=1800)) == (1500, 1800)  # the KV cache binds
    assert overflow_counts(refusal(900, 1000, kv=1800)) == (900, 1800)
    vllm_old = "This model's maximum context length is 2048 tokens. However, you requested 3527 tokens (3507 in the messages, 20 in the completion). Please reduce the length of the messages or completion."  # noqa: E501
    vllm_new = "'max_tokens' or 'max_completion_tokens' is too large: 20. This model's maximum context length is 2048 tokens and your request has 3507 input tokens (20 > 2048 - 3507)."  # noqa: E501
    assert overflow_counts(vllm_old) == overflow_counts(vllm_new) == (3507, 2048)
    assert overflow_counts("server answered 400: too long") == (None, None)
    user = [{"role": "user", "content": "x"}]
    assert "/max-tokens 48 or less leaves room" in too_long("r", user, *overflow_counts(refusal(2000, 100)))
    alone = too_long("r", user, *overflow_counts(refusal(3000, 20)))
    assert "/max-tokens" not in alone and "a shorter message" in alone


def test_decode_rate_counts_tokens_not_chunks():
    """A server's chunk may carry several tokens (an emoji is 3 of SmolLM2's: `minisgl serve` held them back until the
    character was whole and sent 60 tokens in 20 chunks); the decode rate is the usage's tokens over the decode time,
    not the chunks (which showed 42.9 tok/s for 300 tokens streamed at ~130 tok/s)."""
    from minisgl_cli.tui.turn import Piece, TurnReader

    reader = TurnReader(started=0.0)
    for i in range(20):  # 20 chunks of 3 tokens each, 30 ms apart: 60 tokens, 100 tok/s
        reader.add(Piece("🌙", token_times=[0.1 + 0.03 * i]))
    reader.add(Piece(finished=True, finish_reason="length", prompt_tokens=56, output_tokens=60))
    t = reader.stats
    assert t.output_tokens == 60 and len(t.itls) == 19
    assert t.decode_tps == pytest.approx(59 / 0.57)  # was 19 / 0.57 = 33.3 tok/s


def test_url_tbt_is_per_token_when_a_chunk_carries_several(server):
    """`minisgl serve` holds a token back until its UTF-8 character is whole, so a chunk may carry several tokens
    (the tiny model's greedy answer to this prompt has chunks of 2 and 4). TBT is per token, as SGLang's bench_serving
    counts it: a chunk of n tokens is n intervals of its gap / n, the tokens counted from the stream's continuous
    usage; the chat showed one gap per chunk (fewer intervals than tokens, each as long as a character took). The
    chunk sizes are read with the official openai client on the same request."""
    import openai

    from minisgl_cli.tui.turn import tbt_percentile

    prompt, max_tokens = "hello over http", 60
    ref = openai.OpenAI(base_url=server + "/v1", api_key="none")

    def chunks() -> tuple[str, list[int]]:
        """The answer and the tokens of each of its chunks."""
        sizes, counted, text = [], 0, ""
        for chunk in ref.chat.completions.create(
            model="dummy:tiny-llama",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                assert chunk.usage is not None
                sizes.append(chunk.usage.completion_tokens - counted)
                counted, text = chunk.usage.completion_tokens, text + chunk.choices[0].delta.content
        assert counted == max_tokens
        return text, sizes

    # asked twice, so that the chat's request finds the prompt cached as the second did (a random model's near-tied
    # logits may pick another token after a prefill of other length)
    chunks()
    text, sizes = chunks()
    assert max(sizes) >= 2, sizes  # the answer has chunks of several tokens

    async def scenario(app: ChatApp, pilot) -> None:
        await send(pilot, prompt)
        await idle(app, pilot)
        t = app.turn
        assert app.session.history[-1].content == text
        assert t.output_tokens == max_tokens and len(t.itls) == sum(sizes[1:]), (sizes, t.itls)
        at = 0
        for n in sizes[1:]:  # each chunk's gap spread evenly over its tokens
            assert t.itls[at : at + n] == pytest.approx([t.itls[at]] * n), (n, t.itls[at : at + n])
            at += n
        assert sum(t.itls) == pytest.approx(t.decode_seconds)
        # a loaded machine may read the whole answer in one burst (every gap 0, no decode time): the chat's rate is 0
        assert t.decode_tps == pytest.approx((max_tokens - 1) / t.decode_seconds if t.decode_seconds > 0 else 0.0)
        window = [g * 1e3 for g in t.itls]  # the panel's: these 59 gaps, in ms
        shown = f"{tbt_percentile(window, 50):.1f} / {tbt_percentile(window, 90):.1f} ms"
        assert shown in panel_text(app, "tbt")

    run_pilot(remote_app(server, temperature=0.0, max_tokens=max_tokens), scenario)


def test_url_to_a_server_refusing_continuous_usage_asks_without_it():
    """A server that checks stream_options strictly refuses vLLM's continuous_usage_stats with a 400 naming it: the
    chat asks again without it (TBT then per chunk, one token each) and does not ask for it again."""

    async def scenario(app: ChatApp, pilot) -> None:
        for turn in ("one", "two"):
            await send(pilot, turn)
            await idle(app, pilot)
            assert app.turn.finish_reason == "length" and app.turn.output_tokens == 5 and len(app.turn.itls) == 4
        assert not errors(app) and app.backend.client.continuous_usage is False  # type: ignore[attr-defined]

    with mock_server_process(MockConfig(known_stream_options="include_usage"), free_port()) as url:
        run_pilot(remote_app(url, max_tokens=5), scenario)


def test_a_first_chunk_of_several_tokens_has_no_intervals():
    """The first chunk's tokens all came at TTFT, their own gaps unknown: no interval for them (as SGLang's
    bench_serving), where zeros would pull the TBT percentiles down; a later chunk's gap is spread over its tokens."""
    from minisgl_cli.tui.server_backend import token_times
    from minisgl_cli.tui.turn import Piece, TurnReader

    reader = TurnReader(started=0.0)
    reader.add(Piece("🌙", token_times=token_times(None, 0.1, 3)))
    reader.add(Piece("🌙", token_times=token_times(0.1, 0.13, 3)))
    reader.add(Piece(finished=True, finish_reason="length", output_tokens=6))
    t = reader.stats
    assert t.ttft == pytest.approx(0.1) and t.output_tokens == 6
    assert t.itls == pytest.approx([0.01] * 3) and t.decode_tps == pytest.approx(5 / 0.03)
