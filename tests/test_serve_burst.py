"""Clients that go away: a disconnect aborts the request and returns its KV pages, under a burst of concurrent
streams too, while every other client gets its full answer."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from engine.sampling_params import SamplingParams
from engine.text import RequestOutput
from tests.conftest import make_llm
from tests.server_harness import LiveServer, live_server

N_CLIENTS, LEAVE_EVERY = 64, 4  # every 4th client hangs up mid-stream


@pytest.fixture(scope="module")
def server():
    with live_server(make_llm(max_running_requests=16, num_pages=1024)) as s:
        yield s


def _idle_and_clean(server: LiveServer) -> None:
    m = server.wait_idle()
    assert (server.client.in_flight, m.running, m.waiting, m.kv_pages_in_use) == (0, 0, 0, 0), m
    assert m.kv_pages_free + m.kv_pages_cached == m.kv_pages_total
    assert server.live_requests() == 0
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_non_streaming_disconnect_aborts(server):
    aborted = server.client.metrics.finished["abort"]
    with pytest.raises(httpx.ReadTimeout):  # the client gives up long before 2000 tokens are done
        httpx.post(f"{server.url}/v1/completions", json={"prompt": "long", "max_tokens": 2000}, timeout=0.5)
    _idle_and_clean(server)
    assert server.client.metrics.finished["abort"] == aborted + 1


def test_streaming_disconnect_aborts(server):
    aborted = server.client.metrics.finished["abort"]
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        timeout=30,
        json={"messages": [{"role": "user", "content": "go on forever"}], "max_tokens": 2000, "stream": True},
    ) as r:
        first = next(r.iter_lines())
        assert first.startswith("data: ") and '"role": "assistant"' in first
    _idle_and_clean(server)
    assert server.client.metrics.finished["abort"] == aborted + 1


async def _finisher(server: LiveServer, i: int) -> tuple[int, str | None, int, int, int]:
    """Streams a request to its end; returns (max_tokens, finish_reason, usage completion/prompt, expected prompt)."""
    client = server.async_openai()
    max_tokens = 6 + i % 19
    reason, use = None, None
    if i % 2:
        messages = [{"role": "user", "content": f"client {i} " + "ab" * (i % 7)}]
        want_prompt = len(server.llm.encode(messages))
        stream = await client.chat.completions.create(  # type: ignore[call-overload]  # plain-dict messages
            model=server.model,
            messages=messages,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    else:
        prompt = f"client {i} " + "xy" * (i % 5)
        want_prompt = len(prompt.encode())
        stream = await client.completions.create(
            model=server.model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0.7,
            seed=i,
            stream=True,
            stream_options={"include_usage": True},
        )
    async for chunk in stream:
        for c in chunk.choices:
            reason = c.finish_reason or reason
        use = chunk.usage or use
    await client.close()
    assert use is not None
    return max_tokens, reason, use.completion_tokens, use.prompt_tokens, want_prompt


async def _leaver(raw: httpx.AsyncClient, i: int) -> None:
    """Opens a stream that could run for 1000 tokens and hangs up: some while queued, most mid-generation."""
    path = "/v1/chat/completions" if i % 8 == 3 else "/v1/completions"
    body = {"messages": [{"role": "user", "content": f"leaver {i}"}]} if "chat" in path else {"prompt": f"leaver {i}"}
    async with raw.stream("POST", path, json={**body, "max_tokens": 1000, "stream": True}) as r:
        assert r.status_code == 200
        await asyncio.sleep(0.1 * (i % 8))


async def _burst(server: LiveServer) -> list:
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as raw:
        return await asyncio.gather(
            *(_leaver(raw, i) if i % LEAVE_EVERY == LEAVE_EVERY - 1 else _finisher(server, i) for i in range(N_CLIENTS))
        )


def test_burst_with_early_disconnects(server):
    finished_before = dict(server.client.metrics.finished)
    results = [r for r in asyncio.run(_burst(server)) if r is not None]
    n_leavers = N_CLIENTS // LEAVE_EVERY
    assert len(results) == N_CLIENTS - n_leavers
    for max_tokens, reason, completion, prompt, want_prompt in results:
        assert (reason, completion, prompt) == ("length", max_tokens, want_prompt)
    _idle_and_clean(server)
    grew = {k: v - finished_before.get(k, 0) for k, v in server.client.metrics.finished.items()}
    assert grew.get("abort", 0) == n_leavers and grew.get("length", 0) == len(results), grew
    m = server.engine_metrics()
    assert m.finished_requests >= N_CLIENTS


@pytest.mark.parametrize("how", ["break", "raise", "cancel"])
def test_a_remote_stream_left_early_aborts_its_request(server, how):
    """RemoteLLM, serve's handle on the engine process, left a request running to max_tokens, holding its KV pages,
    when the consumer of its stream stopped early (break, an exception, its task cancelled); AsyncLLM's streams
    abort it, and now RemoteLLM's do the same. A consumer that leaves on the finished output, before the stream's
    end, aborts a request that has already ended: harmless, as is aborting it again."""
    remote = server.remote
    long = SamplingParams(max_tokens=2000, ignore_eos=True)

    async def leave(rid: str) -> list[RequestOutput]:
        """Leave the stream of a long request `how`; then what the stream got after that, up to its end."""
        stream = remote.submit([5, 6, 7], long, rid)
        if how == "break":
            async for _ in stream:
                break
        elif how == "raise":
            with contextlib.suppress(RuntimeError):
                async for _ in stream:
                    raise RuntimeError("the consumer failed")
        else:

            async def consume() -> None:
                async for _ in stream:
                    pass

            task = asyncio.create_task(consume())
            while not remote.pending[rid].token_ids:  # it is running
                await asyncio.sleep(0.01)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return [out async for out in stream]  # the rest, up to the engine's last word for it

    async def leave_on_the_finished_output(rid: str) -> RequestOutput:
        async for out in remote.submit([5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True), rid):
            if out.finished:
                break  # before END: the stream aborts a request that has ended
        remote.abort(rid)
        return out

    before = server.engine_metrics()
    rest = asyncio.run_coroutine_threadsafe(leave(f"leave-{how}"), server.event_loop).result(60)
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    assert len(rest[-1].token_ids) < 1000
    _idle_and_clean(server)
    rid = f"finished-{how}"
    out = asyncio.run_coroutine_threadsafe(leave_on_the_finished_output(rid), server.event_loop).result(60)
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    _idle_and_clean(server)
    after = server.engine_metrics()
    assert after.finished_requests == before.finished_requests + 2
    assert after.generation_tokens - before.generation_tokens < 1003
    assert remote.pending == {}
