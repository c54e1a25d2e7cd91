"""The Python API as a user drives it (engine.llm.LLM, engine.async_llm.AsyncLLM): misuse gets a clear error, and no
request is left running or holding KV pages behind it."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.sampling_params import SamplingParams
from tests.conftest import make_llm

# The step-failure tests below on a GPU too: SmolLM2's shapes (a head_dim FlashInfer has kernels for) with dummy
# weights in bf16, with the CUDA graphs and FlashInfer (with overlap, the next step is launched before the last one's
# outputs are processed).
ON_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def llm_on(device: str, **kw):
    if device == "cuda":
        return make_llm("dummy:SmolLM2-135M", device="cuda", dtype="bfloat16", **kw)
    return make_llm(**kw)


def waits_for_a_caller(engine, mine: set[str], started: threading.Event):
    """An on_step for a thread's generate() that, after its first step, records its requests in `mine`, sets
    `started`, and holds until another caller has added a request: the engine then steps for both (on a GPU the
    thread's 200 tokens were otherwise done before the other call came in). It watches the engine's request counter,
    not its requests: the other caller's may already be gone again (its step failed, it withdrew it)."""

    def on_step(outs) -> None:
        if started.is_set():
            return
        mine.update(engine.reqs)
        added = engine._counter
        started.set()
        deadline = time.monotonic() + 30
        while engine._counter == added and time.monotonic() < deadline:
            time.sleep(0.001)

    return on_step


def assert_idle(llm, pages: int) -> None:
    assert not llm.has_work() and llm.engine.reqs == {} and llm._text == {}
    assert llm.metrics().kv_pages_free == pages


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", -1.0, "temperature must be >= 0"),
        ("max_tokens", 0, "max_tokens must be an integer >= 1"),
        ("top_p", 0.0, "top_p must be in (0, 1]"),
        ("stop", "x", "stop and stop_token_ids must be lists"),
        ("seed", 2**70, "seed must be a 64-bit integer"),
    ],
)
def test_a_sampling_field_assigned_after_construction_is_checked_at_submission(field, value, message):
    """SamplingParams checks its fields when built, but they can be assigned afterwards: a temperature set to -1 was
    sampled with, max_tokens set to 0 generated a token. Submission checks them again."""
    llm = make_llm(num_pages=64, radix_cache=False)
    params = SamplingParams(max_tokens=4, temperature=0)
    setattr(params, field, value)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        llm.generate([[1, 2, 3]], params)
    assert_idle(llm, 64)


@pytest.mark.parametrize("prompt", ["hello", [1, 2, 3], [{"role": "user", "content": "hi"}]])
def test_generate_takes_one_prompt_as_a_batch_of_one(smollm, prompt):
    """generate("hello") ran five one-character prompts ("h", "e", ...) and returned five outputs; [1, 2, 3] failed
    as three prompts. One prompt gives one output, the one a list of it gives."""
    params = SamplingParams(max_tokens=3, temperature=0)
    one = smollm.generate(prompt, params)
    assert len(one) == 1
    assert one[0].token_ids == smollm.generate([prompt], params)[0].token_ids
    assert one[0].prompt_token_ids == smollm.encode(prompt)


def test_vllms_prompt_dicts_are_their_prompts(smollm):
    """vLLM's TextPrompt / TokensPrompt: a dict was iterated as a list of prompts, so {"prompt": "Hi"} generated for
    the text "prompt" (and a lone chat message ran "role" and "content")."""
    params = SamplingParams(max_tokens=4, temperature=0)
    text = "The capital of France is"
    ids = smollm.encode(text)
    ref = smollm.generate(text, params)[0].token_ids
    assert smollm.generate({"prompt": text}, params)[0].token_ids == ref
    assert smollm.generate({"prompt_token_ids": ids}, params)[0].token_ids == ref
    batch = smollm.generate([{"prompt": text}, {"prompt_token_ids": ids}, text], params)
    assert [o.token_ids for o in batch] == [ref] * 3
    for bad in ({"role": "user", "content": "hi"}, {"prompt": text, "extra": 1}, {"prompt_token_ids": "1 2"}):
        with pytest.raises(ValueError, match='a prompt dict must be {"prompt": text} or {"prompt_token_ids"'):
            smollm.generate(bad, params)


def test_generation_configs_eos_ids_stop_as_in_transformers(tmp_path):
    """generation_config.json's eos_token_id (Qwen2.5/Qwen3 instruct: <|endoftext|> beside config.json's <|im_end|>)
    was never read: an emitted one ran on to max_tokens. transformers' generate() and vLLM stop there."""
    import json

    from engine.model_config import PRESETS
    from tests.hf_reference import hf_model_from_config, save_hf

    d = save_hf(hf_model_from_config(PRESETS["tiny-llama"], seed=7), tmp_path / "m")
    greedy = SamplingParams(max_tokens=12, temperature=0)
    ref = make_llm(str(d), num_pages=64).generate([[1, 2, 3]], greedy)[0]
    assert ref.finish_reason == "length"
    stop_at = ref.token_ids[4]
    first = ref.token_ids.index(stop_at)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop_at]}))
    out = make_llm(str(d), num_pages=64).generate([[1, 2, 3]], greedy)[0]
    assert (out.finish_reason, out.token_ids) == ("stop", ref.token_ids[: first + 1])
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 600}))  # vocab_size 512
    with pytest.raises(ValueError, match="eos id 600 .of generation_config.json or the tokenizer. is outside"):
        make_llm(str(d), num_pages=64)


def test_sampling_params_clone_is_a_deep_copy_as_in_vllm():
    """vLLM's SamplingParams.clone() (code that derives params per request calls it) was an AttributeError: a copy
    whose lists and logit_bias are its own, so editing it leaves the original as it was."""
    sp = SamplingParams(temperature=0.5, stop=["x"], stop_token_ids=[1], logit_bias={5: 1.0}, seed=3)
    c = sp.clone()
    assert c == sp and c is not sp
    c.stop.append("y")
    c.stop_token_ids.append(2)
    c.logit_bias[6] = 2.0
    c.temperature = 0.0
    assert sp == SamplingParams(temperature=0.5, stop=["x"], stop_token_ids=[1], logit_bias={5: 1.0}, seed=3)


def test_seed_minus_one_is_no_seed_as_in_vllm():
    """vLLM reads seed=-1 as no seed (a fresh draw each time); here it was a fixed seed, the same tokens every time."""
    assert SamplingParams(seed=-1).seed is None
    llm = make_llm(num_pages=64)
    draws = {
        tuple(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=1.0, seed=-1))[0].token_ids)
        for _ in range(3)
    }
    assert len(draws) > 1


def test_a_stream_read_the_wrong_way_is_refused_and_aborted():
    """A thread stream read with `async for` (or an asyncio one with `for`) failed an assert before the code that
    aborts an abandoned stream: the request ran on unread to max_tokens, holding its slot and pages."""
    import asyncio

    from engine.async_llm import AsyncLLM

    a = AsyncLLM(make_llm(num_pages=128))
    try:
        stream = a.submit([1, 2, 3], SamplingParams(max_tokens=1500, temperature=0, ignore_eos=True))

        async def read() -> None:
            async for _ in stream:
                pass

        with pytest.raises(TypeError, match="created for threads .submit.. without loop=.: use `for`"):
            asyncio.run(read())
        deadline = time.monotonic() + 10
        while (m := a.call(lambda llm: llm.metrics())).running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert m.running == 0 and m.generation_tokens < 1500
    finally:
        a.shutdown()


def test_a_failing_generate_withdraws_what_it_added():
    """A callback raising (or KeyboardInterrupt) in the middle of generate() left its requests running: they held
    their pages after the call and ran on, unseen, inside later calls."""
    llm = make_llm(num_pages=64, radix_cache=False)

    def boom(out):
        raise RuntimeError("callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        llm.generate([[1, 2, 3]] * 3, SamplingParams(max_tokens=50, ignore_eos=True), on_output=boom)
    assert_idle(llm, 64)
    steps = llm.engine.stats["steps"]
    out = llm.generate([[4, 5, 6]], SamplingParams(max_tokens=4, temperature=0))[0]
    assert len(out.token_ids) == 4 and llm.engine.stats["steps"] - steps <= 5  # nothing else ran in this call
    assert_idle(llm, 64)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_generate_adds_its_prompts_as_the_steps_need_them(monkeypatch, overlap: bool, n: int):
    """generate() adds token-id prompts as its steps need them, the first step's alone before it, then those two steps
    could take ahead (engine.llm.ADD_AS_NEEDED), prompts of one choice or of several: every step holds the same
    requests as with every prompt added first, so the tokens are the same; text prompts are all added first."""
    import engine.llm as llm_module

    prompts = [[(7 * i + j) % 500 + 1 for j in range(20 + i % 7)] for i in range(24)]
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, n=n)
    runs = {}
    for first in (True, False):
        monkeypatch.setattr(llm_module, "ADD_AS_NEEDED", first)
        llm = make_llm(num_pages=128, max_batch_tokens=48, overlap=overlap, radix_cache=False)
        schedule = llm.engine.scheduler.schedule
        seen: list[tuple[int, list[str] | None]] = []

        def record(schedule=schedule, seen=seen, llm=llm):
            batch = schedule()
            seen.append((len(llm.engine.reqs), None if batch is None else [r.rid for r in batch.reqs]))
            return batch

        llm.engine.scheduler.schedule = record  # type: ignore[method-assign]  # each step's requests
        outs = llm.generate(prompts, params, use_tqdm=False)
        runs[first] = ([[c.token_ids for c in o.outputs] for o in outs], [rids for _, rids in seen], seen[0][0])
        assert_idle(llm, 128)
    (tokens, steps, added), (tokens0, steps0, added0) = runs[True], runs[False]
    assert added0 == 24 * n and 0 < added < 24 * n  # requests in the engine at the first step: the first few
    assert steps == steps0 and tokens == tokens0
    assert make_llm()._prompts_for([[1, 2], "text", [3]], [None] * 3, 2) == 3  # a text prompt: all first


def test_a_bad_prompt_past_the_first_steps_fails_generate_and_withdraws_the_rest():
    """A bad token-id prompt among those generate() adds as its steps run: the ValueError names it, the requests added
    before it (steps run for them) are withdrawn, no page is held, and the next call runs only its own."""
    llm = make_llm(num_pages=128, max_batch_tokens=16, radix_cache=False)
    prompts = [[1, 2, 3, 4, 5, 6]] * 10 + [[7, 10**6]]
    assert llm._prompts_for(prompts, [None] * 11, 2) < 10
    with pytest.raises(ValueError, match="prompt token id 1000000 is outside the vocabulary"):
        llm.generate(prompts, SamplingParams(max_tokens=4), use_tqdm=False)
    assert llm.engine.stats["steps"] >= 1
    assert_idle(llm, 128)
    outs = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)
    assert len(outs) == 1 and len(outs[0].token_ids) == 4
    assert_idle(llm, 128)


@pytest.mark.parametrize("device", ON_DEVICES)
@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
@pytest.mark.parametrize("where", ["schedule", "run", "process"])
def test_a_ctrl_c_inside_a_step_leaves_other_callers_and_the_pages_intact(where, overlap, device):
    """A Ctrl-C (a real SIGINT) arriving inside a step: after scheduling, after the model ran, after the outputs were
    processed. It is raised once the step is done, the interrupted generate() withdraws its request, and another
    thread's requests in the same steps get the tokens a lone run gives (on CPU; in bf16 another batch size may
    round a near-tie the other way), with the pages adding up after every step. Raised inside the step, it left that
    step's other requests scheduled and never processed (their position advanced, no token): the other thread then
    stepped forever."""
    import signal

    llm = llm_on(device, max_running_requests=8, num_pages=256, page_size=4, overlap=overlap)
    e = llm.engine
    params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    theirs = [[3, 4, 8, 22, 19], [11, 12, 13]]
    alone = [o.token_ids for o in llm.generate(theirs, params)]
    target, name = {"schedule": (e.scheduler, "schedule"), "run": (e.runner, "run"), "process": (e, "_process")}[where]
    part = getattr(target, name)
    other_rids: set[str] = set()
    hit: list[bool] = []

    def then_ctrl_c(*args, **kwargs):
        result = part(*args, **kwargs)
        rids = e.reqs.keys()
        if threading.current_thread() is threading.main_thread() and not hit and rids - other_rids:
            assert rids & other_rids  # the other thread's requests are in this step too
            hit.append(True)
            signal.raise_signal(signal.SIGINT)
        return result

    got: list = []
    other_in = threading.Event()

    def other() -> None:
        got.extend(
            o.token_ids for o in llm.generate(theirs, params, on_step=waits_for_a_caller(e, other_rids, other_in))
        )

    setattr(target, name, then_ctrl_c)
    try:
        t = threading.Thread(target=other, daemon=True)  # stuck for good without the fix
        t.start()
        assert other_in.wait(30)
        with pytest.raises(KeyboardInterrupt):
            llm.generate([[1, 5, 9, 13, 2, 7]], SamplingParams(max_tokens=30, temperature=0))
        t.join(60)
    finally:
        setattr(target, name, part)
    assert not t.is_alive(), "the other thread's requests never finished"
    assert hit and [len(g) for g in got] == [200, 200]
    assert device == "cuda" or got == alone
    assert not llm.engine.has_work() and llm.metrics().kv_pages_in_use == 0
    e.check()


@pytest.mark.parametrize("device", ON_DEVICES)
def test_an_llm_dropped_without_shutdown_is_freed_at_once(device):
    """Dropping the last reference to an LLM that ran (no shutdown()) frees its engine, KV pool and graphs at once,
    with the cyclic collector off. On CUDA the graphs held the runner that holds them: the pool (here half the GPU)
    stayed until a collection, and a collection inside another engine's capture destroyed those graphs there."""
    import gc
    import weakref

    import torch

    cuda = device == "cuda"
    before = torch.cuda.memory_allocated() if cuda else 0
    gc.collect()
    gc.disable()
    try:
        llm = llm_on(device, memory_fraction=0.5) if cuda else llm_on(device)
        out = llm.generate([[1, 2, 3]] * 4, SamplingParams(max_tokens=8, ignore_eos=True))
        assert [len(o.token_ids) for o in out] == [8] * 4
        if cuda:
            assert llm.engine.runner.graphs is not None and llm.engine.runner.graphs.enabled
            assert torch.cuda.memory_allocated() - before > 1 << 30
        runner = weakref.ref(llm.engine.runner)
        del llm, out
        assert runner() is None
        if cuda:  # what stays is torch's, per stream: cuBLAS workspaces (96 MiB on an H200)
            assert torch.cuda.memory_allocated() - before < 256 << 20
    finally:
        gc.enable()


@pytest.mark.parametrize("device", ON_DEVICES)
def test_a_step_that_raises_stops_the_engine_for_every_caller(device):
    """A step that raises (a kernel error, out of memory) stops partway, like a cut one: the requests it scheduled
    are advanced with no token. The caller whose step it was got the error; another thread's generate() with
    requests in that step stepped forever. Now the engine refuses every later step and request, naming the first
    error: each caller gets an error, none waits."""

    llm = llm_on(device, max_running_requests=8, num_pages=256, page_size=4)
    e = llm.engine
    params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    run = e.runner.run
    raised: list[bool] = []

    def fails_once(*args, **kwargs):
        if threading.current_thread() is threading.main_thread() and not raised and len(e.reqs) > 2:
            raised.append(True)
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return run(*args, **kwargs)

    errors: list[BaseException] = []
    other_in = threading.Event()

    def other() -> None:
        try:
            llm.generate([[3, 4, 8, 22, 19], [11, 12, 13]], params, on_step=waits_for_a_caller(e, set(), other_in))
        except RuntimeError as err:
            errors.append(err)

    e.runner.run = fails_once
    t = threading.Thread(target=other, daemon=True)  # stuck for good without the fix
    t.start()
    assert other_in.wait(30)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        llm.generate([[1, 5, 9, 13, 2, 7]], SamplingParams(max_tokens=30, temperature=0))
    t.join(60)
    assert not t.is_alive(), "the other thread's requests never finished"
    why = "the engine stopped: an earlier step failed (RuntimeError: CUDA error: an illegal memory access"
    assert raised and len(errors) == 1 and why in str(errors[0])
    for call in (lambda: llm.generate([[1, 2]], params), llm.step):
        with pytest.raises(RuntimeError, match=re.escape(why)):
            call()


def test_a_failed_start_holds_no_weights_or_kv_pool_while_its_error_lives():
    """An engine start that fails after the model and the KV pool exist (here: an attention backend this device cannot
    run, found once the pool is made) kept both through the frames of its traceback for as long as the error lived: a
    REPL's last error, or this test's pytest.raises. On a GPU the pool is 85% of free memory, and the next engine
    started in the process found no room for its KV cache (test_gpu.py, H200)."""
    import gc
    import warnings

    from engine.models.llama import LlamaForCausalLM
    from kvcache.pool import KVPool

    def held() -> int:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # isinstance on every object wakes some lazy modules' warnings
            return sum(isinstance(o, (KVPool, LlamaForCausalLM)) for o in gc.get_objects())

    before = held()
    with pytest.raises(ValueError, match="the flashinfer attention backend needs a CUDA device") as failed:
        make_llm(attention_backend="flashinfer")
    assert failed.value.__traceback__ is not None and held() == before


def test_an_async_consumer_that_stops_early_aborts_its_request():
    """Leaving a stream early (break, or the consuming task cancelled) left its request running to max_tokens,
    holding its KV pages; vLLM's AsyncLLM aborts it. A thread's stream the same."""
    import asyncio

    from engine.async_llm import AsyncLLM

    llm = make_llm(num_pages=256, radix_cache=False)
    a = AsyncLLM(llm)
    params = SamplingParams(max_tokens=2000, ignore_eos=True)

    def idle() -> bool:
        return a.call(lambda llm: not llm.has_work() and llm.metrics().kv_pages_free == 256)

    async def wait_idle() -> None:
        """Idle, the abandoned request ended long before its 2,000 tokens."""
        tokens = a.call(lambda llm: llm.engine.stats["generation_tokens"])
        while not idle():
            await asyncio.sleep(0.05)
        assert a.call(lambda llm: llm.engine.stats["generation_tokens"]) - tokens < 1000

    async def main() -> list:
        loop = asyncio.get_running_loop()
        s = a.submit([1, 2, 3], params, loop=loop)
        async for out in s:
            if len(out.token_ids) >= 3:
                break
        await wait_idle()

        async def consume(s):
            async for _ in s:
                pass

        task = asyncio.create_task(consume(a.submit([4, 5, 6], params, loop=loop)))
        await asyncio.sleep(0.3)
        task.cancel()
        await wait_idle()
        # a consumer that reads to the end aborts nothing
        return [o async for o in a.submit([7, 8], SamplingParams(max_tokens=3), loop=loop)]

    try:
        outs = asyncio.run(main())
        assert outs[-1].finish_reason == "length" and len(outs[-1].token_ids) == 3
        done = threading.Event()

        def thread_consumer():
            for out in a.submit([9, 10], params):
                if out.token_ids:
                    break
            done.set()

        threading.Thread(target=thread_consumer).start()
        assert done.wait(30)
        asyncio.run(wait_idle())
        a.call(lambda llm: llm.engine.check())
        assert a.call(lambda llm: llm.metrics().finished_requests) == 4
    finally:
        a.shutdown()


def _within(seconds: float, fn) -> object:
    """fn() on a daemon thread; fails (instead of hanging the suite) if it has not returned in time."""

    box: dict[str, object] = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting after {seconds:.0f} s"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


def test_generate_from_two_threads_and_nested_in_a_stream():
    """Each generate() or stream() call used to see only the outputs of the steps it ran itself: two threads calling
    generate() at once, or a generate() inside a stream's loop, took each other's final outputs and then stepped an
    idle engine forever. Each call now gets its own requests' outputs, whoever steps; the tokens are those of a
    call alone."""

    llm = make_llm(num_pages=256, radix_cache=False)
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    prompts = {k: [[k + 1, j + 2, 3] for j in range(4)] for k in range(2)}
    alone = {k: [o.token_ids for o in llm.generate(prompts[k], params)] for k in prompts}

    got: dict[int, list] = {}

    def both() -> None:
        threads = [
            threading.Thread(target=lambda k=k: got.update({k: llm.generate(prompts[k], params)})) for k in (0, 1)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    _within(60, both)
    assert {k: [o.token_ids for o in outs] for k, outs in got.items()} == alone

    def nested() -> tuple[list, list]:
        streamed, inner = [], []
        for out in llm.stream(prompts[0][0], params):
            streamed.append(out)
            if len(streamed) == 2:
                inner = llm.generate(prompts[1], params)
        return streamed, inner

    streamed, inner = _within(60, nested)
    assert [o.token_ids for o in inner] == alone[1]
    assert streamed[-1].finished and streamed[-1].token_ids == alone[0][0]
    assert "".join(o.delta_text for o in streamed) == streamed[-1].text
    llm.engine.check()
    assert_idle(llm, 256)


def test_an_llm_shut_down_refuses_requests_and_closes_as_a_context_manager():
    """shutdown() on one device left the engine running: generate() afterwards still answered. It is refused now, by
    name; `with LLM(...) as llm:` shuts it down at the end of the block."""
    with make_llm(num_pages=64, radix_cache=False) as llm:
        out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
        assert len(out[0].token_ids) == 2
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    assert_idle(llm, 64)
    llm.shutdown()  # a second shutdown is a no-op


def test_shutdown_ends_the_requests_still_running():
    """LLM.shutdown() and AsyncLLM.shutdown() left the requests in flight in the engine, holding their pages, and
    a later step (a generate() after the AsyncLLM's shutdown) ran them on to max_tokens. They end as aborted now."""
    import asyncio

    from engine.async_llm import AsyncLLM, EngineDeadError

    params = SamplingParams(max_tokens=1000, ignore_eos=True)
    llm = make_llm(num_pages=64, radix_cache=False)
    llm.add_request([1, 2, 3], params)
    llm.step()
    assert llm.metrics().kv_pages_free < 64
    llm.shutdown()
    assert llm.engine.reqs == {} and llm.metrics().kv_pages_free == 64 and llm.step() == []

    llm = make_llm(num_pages=64, radix_cache=False)
    a = AsyncLLM(llm)

    async def main() -> None:
        stream = a.submit([1, 2, 3], params, loop=asyncio.get_running_loop())
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                await asyncio.to_thread(a.shutdown)  # from the first output on

    asyncio.run(main())
    assert_idle(llm, 64)  # the LLM goes on without the AsyncLLM's request
    out = llm.generate([[4, 5]], SamplingParams(max_tokens=2, ignore_eos=True))[0]
    assert len(out.token_ids) == 2 and llm.engine.stats["finished"] == 2
    llm.shutdown()


def test_api_slips_are_clear_errors_or_applied():
    """Keywords beside a config were dropped (num_pages=8 ran with the config's 64); a string in a list of params
    was an AttributeError; a generated request id could be one a caller had taken ('already in use')."""
    from engine.config import EngineConfig
    from engine.llm import LLM

    llm = LLM(EngineConfig(model="dummy:tiny-llama", device="cpu", num_pages=64), num_pages=8, max_model_len=100)
    try:
        assert (llm.config.num_pages, llm.engine.max_model_len, llm.metrics().kv_pages_free) == (8, 100, 8)
        with pytest.raises(ValueError, match="sampling params must be a SamplingParams .got str"):
            llm.generate([[1, 2], [3, 4]], [SamplingParams(max_tokens=1), "greedy"])
        assert_idle(llm, 8)
        taken = f"req-{llm.engine._counter + 1}"
        llm.add_request([1, 2], SamplingParams(max_tokens=2), rid=taken)
        outs = llm.generate([[3, 4]], SamplingParams(max_tokens=2))
        assert outs[0].rid != taken and len(outs[0].token_ids) == 2
    finally:
        llm.shutdown()


def test_a_callers_rid_reused_after_its_request_finished_runs_as_a_new_request():
    """abort() of a finished request is a no-op, also for a request added later under the same rid (a caller's own
    ids): the stale abort was resolved by rid when applied, so it ended the new request at once (finish "abort", no
    tokens) while a second copy of it ran on unseen, holding a slot and pages until max_tokens."""
    from engine.async_llm import AsyncLLM

    llm = make_llm(num_pages=64)
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    alone = make_llm(num_pages=64).generate([[9, 10, 11]], greedy)[0]
    try:
        llm.add_request([5, 6, 7], greedy, rid="x")
        while llm.has_work():
            llm.step()
        llm.abort("x")
        llm.add_request([9, 10, 11], greedy, rid="x")
        outs = []
        while llm.has_work():
            outs += [o for o in llm.step() if o.finished]
        assert [(o.rid, o.finish_reason, list(o.token_ids)) for o in outs] == [("x", "length", alone.token_ids)]
        assert llm.engine.stats["finished"] == 2
        assert_idle(llm, 64)
    finally:
        llm.shutdown()
    # AsyncLLM: a generated rid avoided the engine's requests, not a caller's still queued for the engine thread
    a = AsyncLLM(make_llm(num_pages=64))
    try:
        mine = a.submit([5, 6, 7, 9], greedy, rid=f"req-{a.llm.engine._counter + 1}")
        generated = a.submit([5, 6, 7, 10], greedy)
        assert generated.rid != mine.rid
        assert [list(s)[-1].finish_reason for s in (mine, generated)] == ["length", "length"]
    finally:
        a.shutdown()


def _edit_after_submission(params: SamplingParams, field: str, reference: list[int]) -> None:
    """What a caller might do to its params object while the request it submitted runs (reusing it for the next
    batch, say); none of it may reach that request."""
    if field == "max_tokens":
        params.max_tokens = 2
    elif field == "temperature":
        params.temperature = -1.0  # invalid: submission would refuse it; below 1e-5 the sampler takes it as greedy
    elif field == "stop_token_ids":
        params.stop_token_ids.append(reference[3])  # in place: a copy of the object alone would still share the list
    elif field == "logit_bias":
        params.logit_bias[next(t for t in range(512) if t not in reference)] = 100.0  # in place, as above


@pytest.mark.parametrize("front", ["add_request", "stream", "async"])
@pytest.mark.parametrize("field", ["max_tokens", "temperature", "stop_token_ids", "logit_bias"])
def test_editing_sampling_params_after_submission_changes_no_submitted_request(front, field):
    """A submitted request ran with the caller's SamplingParams object itself: edits made after submission (max_tokens
    shortened, a temperature of -1 that submission would refuse, a stop token or a logit bias added in place) reached
    the running request unchecked. Each request now runs with its own checked copy and makes the tokens it was asked
    for."""
    from engine.async_llm import AsyncLLM

    llm = make_llm(num_pages=64, radix_cache=False)

    def params() -> SamplingParams:  # sampled with a seed: its tokens do not depend on the batch or the step
        return SamplingParams(max_tokens=8, temperature=0.8, seed=7, ignore_eos=True)

    reference = llm.generate([[1, 2, 3]], params())[0].token_ids
    assert len(reference) == 8
    p = params()
    if front == "add_request":
        rid = llm.add_request([1, 2, 3], p)
        _edit_after_submission(p, field, reference)
        outs = [o for _ in range(30) if llm.has_work() for o in llm.step() if o.rid == rid]
    elif front == "stream":
        outs = []
        for out in llm.stream([1, 2, 3], p):
            if not outs:  # the request is running: its first token is out
                _edit_after_submission(p, field, reference)
            outs.append(out)
    else:
        a = AsyncLLM(llm)
        try:
            stream = a.submit([1, 2, 3], p)
            _edit_after_submission(p, field, reference)  # whether or not the engine thread has taken it yet
            outs = _within(60, lambda: list(stream))
        finally:
            a.shutdown()
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert list(outs[-1].token_ids) == reference
    assert_idle(llm, 64)


def test_a_request_without_sampling_params_takes_the_models_generation_config(tmp_path):
    """vLLM's LLM.generate(prompts) without sampling params samples with the sampling fields of the model's
    generation_config.json (as `minisgl serve` does); here they were ignored: a model whose file says temperature 0
    sampled at temperature 1. Explicit SamplingParams keep their own values, as in vLLM."""
    import json

    from engine.model_config import PRESETS
    from tests.hf_reference import hf_model_from_config, save_hf

    d = save_hf(hf_model_from_config(PRESETS["tiny-llama"], seed=7), tmp_path / "m")
    gen = d / "generation_config.json"
    saved = json.loads(gen.read_text()) if gen.exists() else {}
    gen.write_text(json.dumps({**saved, "temperature": 0.0, "top_k": 5}))
    llm = make_llm(str(d), num_pages=64, radix_cache=False)
    prompt = [5, 6, 7, 8]
    greedy = llm.generate(prompt, SamplingParams(temperature=0))[0].token_ids
    assert llm.generate(prompt)[0].token_ids == greedy
    defaults = llm.get_default_sampling_params()  # vLLM's name
    assert (defaults.temperature, defaults.top_k, defaults.max_tokens) == (0.0, 5, SamplingParams().max_tokens)
    assert list(llm.stream(prompt))[-1].token_ids == greedy
    hot = [llm.generate(prompt, SamplingParams(seed=s))[0].token_ids for s in range(3)]
    assert any(h != greedy for h in hot)  # SamplingParams() given: the API's temperature 1
    assert_idle(llm, 64)


def test_the_models_max_new_tokens_is_the_default_max_tokens_as_in_vllm(tmp_path):
    """vLLM's LLM.get_default_sampling_params() takes generation_config.json's max_new_tokens as max_tokens; here it
    was not read: a call without params ran the API's 128. Explicit SamplingParams keep their own, and the default
    stays within what the context leaves after the prompt (where vLLM's engine ends the request)."""
    import json

    from engine.async_llm import AsyncLLM
    from engine.model_config import PRESETS
    from tests.hf_reference import hf_model_from_config, save_hf

    d = save_hf(hf_model_from_config(PRESETS["tiny-llama"], seed=7), tmp_path / "m")
    gen = d / "generation_config.json"
    saved = json.loads(gen.read_text()) if gen.exists() else {}
    gen.write_text(json.dumps({**saved, "max_new_tokens": 5, "temperature": 0.0}))
    llm = make_llm(str(d), num_pages=64, max_model_len=40)
    prompt = [1, 2, 3]
    greedy = llm.generate(prompt, SamplingParams(max_tokens=12, temperature=0))[0]
    assert greedy.finish_reason == "length"  # no EOS in the first 12: the lengths below are the limits'
    assert llm.get_default_sampling_params().max_tokens == 5
    out = llm.generate(prompt)[0]
    assert (out.token_ids, out.finish_reason) == (greedy.token_ids[:5], "length")
    assert list(llm.stream(prompt))[-1].token_ids == greedy.token_ids[:5]
    assert len(llm.generate(prompt, SamplingParams(max_tokens=8, temperature=0))[0].token_ids) == 8
    # 37 prompt tokens in a context of 40: 3 left, as vLLM's engine stops there (a max_tokens of 5 was refused)
    long = [1, 2, 3] * 12 + [1]
    assert len(llm.generate(long)[0].token_ids) == 3
    a = AsyncLLM(llm)
    try:
        assert len(list(a.submit(long))[-1].token_ids) == 3
    finally:
        a.shutdown()
    for bad, why in ((-1, "must be an integer >= 1 .got -1."), ("64", "must be a number .got '64'.")):
        gen.write_text(json.dumps({"max_new_tokens": bad}))
        with pytest.raises(ValueError, match=f"{re.escape(str(gen))}: max_new_tokens {why}"):
            make_llm(str(d), num_pages=64).get_default_sampling_params()


def test_generation_config_auto_or_vllm_as_in_vllm(tmp_path):
    """vLLM's basic_with_model_default_sampling.py builds LLM(model, generation_config="auto"): a TypeError here.
    "auto" (vLLM's default, and ours) takes the model's generation_config.json; "vllm" the API's own defaults."""
    import json

    from engine.llm import LLM
    from engine.model_config import PRESETS
    from tests.hf_reference import hf_model_from_config, save_hf

    d = save_hf(hf_model_from_config(PRESETS["tiny-llama"], seed=7), tmp_path / "m")
    gen = d / "generation_config.json"
    saved = json.loads(gen.read_text()) if gen.exists() else {}
    gen.write_text(json.dumps({**saved, "temperature": 0.0, "top_k": 5, "max_new_tokens": 5}))
    cpu = dict(device="cpu", dtype="float32", num_pages=64)
    with LLM(str(d), generation_config="auto", **cpu) as auto, LLM(str(d), generation_config="vllm", **cpu) as api:
        defaults = auto.get_default_sampling_params()
        assert (defaults.temperature, defaults.top_k, defaults.max_tokens) == (0.0, 5, 5)
        greedy = auto.generate([1, 2, 3], SamplingParams(max_tokens=5, temperature=0))[0].token_ids
        assert auto.generate([1, 2, 3])[0].token_ids == greedy
        assert api.get_default_sampling_params() == SamplingParams()
    with pytest.raises(ValueError, match="generation_config must be 'auto' .* or 'vllm'"):
        LLM(str(d), generation_config=str(d), **cpu)


def test_max_tokens_defaults_to_vllms_16(smollm, hf_smollm):
    """SamplingParams().max_tokens was 128 where vLLM's is 16, so a script ported from vLLM (its quickstart gives no
    max_tokens) got outputs 8 times as long. Now 16: explicit params without max_tokens stop at transformers' 16th
    greedy token, and a call without params (a GGUF has no generation_config.json) stops by the 16th as well."""
    import torch

    prompt = "The capital of France is"
    ids = smollm.encode(prompt)
    with torch.no_grad():
        ref = hf_smollm.generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16, do_sample=False)
    greedy = smollm.generate(prompt, SamplingParams(temperature=0, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert (greedy.token_ids, greedy.finish_reason) == (ref[0, len(ids) :].tolist(), "length")
    story = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    assert smollm.get_default_sampling_params().max_tokens == 16
    for out in (smollm.generate(prompt, use_tqdm=False)[0], smollm.chat(story, use_tqdm=False)[0]):
        done = out.outputs[0]
        assert len(done.token_ids) == 16 if done.finish_reason == "length" else len(done.token_ids) < 16, done


def test_prompt_logprobs_in_vllms_shape_with_ranks_as_transformers_gives(smollm, hf_smollm):
    """vLLM's RequestOutput.prompt_logprobs is None for the first prompt token, then one {token id: Logprob(logprob,
    rank, decoded_token)} per prompt token: the token itself first with its rank in the whole vocabulary, then the
    top ones asked for ranked 1, 2, ... (prompt_logprobs=0: the token alone). Here it was minisgl's own TokenLogprob
    list, one shorter. Checked against transformers' distribution at every prompt position."""
    import torch

    prompt = "The capital of France is Paris, a city of painters"
    out = smollm.generate(prompt, SamplingParams(max_tokens=1, prompt_logprobs=3))[0]
    ids = out.prompt_token_ids
    with torch.no_grad():
        ref = torch.log_softmax(hf_smollm(torch.tensor([ids])).logits[0].float(), -1)
    lps = out.prompt_logprobs
    assert lps is not None and len(lps) == len(ids) and lps[0] is None
    # one record, as vLLM's attribute: a loop reading it per token rebuilt all of it each time (quadratic)
    assert out.prompt_logprobs is lps
    ranks = []
    for j, (token, entry) in enumerate(zip(ids[1:], lps[1:])):
        row = ref[j]  # the distribution after prompt tokens 0..j scores token j + 1
        assert entry is not None and next(iter(entry)) == token
        mine = entry[token]
        assert abs(mine.logprob - row[token].item()) < 1e-4
        assert int((row > row[token] + 1e-4).sum()) + 1 <= mine.rank <= int((row >= row[token] - 1e-4).sum())
        ranks.append(mine.rank)
        top = sorted(entry, key=lambda t: entry[t].rank)[:3]  # the token is among them where its rank is <= 3
        assert [entry[t].rank for t in top] == [1, 2, 3] and top == row.topk(3).indices.tolist()
        for t, lp in entry.items():
            assert lp.decoded_token == smollm.tokenizer.token_texts([t])[0]
            assert abs(lp.logprob - row[t].item()) < 1e-4
    assert max(ranks) > 3  # some prompt tokens lie outside the top 3: their rank was computed, not a top index
    # prompt_logprobs=0: each position holds its prompt token alone; detokenize=False: no decoded tokens
    only = smollm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False))[0]
    assert only.prompt_logprobs is not None and only.prompt_logprobs[0] is None
    singles = [e for e in only.prompt_logprobs[1:] if e is not None]
    assert [list(e) for e in singles] == [[t] for t in ids[1:]]
    assert [e[t].rank for e, t in zip(singles, ids[1:])] == ranks
    assert all(e[t].decoded_token is None for e, t in zip(singles, ids[1:]))
    assert smollm.generate(prompt, SamplingParams(max_tokens=1))[0].prompt_logprobs is None


def test_the_model_as_llms_first_argument_as_in_vllm():
    """vLLM's LLM("org/model") (its first parameter is the model) failed with a bare TypeError from
    dataclasses.replace: "replace() should be called on dataclass instances"."""
    from engine.llm import LLM

    llm = LLM("dummy:tiny-llama", device="cpu", num_pages=8)
    try:
        assert (llm.config.model, llm.config.num_pages) == ("dummy:tiny-llama", 8)
        assert len(llm.generate([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))[0].token_ids) == 2
    finally:
        llm.shutdown()
    with pytest.raises(TypeError, match="got the model twice"):
        LLM("dummy:tiny-llama", model="dummy:tiny-qwen3")
    with pytest.raises(TypeError, match="takes an EngineConfig or a model name first .got dict"):
        LLM({"model": "dummy:tiny-llama"})


def test_chat_as_in_vllm(smollm, monkeypatch):
    """vLLM's llm.chat(messages, params) was an AttributeError, and the Python API had no way to pass a chat
    template's variables (Qwen3's enable_thinking=False, vLLM's chat_template_kwargs)."""
    greedy = SamplingParams(max_tokens=4, temperature=0)
    hi, sky = [{"role": "user", "content": "Hi!"}], [{"role": "user", "content": "Why is the sky blue?"}]
    ref = smollm.generate([hi, sky], greedy)
    one = smollm.chat(hi, greedy)
    assert len(one) == 1 and one[0].token_ids == ref[0].token_ids
    assert [o.token_ids for o in smollm.chat([hi, sky], greedy)] == [o.token_ids for o in ref]
    qwen3_like = smollm.tokenizer.hf.chat_template + (
        "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
    )
    monkeypatch.setattr(smollm.tokenizer.hf, "chat_template", qwen3_like)
    off = smollm.chat(hi, greedy, chat_template_kwargs={"enable_thinking": False})[0]
    assert smollm.tokenizer.decode(off.prompt_token_ids, skip_special_tokens=False).endswith("</think>\n\n")
    assert smollm.chat(hi, greedy)[0].prompt_token_ids == ref[0].prompt_token_ids
    with pytest.raises(ValueError, match="each message needs a role"):
        smollm.chat(["Hi!"], greedy)
    # vLLM's switches: the last (assistant) message left open, to be continued; as transformers lays it out
    started = [*hi, {"role": "assistant", "content": "Hello! How"}]
    kw = dict(add_generation_prompt=False, continue_final_message=True)
    cont = smollm.chat(started, greedy, **kw)[0]
    assert cont.prompt_token_ids == list(smollm.tokenizer.hf.apply_chat_template(started, return_dict=False, **kw))
    assert cont.prompt is not None and cont.prompt.endswith("Hello! How")
    with pytest.raises(ValueError, match="cannot both be true"):
        smollm.chat(started, greedy, continue_final_message=True)
    # vLLM lays chat_template_kwargs over its call's switches: they may set these two (refused by name before)
    over = smollm.chat(started, greedy, chat_template_kwargs=kw)[0]
    assert over.prompt_token_ids == cont.prompt_token_ids


def test_vllms_optional_fields_and_keywords_at_their_defaults_as_in_vllm(smollm):
    """Ported vLLM code passes its own options through: SamplingParams(stop=None, stop_token_ids=None,
    logit_bias=None, max_tokens=None) was a ValueError, generate(..., lora_request=None) and chat(..., tools=None)
    a TypeError (AsyncLLM.generate took them), a dict as sampling_params was iterated as its keys ("got str
    'max_tokens'"), use_tqdm=tqdm refused, and LLM(enable_chunked_prefill=True) named EngineConfig.__init__."""
    from engine.llm import LLM

    greedy = SamplingParams(max_tokens=4, temperature=0, stop=None, stop_token_ids=None, logit_bias=None)
    assert (greedy.stop, greedy.stop_token_ids, greedy.logit_bias) == ([], [], {})
    ref = smollm.generate("Hi", SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)[0]
    got = smollm.generate("Hi", greedy, False, lora_request=None, priority=0)[0]
    assert got.token_ids == ref.token_ids
    # vLLM's fields for what this engine never has, None as vLLM gives them (logging code reads `if out.metrics:`)
    assert (got.metrics, got.lora_request, got.encoder_prompt, got.kv_transfer_params) == (None,) * 4
    assert got.outputs[0].lora_request is None
    hi = [{"role": "user", "content": "Hi"}]
    kw: dict = dict(lora_request=None, tools=None, chat_template_content_format="string")
    chatted = smollm.chat(hi, greedy, use_tqdm=lambda it, **_: it, **kw)[0]
    assert chatted.token_ids == smollm.chat(hi, greedy)[0].token_ids
    # max_tokens None: as many as the context leaves after the prompt (vLLM's), resolved per prompt
    until = SamplingParams(max_tokens=None, temperature=0, ignore_eos=True)
    tiny = make_llm(max_model_len=40)
    try:
        outs = tiny.generate([[1] * 30, [1] * 10], until)
        assert [len(o.token_ids) for o in outs] == [10, 30] and {o.finish_reason for o in outs} == {"length"}
        assert until.max_tokens is None  # the caller's object is left as it was
        with pytest.raises(ValueError, match="min_tokens .20. is more than the 10 tokens the context leaves"):
            tiny.generate([[1] * 30], SamplingParams(max_tokens=None, min_tokens=20))
        assert tiny.metrics().kv_pages_in_use == 0
    finally:
        tiny.shutdown()
    for bad, says in [
        (dict(lora_request=object()), "no LoRA adapters"),
        (dict(priority=3), "priority=0"),
    ]:
        with pytest.raises(TypeError, match=says):
            smollm.generate("Hi", greedy, **bad)
    with pytest.raises(ValueError, match="tools are not supported"):
        smollm.chat(hi, greedy, tools=[{"type": "function", "function": {"name": "f"}}])
    with pytest.raises(ValueError, match="chat_template_content_format 'openai'"):
        smollm.chat(hi, greedy, chat_template_content_format="openai")
    with pytest.raises(TypeError, match=r"got dict: SamplingParams\(\*\*fields\) takes a dict"):
        smollm.generate("Hi", {"max_tokens": 3})
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams.*got int"):
        smollm.generate("Hi", 5)
    with pytest.raises(TypeError, match="LLM.. got an unexpected keyword argument 'nonsense'"):
        LLM("dummy:tiny-llama", device="cpu", nonsense=1)
    with pytest.raises(TypeError, match="enable_chunked_prefill=False .vLLM's.: use max_batch_tokens"):
        LLM("dummy:tiny-llama", device="cpu", enable_chunked_prefill=False)
    llm = LLM("dummy:tiny-llama", device="cpu", num_pages=8, enable_chunked_prefill=True, pipeline_parallel_size=1)
    try:  # vLLM's reset_prefix_cache(): the cached pages dropped at once, the next run cold
        first = llm.generate([list(range(1, 40))], SamplingParams(max_tokens=2))[0]
        assert llm.metrics().kv_pages_cached > 0 and first.num_cached_tokens == 0
        assert llm.reset_prefix_cache() is True
        m = llm.metrics()
        assert (m.kv_pages_cached, m.kv_pages_in_use, m.kv_pages_free) == (0, 0, 8)
        assert llm.generate([list(range(1, 40))], SamplingParams(max_tokens=2))[0].num_cached_tokens == 0
    finally:
        llm.shutdown()


def test_chat_with_a_template_of_its_own_as_in_vllm(smollm):
    """vLLM's basic/chat.py passes llm.chat(..., chat_template=<a Jinja template>): a TypeError here. The
    conversation is laid out by that template, as transformers' apply_chat_template(chat_template=...) lays it out;
    the model's own template stays for the next call."""
    greedy = SamplingParams(max_tokens=4, temperature=0)
    template = (
        "{% for m in messages %}{{ '### ' + m['role'] + ':\\n' + m['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '### assistant:\\n' }}{% endif %}"
    )
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    hf = smollm.tokenizer.hf
    ref = hf.apply_chat_template(conv, chat_template=template, add_generation_prompt=True, return_dict=False)
    out = smollm.chat([conv, conv], greedy, use_tqdm=False, chat_template=template)
    assert [o.prompt_token_ids for o in out] == [list(ref)] * 2
    assert out[0].prompt == "### system:\nBe brief.\n### user:\nHello\n### assistant:\n"
    assert out[0].token_ids == smollm.generate([list(ref)], greedy)[0].token_ids
    assert smollm.chat(conv, greedy)[0].prompt_token_ids == smollm.encode(conv)  # the model's own again
    with pytest.raises(ValueError, match="chat_template: this model's byte tokenizer"):
        make_llm().chat(conv, greedy, chat_template=template)


def test_chat_content_parts_as_in_vllm(smollm):
    """vLLM's LLM.chat takes OpenAI's content parts ([{"type": "text", "text": ...}]): a ValueError here, where the
    server took them. Their texts a line each (vLLM's join for a template that takes a string), laid out as
    transformers lays out the joined text, by the same function as the server's; a part of another kind (an image,
    audio) is refused by its type, not dropped."""
    from minisgl_cli.server.errors import APIError
    from minisgl_cli.server.protocol import ChatCompletionRequest

    greedy = SamplingParams(max_tokens=4, temperature=0)
    two = [{"type": "text", "text": "What is 2+2?"}, {"type": "text", "text": "Answer in French."}]
    parts = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, {"role": "user", "content": two}]
    joined = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?\nAnswer in French."},
    ]
    ref = list(smollm.get_tokenizer().apply_chat_template(joined, add_generation_prompt=True, return_dict=False))
    out = smollm.chat(parts, greedy)[0]
    assert out.prompt_token_ids == ref
    assert out.token_ids == smollm.generate([ref], greedy)[0].token_ids
    assert ChatCompletionRequest(messages=parts).chat_prompt().encode(smollm.tokenizer) == ref  # the server's
    for kind, body in [("image_url", {"url": "https://example.com/cat.png"}), ("input_audio", {"format": "wav"})]:
        bad = [{"role": "user", "content": [*two, {"type": kind, kind: body}]}]
        why = rf"messages\[0\]\.content\[2\] is a part of type '{kind}': only text parts"
        with pytest.raises(ValueError, match=why):
            smollm.chat(bad, greedy)
        with pytest.raises(APIError, match=why):
            ChatCompletionRequest(messages=bad).chat_prompt()
    with pytest.raises(ValueError, match=r"messages\[0\]\.content\[0\]\.text must be a string"):
        smollm.chat([{"role": "user", "content": [{"type": "text", "text": 5}]}], greedy)
    assert not smollm.has_work()


# The parts vLLM's chat parser reads as text beyond "text" (vllm/entrypoints/chat_utils.py: MM_PARSER_MAP and
# _parse_chat_message_content_part(s)), and the conversation they make, a part's text a line each
PARTS_AS_VLLM_READS_THEM = [
    {"role": "user", "content": ["What is 2+2?", {"type": "text"}, {"type": "text", "text": None}, "", "In French."]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Four, in French.", "closed": True},
            {"type": "text", "text": ""},
            {"type": "refusal", "refusal": "I cannot answer that."},
        ],
    },
    {"role": "user", "content": [{"type": "input_text", "text": "Please?"}, {"type": "output_text"}]},
]
PARTS_JOINED = [
    {"role": "user", "content": "What is 2+2?\nIn French."},
    {"role": "assistant", "content": "Four, in French.\nI cannot answer that."},
    {"role": "user", "content": "Please?"},
]


def test_chat_content_parts_vllm_reads_as_text(smollm):
    """vLLM's chat parser reads a refusal part's `refusal` and a thinking part's `thinking` as text (the thinking
    into the content, not the message's `reasoning`), takes a bare string in a parts list as a text, and skips a text
    part whose text is missing, null or "" (it keeps only the parts that parse to a non-empty text): all four were a
    ValueError here. The same prompt ids as transformers lays out the joined texts, in LLM.chat and the server's."""
    from minisgl_cli.server.protocol import ChatCompletionRequest

    greedy = SamplingParams(max_tokens=1, temperature=0)
    hf = smollm.get_tokenizer()
    ref = list(hf.apply_chat_template(PARTS_JOINED, add_generation_prompt=True, return_dict=False))
    assert smollm.chat(PARTS_AS_VLLM_READS_THEM, greedy)[0].prompt_token_ids == ref
    assert ChatCompletionRequest(messages=PARTS_AS_VLLM_READS_THEM).chat_prompt().encode(smollm.tokenizer) == ref
    assert not smollm.has_work()


def test_vllms_output_shape_with_ranks_and_decoded_tokens_as_transformers_gives(smollm, hf_smollm):
    """vLLM's quickstart reads `output.prompt` and `output.outputs[0].text`: both were AttributeErrors. Its logprobs
    are dicts {token id: Logprob(logprob, rank, decoded_token)} per position, the chosen token first with its rank in
    the whole vocabulary (how many tokens are at least as likely), then the top ones ranked 1, 2, ...; checked
    against transformers' distribution at every position."""
    import torch

    prompts = ["Hello, my name is", "The capital of France is"]
    params = SamplingParams(max_tokens=6, temperature=1.5, seed=3, logprobs=3, ignore_eos=True)
    outs = smollm.generate(prompts, params)
    ranks = []
    for prompt, out in zip(prompts, outs):
        assert out.prompt == prompt and out.request_id == out.rid and out.num_cached_tokens == out.cache_hit_tokens
        (done,) = out.outputs
        assert (done.index, done.text, list(done.token_ids)) == (0, out.text, list(out.token_ids))
        assert out.outputs[0] is done  # built once, as vLLM's attribute (per-token reads in a loop were quadratic)
        assert done.finished() and (done.finish_reason, done.stop_reason) == ("length", None)
        seq = out.prompt_token_ids + list(out.token_ids)
        with torch.no_grad():
            ref = torch.log_softmax(hf_smollm(torch.tensor([seq])).logits[0].float(), -1)
        assert done.logprobs is not None and len(done.logprobs) == len(out.token_ids) == 6
        for j, (token, entry) in enumerate(zip(out.token_ids, done.logprobs)):
            row = ref[len(out.prompt_token_ids) - 1 + j]
            assert next(iter(entry)) == token  # the chosen token first, as vLLM lists it
            chosen = entry[token]
            assert abs(chosen.logprob - row[token].item()) < 1e-4
            # its rank: the tokens at least as likely (a margin for the fp32 difference between the two models)
            assert int((row > row[token] + 1e-4).sum()) + 1 <= chosen.rank <= int((row >= row[token] - 1e-4).sum())
            ranks.append(chosen.rank)
            top = [t for t in entry if t != token or chosen.rank <= 3]
            assert [entry[t].rank for t in top] == [1, 2, 3] and top == row.topk(3).indices.tolist()
            for t, lp in entry.items():
                assert lp.decoded_token == smollm.tokenizer.token_texts([t])[0]
                assert abs(lp.logprob - row[t].item()) < 1e-4
        assert done.cumulative_logprob == pytest.approx(
            sum(entry[t].logprob for t, entry in zip(seq[-6:], done.logprobs))
        )
    assert max(ranks) > 3  # at temperature 1.5 some chosen tokens are outside the top 3: their rank was computed
    # token ids in, no text out: no prompt text and no decoded tokens (vLLM's detokenize=False); no logprobs asked
    raw = smollm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, logprobs=1, detokenize=False))[0]
    assert raw.prompt is None and all(
        lp.decoded_token is None for e in raw.outputs[0].logprobs or [] for lp in e.values()
    )
    plain = smollm.generate("Hi", SamplingParams(max_tokens=2))[0].outputs[0]
    assert plain.logprobs is None and plain.cumulative_logprob is None
    # chat(): the prompt as the template laid the conversation out
    hi = [{"role": "user", "content": "Hi!"}]
    laid_out = smollm.tokenizer.hf.apply_chat_template(hi, tokenize=False, add_generation_prompt=True)
    assert smollm.chat(hi, SamplingParams(max_tokens=2))[0].prompt == laid_out


def test_include_stop_str_in_output_as_in_vllm(smollm, hf_smollm):
    """vLLM's SamplingParams(include_stop_str_in_output=True) was a TypeError: the stop string that matched, or the
    stop_token_ids token that ended the request, stays at the end of the text. Checked against transformers' greedy
    continuation, cut where each stop falls."""
    import torch

    prompt = "The capital of France is"
    ids = smollm.encode(prompt)
    with torch.no_grad():
        ref = hf_smollm.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids) :].tolist()
    text = smollm.tokenizer.decode(ref)
    stop = text[5:9]  # a stop string, wherever its tokens fall
    at = text.index(stop)
    stop_id = ref[3]
    k = ref.index(stop_id)
    for include in (False, True):
        greedy = dict(temperature=0, max_tokens=12, include_stop_str_in_output=include)
        by_text = smollm.generate(prompt, SamplingParams(stop=[stop], **greedy))[0].outputs[0]
        assert (by_text.text, by_text.finish_reason, by_text.stop_reason) == (
            text[: at + len(stop) * include],
            "stop",
            stop,
        )
        by_id = smollm.generate(prompt, SamplingParams(stop_token_ids=[stop_id], **greedy))[0].outputs[0]
        assert list(by_id.token_ids) == ref[: k + 1] and by_id.stop_reason == stop_id
        assert by_id.text == smollm.tokenizer.decode(ref[: k + include])
    with pytest.raises(ValueError, match="include_stop_str_in_output must be true or false"):
        SamplingParams(include_stop_str_in_output="yes")


def test_skip_special_tokens_as_in_vllm(smollm):
    """vLLM's SamplingParams(skip_special_tokens=False, spaces_between_special_tokens=...) were TypeErrors: special
    tokens now show in the text where the output holds them (greedy with ignore_eos runs past SmolLM2's <|im_end|>),
    whole and streamed, as transformers decodes the same ids; the EOS that ends a request stays out unless
    include_stop_str_in_output (vLLM's stop_terminated), a stop string can match a special token's text, and the
    logprobs' decoded tokens are each token's own text either way (vLLM's convert_ids_list_to_tokens)."""
    hf = smollm.tokenizer.hf
    conv = [{"role": "user", "content": "Reply with one word: yes or no?"}]
    ids = smollm.encode(conv)
    for skip in (True, False):
        for spaces in (True, False):
            switches = dict(skip_special_tokens=skip, spaces_between_special_tokens=spaces)
            params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0, **switches)
            out = smollm.generate(ids, params)[0]
            want = hf.decode(list(out.token_ids), **switches)
            assert out.text == want and ("<|im_end|>" in want) == (not skip)
            assert "".join(o.delta_text for o in smollm.stream(ids, params)) == want
            decoded = [lp.decoded_token for e in out.outputs[0].logprobs or [] for lp in e.values()]
            assert decoded == smollm.tokenizer.token_texts(list(out.token_ids))  # "<|im_end|>" among them
    greedy = dict(temperature=0, max_tokens=12, skip_special_tokens=False)
    ended = smollm.generate(ids, SamplingParams(**greedy))[0]
    assert ended.finish_reason == "stop" and ended.token_ids[-1] in smollm.tokenizer.eos_ids
    assert ended.text == hf.decode(list(ended.token_ids[:-1]), skip_special_tokens=False)  # its EOS left out
    kept = smollm.generate(ids, SamplingParams(**greedy, include_stop_str_in_output=True))[0]
    assert kept.text == hf.decode(list(ended.token_ids), skip_special_tokens=False) == ended.text + "<|im_end|>"
    cut = smollm.generate(ids, SamplingParams(**greedy, ignore_eos=True, stop=["<|im_end|>"]))[0]
    assert (cut.text, cut.finish_reason, cut.stop_reason) == (ended.text, "stop", "<|im_end|>")
    for name in ("skip_special_tokens", "spaces_between_special_tokens"):
        with pytest.raises(ValueError, match=f"{name} must be true or false"):
            SamplingParams(**{name: "false"})


def test_n_choices_as_in_vllm(smollm):
    """vLLM's SamplingParams(n=...) (a TypeError here): generate() runs n choices of each prompt, choice j seeded
    seed + j (vLLM's rule), and returns them as one output's `outputs`, each equal to a single request with that
    seed; a request submitted alone is one choice and says so."""
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=11, n=3, ignore_eos=True)
    prompts = ["Once upon a time", "The weather today"]
    outs = smollm.generate(prompts, params)
    assert len(outs) == 2
    for prompt, out in zip(prompts, outs):
        alone = [
            smollm.generate(prompt, SamplingParams(max_tokens=6, temperature=1.0, seed=11 + j, ignore_eos=True))[0]
            for j in range(3)
        ]
        assert [(c.index, c.text, list(c.token_ids)) for c in out.outputs] == [
            (j, a.text, list(a.token_ids)) for j, a in enumerate(alone)
        ]
        assert out.text == out.outputs[0].text and len({c.text for c in out.outputs}) > 1
        assert dataclasses.asdict(out)["other_choices"][1]["text"] == alone[2].text  # no cycle to recurse into
    # an on_output callback reads the first choice's `outputs` before generate() joins the others to it
    seen: list[int] = []
    joined = smollm.generate(prompts[0], params, on_output=lambda o: seen.append(len(o.outputs)))[0]
    assert 1 in seen and len(joined.outputs) == 3
    # mixed per prompt, and through chat(); the caller's params object is not changed
    mixed = smollm.generate(prompts, [params, SamplingParams(max_tokens=2, n=1)])
    assert [len(o.outputs) for o in mixed] == [3, 1] and params.n == 3 and params.seed == 11
    chat = smollm.chat([{"role": "user", "content": "Hi!"}], SamplingParams(max_tokens=3, n=2, seed=5))[0]
    assert len(chat.outputs) == 2 and chat.prompt is not None
    for bad in (0, 129, 1.5):
        with pytest.raises(ValueError, match=r"n must be an integer"):
            SamplingParams(n=bad)
    with pytest.raises(ValueError, match=r"n=2: a request is one choice"):
        next(iter(smollm.stream("hi", SamplingParams(n=2))))
    with pytest.raises(ValueError, match=r"n=2: a request is one choice"):
        smollm.add_request("hi", SamplingParams(n=2))
    assert not smollm.has_work()


@pytest.mark.parametrize(
    ("n", "message"), [(0, "n must be an integer in"), (200, "n must be an integer in"), (2.5, "n must be an integer")]
)
def test_n_assigned_after_construction_is_checked(n, message):
    """SamplingParams.n set after construction was never checked: n=0 added no request for its prompt, so generate()
    returned the next prompt's output in its place; n=200 ran past MAX_N; n=2.5 was a bare TypeError."""
    llm = make_llm(num_pages=64)
    params = SamplingParams(max_tokens=2, temperature=0)
    params.n = n
    with pytest.raises(ValueError, match=message):
        llm.generate(["aaa", "bbbbbb"], [params, SamplingParams(max_tokens=2)], use_tqdm=False)
    assert_idle(llm, 64)


def test_the_progress_bar_leaves_stdout_alone(monkeypatch):
    """generate()'s bar (stderr a terminal) is drawn with rich, whose default redirects sys.stdout to the bar's console
    while it is shown: what an on_output callback printed went to stderr, so `script > out.txt` lost it to the
    terminal. vLLM's tqdm bar leaves stdout alone."""
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    llm = make_llm(num_pages=64)
    out, err = io.StringIO(), Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    llm.generate(["abc"], SamplingParams(max_tokens=2), on_output=lambda o: print("from the callback"))
    monkeypatch.undo()
    assert "Processed prompts" in err.getvalue()  # the bar was drawn
    assert "from the callback" in out.getvalue() and "from the callback" not in err.getvalue()


QUICKSTART = """
from engine.llm import LLM  # vLLM: from vllm import LLM, SamplingParams
from engine.sampling_params import SamplingParams

prompts = ["Hello, my name is", "The president of the United States is", "The capital of France is", "AI is"]
sampling_params = SamplingParams(temperature=0.8, top_p=0.95)
llm = LLM(model="dummy:tiny-llama", device="cpu")  # vLLM: LLM(model="facebook/opt-125m")
outputs = llm.generate(prompts, sampling_params=sampling_params)
for output in outputs:
    prompt = output.prompt
    generated_text = output.outputs[0].text
    print(f"Prompt: {prompt!r}, Generated text: {len(generated_text)} characters")
"""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_vllms_quickstart_runs_with_its_progress_bar_in_a_terminal(tmp_path):
    """vLLM's quickstart, its imports aside: generate(prompts, sampling_params=...) was a TypeError (the parameter
    was `params`), use_tqdm unknown, output.prompt and output.outputs missing. In a terminal generate() draws vLLM's
    "Processed prompts" bar (rich, on stderr); piped, nothing but the script's own output."""
    from tests.conftest import subprocess_env
    from tests.test_chat_terminal import Terminal, exit_status, start

    script = tmp_path / "quickstart.py"
    script.write_text(QUICKSTART)
    root = Path(__file__).resolve().parent.parent
    term = Terminal(tmp_path / "tmux.sock")
    try:
        start(term, tmp_path, f"cd {root} && PYTHONPATH={root} {sys.executable} {script}")
        status = exit_status(term, tmp_path, timeout=120)
        screen = term.screen()
    finally:
        subprocess.run(["tmux", "-S", term.sock, "kill-server"], capture_output=True)
    assert status == 0, screen
    assert re.search(r"Processed prompts .* 4/4 .* output [\d,]+ tok/s", screen), screen
    assert screen.count("Prompt: ") == 4 and "Prompt: 'The capital of France is'" in screen
    piped = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=subprocess_env(), cwd=root
    )
    assert piped.returncode == 0 and piped.stdout.count("Prompt: ") == 4, piped.stderr
    assert "Processed prompts" not in piped.stderr
    with pytest.raises(TypeError, match="use_tqdm must be True, False or a tqdm factory .got int"):
        make_llm().generate("hi", use_tqdm=5)


def test_vllms_engine_keywords_and_get_tokenizer(smollm):
    """LLM(model, max_num_seqs=..., enforce_eager=True, trust_remote_code=True, ...) as vLLM scripts write it was a
    bare TypeError from EngineConfig: vLLM's names are taken as the fields they are here; one with no equivalent
    says what to use; llm.get_tokenizer() is vLLM's (the Hugging Face tokenizer)."""
    import torch

    from engine.llm import LLM, _engine_names

    llm = LLM(
        "dummy:tiny-llama",
        device="cpu",
        tensor_parallel_size=1,
        max_num_seqs=4,
        max_num_batched_tokens=256,
        enable_prefix_caching=False,
        block_size=32,
        enforce_eager=True,
        trust_remote_code=True,
        num_pages=16,
        # the same names here: what they mean there, dtype under vLLM's other names too
        dtype="float",
        seed=7,
        max_model_len=64,
        kv_cache_dtype="auto",
        # no effect on what runs here: stats lines, swap room for preemption (recomputed here), NCCL's sums for TP
        disable_log_stats=False,
        swap_space=4,
        disable_custom_all_reduce=True,
        # at the values that mean this engine's way
        tokenizer_mode="auto",
        max_logprobs=20,
        task="generate",
        runner="auto",
        cpu_offload_gb=0,
        download_dir=None,
        hf_token=None,
        revision=None,
    )
    try:
        c = llm.config
        assert (c.tp, c.max_running_requests, c.max_batch_tokens, c.radix_cache, c.page_size) == (1, 4, 256, False, 32)
        assert (c.cuda_graph_max_bs, c.piecewise_graph_tokens) == (0, 0)
        assert (c.dtype, c.seed, c.max_model_len, c.kv_cache_dtype, c.max_logprobs) == ("float32", 7, 64, "auto", 20)
        assert len(llm.generate([1, 2, 3], SamplingParams(max_tokens=2, ignore_eos=True))[0].token_ids) == 2
        assert llm.get_tokenizer() is llm.tokenizer  # a dummy model's byte tokenizer
    finally:
        llm.shutdown()
    assert _engine_names({"dtype": "half"}) == {"dtype": "float16"}
    assert _engine_names({"dtype": torch.bfloat16}) == {"dtype": "bfloat16"}
    # what would change what runs, or needs a download: refused, naming what to use instead
    refused = {
        "gpu_memory_utilization": (0.9, "kv_cache_gb"),
        "tokenizer_mode": ("slow", "the model's Hugging Face tokenizer"),
        "task": ("embed", "no pooling runners"),
        "runner": ("pooling", "no pooling runners"),
        "cpu_offload_gb": (4, "no weights are offloaded"),
        "download_dir": ("/tmp/hf", "a local model directory"),
        "hf_token": ("hf_abc", "nothing is downloaded"),
        "revision": ("main", "of that revision"),
    }
    for name, (value, instead) in refused.items():
        with pytest.raises(TypeError, match=rf"LLM\(\) has no {name}={value!r} \(vLLM's\): use .*{instead}"):
            LLM("dummy:tiny-llama", device="cpu", **{name: value})
    with pytest.raises(ValueError, match="seed must be int"):  # vLLM's older default: an unseeded engine
        LLM("dummy:tiny-llama", device="cpu", seed=None)
    with pytest.raises(TypeError, match=r"got max_num_seqs= and max_running_requests="):
        LLM("dummy:tiny-llama", device="cpu", max_num_seqs=2, max_running_requests=4)
    hf = smollm.get_tokenizer()
    conv = [{"role": "user", "content": "Hi!"}]
    assert hf.apply_chat_template(conv, tokenize=True, add_generation_prompt=True, return_dict=False) == smollm.encode(
        conv
    )


@pytest.mark.parametrize(("setting", "cap"), [(None, 20), (30, 30), (-1, 512), (1000, 512)])
def test_max_logprobs_is_the_engines_setting_as_vllms(setting, cap):
    """vLLM's max_logprobs (LLM(max_logprobs=...), serve --max-logprobs): the most log-probabilities a request may ask
    per token, logprobs and prompt_logprobs alike; 20 by default, -1 the whole vocabulary (vllm/sampling_params.py
    _validate_logprobs). Here 20 was built in and LLM(max_logprobs=30) a TypeError. A request asking more is refused
    naming the setting; a setting past the vocabulary (512 here) allows the vocabulary, the most the sampler's top-k
    can give (asking more failed the step)."""
    import math

    from engine.llm import LLM

    kw = {} if setting is None else {"max_logprobs": setting}
    with LLM("dummy:tiny-llama", device="cpu", num_pages=16, **kw) as llm:
        out = llm.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0, logprobs=cap, prompt_logprobs=cap))[0]
        for position in [*out.outputs[0].logprobs, *out.prompt_logprobs[1:]]:
            assert len(position) in (cap, cap + 1)  # the top `cap`, and the chosen token where it is not among them
        if cap == 512:
            assert math.isclose(
                sum(math.exp(lp.logprob) for lp in out.outputs[0].logprobs[0].values()), 1, rel_tol=1e-4
            )
        for name in ("logprobs", "prompt_logprobs"):
            why = rf"{name} must be in \[0, {cap}\] or -1 .* \(got {cap + 1}\)"
            with pytest.raises(ValueError, match=why):
                llm.generate([1, 2, 3], SamplingParams(max_tokens=2, **{name: cap + 1}))
        # vLLM's per-request -1, the whole vocabulary: where the engine's max_logprobs allows it (it was refused)
        whole = SamplingParams(max_tokens=2, temperature=0, logprobs=-1, prompt_logprobs=-1)
        if cap == 512:
            out = llm.generate([1, 2, 3], whole)[0]
            assert [len(p) for p in [*out.outputs[0].logprobs, *out.prompt_logprobs[1:]]] == [512] * 4
        else:
            with pytest.raises(ValueError, match=r"logprobs must be in .* \(got -1\)"):
                llm.generate([1, 2, 3], whole)
        assert not llm.has_work()
    with pytest.raises(ValueError, match="max_logprobs must be >= 0, or -1 for the whole vocabulary"):
        LLM("dummy:tiny-llama", device="cpu", max_logprobs=-2)


def test_vllms_keywords_at_none_take_our_defaults():
    """vLLM's LLM() keywords at vLLM's own default, None, as code written for vLLM passes them (argparse's None):
    our defaults, not a ValueError for each mapped name or a TypeError for tokenizer / quantization."""
    from engine.llm import LLM

    nones = dict.fromkeys(
        ["max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "block_size", "tokenizer", "quantization"]
        + ["tokenizer_mode", "max_logprobs", "task", "runner", "cpu_offload_gb", "download_dir", "hf_token", "revision"]
    )
    tiny = dict(model="dummy:tiny-llama", device="cpu")
    with LLM(**tiny, **nones) as llm, LLM(**tiny) as ref:
        assert llm.config == ref.config
        assert len(llm.generate(["hi"], SamplingParams(max_tokens=2))[0].token_ids) == 2
    with pytest.raises(TypeError, match="tokenizer"):  # a tokenizer named is still refused, naming what to use
        LLM(model="dummy:tiny-llama", device="cpu", tokenizer="org/other")
