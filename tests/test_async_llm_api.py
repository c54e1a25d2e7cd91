"""vLLM's async Python API (engine.async_llm: AsyncEngineArgs, AsyncLLM.from_engine_args, generate, abort, shutdown)
driven as code written for vLLM drives it, on the real engine: the outputs are those LLM.generate gives, and no request
is left running or holding KV pages behind an abort, a consumer that left, or an error."""

from __future__ import annotations

import asyncio
import json
import re
import runpy
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from engine.async_llm import AsyncEngineArgs, AsyncLLM, AsyncLLMEngine, EngineDeadError
from engine.llm import engine_config
from engine.sampling_params import RequestOutputKind, SamplingParams
from tests.conftest import make_llm
from tests.test_engine import assert_all_pages_back

LONG = SamplingParams(max_tokens=900, ignore_eos=True)  # runs until something ends it


def tiny_async(**kw) -> AsyncLLM:
    """A dummy tiny-llama engine, CPU, checking its page accounting after every step, built as vLLM's is."""
    kw = {"model": "dummy:tiny-llama", "device": "cpu", "dtype": "float32", "check_invariants": True, **kw}
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))


T = TypeVar("T")


def run_and_count(a: AsyncLLM, main: Callable[[], Coroutine[Any, Any, T]]) -> tuple[T, int, int]:
    """main()'s result, then the engine's generated tokens and finished requests in all; `a` shut down either way."""
    try:
        got = asyncio.run(main())
        tokens = a.call(lambda llm: llm.engine.stats["generation_tokens"])
        finished = a.call(lambda llm: llm.metrics().finished_requests)
    finally:
        a.shutdown()
    return got, tokens, finished


async def settled(a: AsyncLLM) -> None:
    """Waits (at most 30 s) until the engine has no request, then checks that every KV page came back."""
    for _ in range(600):
        if not a.call(lambda llm: llm.has_work()):
            break
        await asyncio.sleep(0.05)

    def check(llm) -> None:
        assert_all_pages_back(llm)
        llm.engine.check()

    a.call(check)


# vLLM's examples/offline_inference/async_llm_streaming.py, its imports (and the model: nothing is downloaded here)
# changed as the "vLLM:" comments say; the rest as written.
ASYNC_STREAMING_EXAMPLE = """
import asyncio

from engine.sampling_params import SamplingParams  # vLLM: from vllm import SamplingParams
from engine.async_llm import AsyncEngineArgs  # vLLM: from vllm.engine.arg_utils import AsyncEngineArgs
from engine.sampling_params import RequestOutputKind  # vLLM: from vllm.sampling_params import RequestOutputKind
from engine.async_llm import AsyncLLM  # vLLM: from vllm.v1.engine.async_llm import AsyncLLM


async def stream_response(engine: AsyncLLM, prompt: str, request_id: str) -> None:
    print(f"\\n🚀 Prompt: {prompt!r}")
    print("💬 Response: ", end="", flush=True)

    sampling_params = SamplingParams(
        max_tokens=100,
        temperature=0.8,
        top_p=0.95,
        seed=42,  # For reproducible results
        output_kind=RequestOutputKind.DELTA,  # Get only new tokens each iteration
    )

    try:
        async for output in engine.generate(
            request_id=request_id, prompt=prompt, sampling_params=sampling_params
        ):
            for completion in output.outputs:
                new_text = completion.text
                if new_text:
                    print(new_text, end="", flush=True)

            if output.finished:
                print("\\n✅ Generation complete!")
                break

    except Exception as e:
        print(f"\\n❌ Error during streaming: {e}")
        raise


async def main():
    print("🔧 Initializing AsyncLLM...")

    engine_args = AsyncEngineArgs(
        model=None,  # vLLM: model="meta-llama/Llama-3.2-1B-Instruct"
        device="cpu",  # (the reference below runs on a CPU)
        enforce_eager=True,  # Faster startup for examples
    )
    engine = AsyncLLM.from_engine_args(engine_args)

    try:
        prompts = [
            "The future of artificial intelligence is",
            "In a galaxy far, far away",
            "The key to happiness is",
        ]

        print(f"🎯 Running {len(prompts)} streaming examples...")

        for i, prompt in enumerate(prompts, 1):
            print(f"\\n{'=' * 60}")
            print(f"Example {i}/{len(prompts)}")
            print(f"{'=' * 60}")

            request_id = f"stream-example-{i}"
            await stream_response(engine, prompt, request_id)

            if i < len(prompts):
                await asyncio.sleep(0.5)

        print("\\n🎉 All streaming examples completed!")

    finally:
        print("🔧 Shutting down engine...")
        engine.shutdown()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        print("\\n🛑 Interrupted by user")
"""


def test_vllms_async_streaming_example_runs_as_written(tmp_path, capsys, smollm):
    """vLLM's async streaming example, its imports aside: each response it prints (DELTA outputs joined) is the text
    LLM.generate gives for the same seeded request, and the engine it built is shut down at its end."""
    script = tmp_path / "async_llm_streaming.py"
    script.write_text(ASYNC_STREAMING_EXAMPLE)
    runpy.run_path(str(script), run_name="__main__")
    printed = capsys.readouterr().out
    assert "❌" not in printed and printed.count("✅ Generation complete!") == 3, printed
    assert "🎉 All streaming examples completed!\n🔧 Shutting down engine..." in printed
    prompts = re.findall(r"🚀 Prompt: '([^'\n]*)'\n💬 Response: (.*?)\n✅ Generation complete!", printed, re.S)
    params = SamplingParams(max_tokens=100, temperature=0.8, top_p=0.95, seed=42)
    expected = smollm.generate([p for p, _ in prompts], params, use_tqdm=False)
    assert len(prompts) == 3 and [text for _, text in prompts] == [o.outputs[0].text for o in expected]
    assert all(len(o.token_ids) > 20 for o in expected)  # real responses, not empty ones that match


def test_output_kinds_join_to_the_text_llm_generate_gives(smollm):
    """CUMULATIVE outputs grow to the whole text, DELTA ones (text, token ids, logprobs) join to it, FINAL_ONLY gives
    it once: the text, tokens and logprobs LLM.generate gives for the same greedy request. DELTA's prompt_logprobs
    come with the first output alone, as in vLLM."""
    prompt = "Write a short list of three fruits."
    base = dict(max_tokens=40, temperature=0, logprobs=2, prompt_logprobs=1, stop=["4."])
    ref = smollm.generate(prompt, SamplingParams(**base), use_tqdm=False)[0].outputs[0]
    ref_prompt_lps = smollm.generate(prompt, SamplingParams(**base), use_tqdm=False)[0].prompt_logprobs
    assert len(ref.token_ids) > 5 and ref.text
    a = AsyncLLM(smollm)

    async def run(kind: RequestOutputKind) -> list:
        params = SamplingParams(**base, output_kind=kind)
        return [o async for o in a.generate(prompt, params, f"req-{kind.name}")]

    async def main() -> list[list]:
        return await asyncio.gather(*(run(k) for k in RequestOutputKind))  # at once: one batch

    try:
        cumulative, delta, final = asyncio.run(main())
        asyncio.run(settled(a))
    finally:
        a.shutdown()
    for outs, name in ((cumulative, "CUMULATIVE"), (delta, "DELTA"), (final, "FINAL_ONLY")):
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        assert {o.request_id for o in outs} == {f"req-{name}"}
        assert outs[-1].outputs[0].finish_reason == ref.finish_reason
    assert len(cumulative) > 5 and len(final) == 1
    texts = [o.outputs[0].text for o in cumulative]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    # each a list, as vLLM's, of the tokens so far at that output (a running request's were a Prefix: `ids + [x]`
    # and json.dumps failed)
    ids = [o.outputs[0].token_ids for o in cumulative]
    assert all(type(t) is list for t in ids) and [len(t) for t in ids] == list(range(1, len(ids) + 1))
    assert json.loads(json.dumps(ids[-1] + [])) == list(ref.token_ids)
    for last in (cumulative[-1].outputs[0], final[0].outputs[0]):
        assert (last.text, list(last.token_ids)) == (ref.text, ref.token_ids)
        assert_same_logprobs(last.logprobs, ref.logprobs)
    parts = [o.outputs[0] for o in delta]
    assert "".join(c.text for c in parts) == ref.text
    assert [t for c in parts for t in c.token_ids] == list(ref.token_ids)
    assert_same_logprobs([lp for c in parts for lp in c.logprobs], ref.logprobs)
    assert parts[-1].cumulative_logprob == pytest.approx(ref.cumulative_logprob, abs=1e-3)
    assert_same_logprobs(delta[0].prompt_logprobs, ref_prompt_lps)
    assert all(o.prompt_logprobs is None for o in delta[1:])
    assert_same_logprobs(cumulative[-1].prompt_logprobs, ref_prompt_lps)


def assert_same_logprobs(got: list, expected: list) -> None:
    """The same tokens, ranks and decoded texts; the values to fp32 rounding (a batch of three against one)."""
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if e is None:
            assert g is None
            continue
        assert [(t, lp.rank, lp.decoded_token) for t, lp in g.items()] == [
            (t, lp.rank, lp.decoded_token) for t, lp in e.items()
        ]
        assert [lp.logprob for lp in g.values()] == pytest.approx([lp.logprob for lp in e.values()], abs=1e-4)


def test_many_concurrent_generate_tasks_get_their_own_tokens():
    """Twelve generate() tasks at once (one batch in the engine) each get their own request's outputs: the tokens
    LLM.generate gives for that prompt alone, under the request_id it was given."""
    prompts = [[i + 1, (7 * i) % 50 + 2, 3] for i in range(12)]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    reference = make_llm(num_pages=256).generate(prompts, params, use_tqdm=False)
    a = tiny_async(num_pages=256)

    async def one(i: int) -> tuple[str, list[int], int]:
        outs = [o async for o in a.generate(prompts[i], params, f"c{i}")]
        return outs[-1].request_id, list(outs[-1].outputs[0].token_ids), len(outs)

    async def main() -> list:
        got = await asyncio.gather(*(one(i) for i in range(len(prompts))))
        await settled(a)
        return got

    try:
        got = asyncio.run(main())
        assert a.call(lambda llm: llm.metrics().finished_requests) == len(prompts)
    finally:
        a.shutdown()
    assert [(rid, ids) for rid, ids, _ in got] == [(f"c{i}", list(o.token_ids)) for i, o in enumerate(reference)]
    assert all(n == 12 for _, _, n in got)  # one CUMULATIVE output per token


async def consumers_leaving(a: AsyncLLM, params: SamplingParams) -> None:
    """A consumer's two ways out mid-request: its task cancelled (request "cancelled", a client gone), and a `break`
    once every choice has made 3 tokens (request "left"; the generator is dropped there: vLLM's "garbage collected"
    case)."""
    started = asyncio.Event()

    async def client() -> None:
        async for _ in a.generate([4, 5, 6], params, "cancelled"):
            started.set()

    task = asyncio.create_task(client())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async for out in a.generate([7, 8], params, "left"):
        if all(len(c.token_ids) >= 3 for c in out.outputs):
            break


def test_abort_and_a_consumer_gone_end_their_requests_with_every_page_back():
    """abort(request_id) ends a request with a last output (finish_reason "abort"), as vLLM's does; a consumer task
    cancelled (a client gone) and a generator left after a `break` abort theirs. None runs on to its 900 tokens, every
    KV page comes back, and a request beside them finishes with the tokens it makes alone."""
    a = tiny_async(num_pages=256)
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    alone = make_llm(num_pages=64).generate([[9, 9, 9]], greedy, use_tqdm=False)[0].token_ids

    async def main() -> dict:
        got: dict = {}
        bystander = asyncio.create_task(_collect(a.generate([9, 9, 9], greedy, "bystander")))
        aborted = a.generate([1, 2, 3], LONG, "aborted")
        first = await aborted.__anext__()
        await a.abort("aborted")
        await a.abort(["not-running", "neither"])  # no-ops, as vLLM's
        got["aborted"] = [first] + [o async for o in aborted]

        await consumers_leaving(a, LONG)
        got["bystander"] = await bystander
        await settled(a)
        return got

    got, tokens, finished = run_and_count(a, main)
    last = got["aborted"][-1]
    assert last.finished and last.outputs[0].finish_reason == "abort" and last.request_id == "aborted"
    assert [o.finished for o in got["aborted"][:-1]] == [False] * (len(got["aborted"]) - 1)
    assert got["bystander"][-1].outputs[0].finish_reason == "length"
    assert list(got["bystander"][-1].outputs[0].token_ids) == alone
    assert finished == 4 and tokens - 24 < 900  # the three together made fewer tokens than one would alone


async def _collect(gen) -> list:
    return [o async for o in gen]


def test_a_request_id_still_running_is_refused_as_in_vllm():
    """A second generate() under a request_id still running raises vLLM's "Request id ... already running." from the
    generator, and harms nothing: the first request makes its tokens; once it has finished, the id is free again."""
    a = tiny_async(num_pages=128)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    alone = make_llm(num_pages=64).generate([[5, 6, 7]], params, use_tqdm=False)[0].token_ids

    async def main() -> tuple[list, list]:
        first = a.generate([5, 6, 7], params, "same")
        outs = [await first.__anext__()]
        duplicate = a.generate([1, 2], params, "same")  # nothing happens until it is iterated, as in vLLM
        with pytest.raises(ValueError, match=r"^Request id same already running\.$"):
            await duplicate.__anext__()
        outs += [o async for o in first]
        again = [o async for o in a.generate([5, 6, 7], params, "same")]
        await settled(a)
        return outs, again

    try:
        outs, again = asyncio.run(main())
        assert a.call(lambda llm: llm.metrics().finished_requests) == 2
    finally:
        a.shutdown()
    assert list(outs[-1].outputs[0].token_ids) == alone == list(again[-1].outputs[0].token_ids)


def test_a_request_id_is_free_again_as_soon_as_its_last_output_arrives(smollm):
    """The id of a finished request was released after its last output was delivered, so the caller reusing it at
    once was refused ("already running"); one a stop string ended (in the text, the engine dropping it a step later)
    met the engine's "already in use". Both are free by the time the caller hears of the end."""
    a = AsyncLLM(smollm)
    greedy = dict(max_tokens=20, temperature=0, ignore_eos=True)
    prompt = "The capital of France is"

    async def main() -> list[str | None]:
        text = [o async for o in a.generate(prompt, SamplingParams(**greedy), "id")][-1].outputs[0].text
        reasons = []
        for _ in range(6):
            params = SamplingParams(**greedy, stop=[text[4:8]])
            reasons.append([o async for o in a.generate(prompt, params, "id")][-1].outputs[0].finish_reason)
        await settled(a)
        return reasons

    try:
        assert asyncio.run(main()) == ["stop"] * 6
    finally:
        a.shutdown()


def test_a_consumer_leaving_at_the_finished_output_aborts_no_later_request_under_its_id():
    """vLLM's streaming example breaks out of `async for` at the finished output. The generator left there is closed
    later (when collected, by a task of the event loop), and its request id was aborted then: a request reusing the id
    at once, already running, was aborted in its place (finish_reason "abort" after a token or two)."""
    a = tiny_async(num_pages=128)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)

    async def main() -> list[str | None]:
        reasons = []
        for _ in range(4):
            async for out in a.generate([5, 6, 7], params, "same"):
                if out.finished:
                    reasons.append(out.outputs[0].finish_reason)
                    break
        await settled(a)
        return reasons

    try:
        assert asyncio.run(main()) == ["length"] * 4
    finally:
        a.shutdown()


def test_an_aborted_request_id_is_free_at_once_for_a_new_request():
    """As in vLLM, an id is free once abort() returns: a generate() reusing it at once was refused ("already running")
    until the engine's next step had delivered the abort. The new request runs to its end with its own outputs only;
    the old one's last output (finish_reason "abort") reaches the old generator alone, and that generator closed
    after the new request has started (its consumer gone) aborts nothing. Repeated: it depends on timing."""
    a = tiny_async(num_pages=128)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    alone = make_llm(num_pages=64).generate([[5, 6, 7]], params, use_tqdm=False)[0].token_ids

    async def main() -> list[tuple[list, list]]:
        runs = []
        for i in range(8):
            old = a.generate([1, 2, 3], LONG, "same")
            olds = [await old.__anext__()]
            await a.abort("same")
            new = a.generate([5, 6, 7], params, "same")
            news = [await new.__anext__()]
            if i % 2:
                await old.aclose()  # its consumer leaves now, the id running the new request
            else:
                olds += [o async for o in old]
            news += [o async for o in new]
            runs.append((olds, news))
        await settled(a)
        return runs

    try:
        runs = asyncio.run(main())
        finished = a.call(lambda llm: llm.metrics().finished_requests)
    finally:
        a.shutdown()
    assert finished == 16
    for i, (olds, news) in enumerate(runs):
        assert all(o.prompt_token_ids == [5, 6, 7] and o.request_id == "same" for o in news)
        assert [o.finished for o in news] == [False] * 11 + [True]
        assert news[-1].outputs[0].finish_reason == "length" and list(news[-1].outputs[0].token_ids) == alone
        assert all(o.prompt_token_ids == [1, 2, 3] for o in olds)
        if i % 2 == 0:
            assert olds[-1].finished and olds[-1].outputs[0].finish_reason == "abort"
            # the abort ended it long before LONG's 900 (how many tokens come first depends on the machine's load: a
            # loaded 2-core machine gave 14)
            assert len(olds[-1].outputs[0].token_ids) < 100


def test_n_choices_are_llm_generates_in_every_output_kind(smollm):
    """SamplingParams(n=3) in generate() fans out as vLLM's does: each output is the parent request's, `outputs` its
    three choices (CUMULATIVE: each one's text so far; DELTA: each one's new part; FINAL_ONLY: once, all finished),
    and the choices are those LLM.generate gives for the same seeded params (choice j seeded seed + j)."""
    prompt = "Name a colour:"
    base = dict(n=3, max_tokens=16, temperature=1.0, seed=11)
    ref = smollm.generate(prompt, SamplingParams(**base), use_tqdm=False)[0].outputs
    expected = [(c.text, list(c.token_ids), c.finish_reason) for c in ref]
    assert len({text for text, _, _ in expected}) > 1  # the choices differ
    a = AsyncLLM(smollm)

    async def run(kind: RequestOutputKind) -> list:
        params = SamplingParams(**base, output_kind=kind)
        return [o async for o in a.generate(prompt, params, f"fan-{kind.name}")]

    async def main() -> list[list]:
        got = [await run(k) for k in RequestOutputKind]  # one after another: batches of three, as LLM.generate's
        await settled(a)
        return got

    try:
        cumulative, delta, final = asyncio.run(main())
    finally:
        a.shutdown()
    for outs, name in ((cumulative, "CUMULATIVE"), (delta, "DELTA"), (final, "FINAL_ONLY")):
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
        assert {o.request_id for o in outs} == {f"fan-{name}"}
        assert all([c.index for c in o.outputs] == [0, 1, 2] for o in outs)
    assert len(final) == 1 and len(cumulative) > 3
    for last in (cumulative[-1], final[0]):
        assert [(c.text, list(c.token_ids), c.finish_reason) for c in last.outputs] == expected
    for j in range(3):
        texts = [o.outputs[j].text for o in cumulative]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
        parts = [o.outputs[j] for o in delta]
        joined = ("".join(c.text for c in parts), [t for c in parts for t in c.token_ids], parts[-1].finish_reason)
        assert joined == expected[j]


def test_aborting_or_leaving_an_n_choice_request_ends_every_choice_with_every_page_back():
    """abort(request_id) of an n=3 request ends its three choices (each finish_reason "abort"), its id and its
    children's ("j_<id>", vLLM's) free at once; a consumer cancelled or leaving after a `break` ends all three too.
    While one runs, its id and its children's are taken: a clash on any of them is refused. None runs on to its 900
    tokens, and every KV page comes back."""
    a = tiny_async(num_pages=256)
    fan = SamplingParams(n=3, max_tokens=900, ignore_eos=True, temperature=1.0, seed=5)
    short = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)

    async def main() -> dict:
        got: dict = {}
        aborted = a.generate([1, 2, 3], fan, "fam")
        first = await aborted.__anext__()
        for rid in ("fam", "0_fam", "2_fam"):
            with pytest.raises(ValueError, match=rf"^Request id {rid} already running\.$"):
                await a.generate([4], short, rid).__anext__()
        blocker = a.generate([4], short, "1_other")
        await blocker.__anext__()
        with pytest.raises(ValueError, match=r"^Request id 1_other already running\.$"):
            await a.generate([4], fan, "other").__anext__()
        got["blocker"] = [o async for o in blocker]
        await a.abort("fam")
        got["reused"] = [o async for o in a.generate([4], short, "1_fam")]  # a child's id, free at once
        got["aborted"] = [first] + [o async for o in aborted]

        await consumers_leaving(a, fan)
        await settled(a)
        again = SamplingParams(n=2, max_tokens=3, ignore_eos=True)
        for rid in ("fam", "cancelled", "left"):  # each parent's id is free once its children have ended
            got[rid] = [o async for o in a.generate([9], again, rid)]
        await settled(a)
        return got

    got, tokens, finished = run_and_count(a, main)
    last = got["aborted"][-1]
    assert last.finished and [c.finish_reason for c in last.outputs] == ["abort"] * 3 and last.request_id == "fam"
    assert not any(o.finished for o in got["aborted"][:-1])
    for name in ("blocker", "reused"):
        assert got[name][-1].outputs[0].finish_reason == "length"
    for rid in ("fam", "cancelled", "left"):
        assert [len(c.token_ids) for c in got[rid][-1].outputs] == [3, 3] and got[rid][-1].finished
    assert finished == 2 + 3 * 3 + 3 * 2 and tokens < 900


@pytest.mark.parametrize(
    ("prompt", "params", "error", "message"),
    [
        ("", SamplingParams(max_tokens=4), ValueError, "prompt is empty"),
        ([1, 2, 10**6], SamplingParams(max_tokens=4), ValueError, r"prompt token id 1000000 is outside the vocabulary"),
        ([1] * 100, SamplingParams(max_tokens=5000), ValueError, r"exceeds the model's context length"),
        ([1, 2], SamplingParams(max_tokens=4, n=2, seed=2**64 - 1), ValueError, r"seed must be a 64-bit"),
        ([1, 2], "greedy", ValueError, "sampling params must be a SamplingParams"),
        ({"text": "hi"}, SamplingParams(max_tokens=4), ValueError, "a prompt dict must be"),
    ],
    ids=["empty", "vocabulary", "too-long", "n-choice-seed", "not-params", "prompt-dict"],
)
def test_a_bad_request_raises_from_its_generator_and_harms_no_other(prompt, params, error, message):
    """A bad prompt or request raises from its generator (at its first iteration, as vLLM's: creating it does
    nothing), naming what is wrong; a request running beside it finishes with its own tokens, every page back."""
    a = tiny_async(num_pages=128, max_model_len=512)
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    alone = make_llm(num_pages=64).generate([[5, 6, 7]], greedy, use_tqdm=False)[0].token_ids

    async def main() -> list:
        running = a.generate([5, 6, 7], greedy, "good")
        outs = [await running.__anext__()]
        bad = a.generate(prompt, params, "bad")
        with pytest.raises(error, match=message):
            await bad.__anext__()
        outs += [o async for o in running]
        await settled(a)
        return outs

    try:
        outs = asyncio.run(main())
    finally:
        a.shutdown()
    assert outs[-1].outputs[0].finish_reason == "length" and list(outs[-1].outputs[0].token_ids) == alone


def test_shutdown_ends_open_generators_and_refuses_later_ones():
    """shutdown() ends the generate() calls still open with EngineDeadError (their requests aborted), refuses later
    ones with it, and shuts down the engine from_engine_args built; a second shutdown is a no-op."""
    a = tiny_async(num_pages=64)

    async def main() -> None:
        with pytest.raises(EngineDeadError, match="engine shut down"):
            async for _ in a.generate([1, 2, 3], LONG, "open"):
                await asyncio.to_thread(a.shutdown)
        with pytest.raises(EngineDeadError, match="engine is not running: stopped"):
            await a.generate([1, 2, 3], SamplingParams(max_tokens=2), "later").__anext__()

        # vLLM's health API, which servers poll: is_stopped, dead_error, check_health() raising it
        assert a.is_stopped and a.dead_error.stopped and "stopped" in str(a.dead_error)
        with pytest.raises(EngineDeadError, match="engine is not running: stopped"):
            await a.check_health()

    asyncio.run(main())
    assert not a.is_running and not a.errored
    assert a.llm.engine.reqs == {} and a.llm.metrics().kv_pages_free == 64
    with pytest.raises(RuntimeError, match="shut down"):
        a.llm.generate([[1, 2]], SamplingParams(max_tokens=2))
    a.shutdown()


def test_async_engine_args_take_llms_keywords_as_vllm_names_them():
    """AsyncEngineArgs takes what LLM() takes, vLLM's names or ours, by LLM()'s own mapping, checked at once as vLLM's
    dataclass is; its attributes can be changed before from_engine_args. AsyncLLMEngine is vLLM's other name."""
    vllm_kw = dict(
        model="dummy:tiny-llama",
        device="cpu",
        max_num_seqs=3,
        block_size=8,
        enable_prefix_caching=False,
        enforce_eager=True,
        max_model_len=256,
        disable_log_stats=True,
        enable_log_requests=True,
        generation_config="vllm",
    )
    args = AsyncEngineArgs(**vllm_kw)
    llm_kw = {k: v for k, v in vllm_kw.items() if k != "enable_log_requests"}
    assert args.create_engine_config() == engine_config(None, llm_kw)[0]
    config = args.create_engine_config()
    assert (config.max_running_requests, config.page_size, config.radix_cache, config.cuda_graph_max_bs) == (
        3,
        8,
        False,
        0,
    )
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_setting'"):
        AsyncEngineArgs(model="dummy:tiny-llama", no_such_setting=1)
    with pytest.raises(TypeError, match="AsyncEngineArgs has no gpu_memory_utilization=0.9 .vLLM's.: use kv_cache_gb"):
        AsyncEngineArgs(model="dummy:tiny-llama", gpu_memory_utilization=0.9)
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        AsyncEngineArgs(model="dummy:tiny-llama", block_size=0)
    with pytest.raises(TypeError, match="takes an AsyncEngineArgs"):
        AsyncLLM.from_engine_args({"model": "dummy:tiny-llama"})
    with pytest.raises(TypeError, match="start_engine_loop=True"):
        AsyncLLM.from_engine_args(args, start_engine_loop=False)
    assert AsyncLLMEngine is AsyncLLM
    args.max_num_seqs = 2
    a = AsyncLLMEngine.from_engine_args(args)
    try:
        assert a.llm.config.max_running_requests == 2 and a.llm.generation_config == "vllm"

        async def main() -> list:
            tokenizer = await a.get_tokenizer()
            ids = tokenizer.encode("hi")
            assert await a.check_health() is None and not a.is_stopped  # running: healthy
            return [o async for o in a.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=3), "p")]

        outs = asyncio.run(main())
        assert outs[-1].finished and len(outs[-1].outputs[0].token_ids) == 3 and a.is_running
    finally:
        a.shutdown()


def test_an_engine_crash_at_the_step_before_an_id_reuse_fails_the_new_request_too():
    """An add whose id the engine still holds (abort() freed it, the old request's abort queued before) steps the
    engine first. Where that step crashes the engine, the new request fails with EngineDeadError as every other
    open one does: it had been taken off the inbox and was in no stream table, so its generate() waited forever."""
    import threading

    a = tiny_async(num_pages=128)
    held, release = threading.Event(), threading.Event()

    def hold(llm) -> None:  # the engine thread waits here, so that the abort and the add arrive in one batch
        held.set()
        release.wait(10)

    def crash() -> None:
        raise RuntimeError("device lost")

    async def main() -> None:
        old = a.generate([1, 2, 3], LONG, "same")
        await old.__anext__()
        threading.Thread(target=a.call, args=(hold,), daemon=True).start()
        assert held.wait(10)
        await a.abort("same")
        new = asyncio.ensure_future(a.generate([5, 6, 7], SamplingParams(max_tokens=4), "same").__anext__())
        await asyncio.sleep(0.2)  # its add is queued behind the abort
        a.llm.step = crash  # the step before the add crashes the engine
        release.set()
        with pytest.raises(EngineDeadError, match="device lost"):
            await asyncio.wait_for(new, timeout=10)
        with pytest.raises(EngineDeadError):  # (after the outputs it had made)
            async for _ in old:
                pass

    try:
        asyncio.run(main())
    finally:
        del a.llm.step
        a.shutdown()


def test_n_choices_that_end_before_generate_reads_its_family_still_arrive():
    """_submit_choices returned the family's open children read after its lock was released: the engine thread could
    have ended some of them by then (released, gone from the family), and generate() then waited on fewer choices
    than it was sent (none here: it yielded nothing at all)."""
    import threading
    import time

    a = tiny_async(num_pages=128)
    real = a._lock

    class SlowRelease:  # the caller's thread pauses after leaving the lock until the engine has ended every child
        armed = False

        def __enter__(self):
            return real.__enter__()

        def __exit__(self, *exc):
            real.__exit__(*exc)
            if SlowRelease.armed and threading.current_thread() is threading.main_thread():
                SlowRelease.armed = False
                for _ in range(200):
                    if "quick" not in a._open:
                        break
                    time.sleep(0.05)

    a._lock = SlowRelease()

    async def main() -> list:
        SlowRelease.armed = True
        params = SamplingParams(n=3, max_tokens=1, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
        return [o async for o in a.generate([1, 2, 3], params, "quick")]

    try:
        outs = asyncio.run(main())
    finally:
        a._lock = real
        a.shutdown()
    assert len(outs) == 1 and outs[0].finished and [len(c.token_ids) for c in outs[0].outputs] == [1, 1, 1]
