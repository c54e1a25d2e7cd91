"""vLLM's async API (engine.async_llm.AsyncLLM) on a GPU, with CUDA graphs and overlap: n choices streamed as one
request, the three output kinds of a greedy request joining to the same text and tokens, abort-then-reuse of an id,
every KV page back at the end. Prints one line per check and exits 1 if any fails (the CPU tests are
tests/test_async_llm_api.py; this is the same path on the engine's GPU defaults).

    python benchmarks/gpu_async_check.py [--model dummy:Qwen3-0.6B]
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from engine.async_llm import AsyncEngineArgs, AsyncLLM
from engine.sampling_params import RequestOutputKind, SamplingParams

PROMPT = [11, 22, 33, 44, 55, 66, 77, 88]


async def checks(a: AsyncLLM) -> list[tuple[str, bool, str]]:
    found: list[tuple[str, bool, str]] = []
    sampled = SamplingParams(max_tokens=48, temperature=0.8, seed=5, n=3, ignore_eos=True)
    outs = [o async for o in a.generate(PROMPT, sampled, "fan")]
    last = outs[-1]
    lens = [len(c.token_ids) for c in last.outputs]
    distinct = len({tuple(c.token_ids) for c in last.outputs})
    found.append(("n=3 streamed as one request", last.finished and lens == [48] * 3 and distinct == 3, f"{lens}"))

    texts: dict[RequestOutputKind, str] = {}
    tokens: dict[RequestOutputKind, list[int]] = {}
    for kind in RequestOutputKind:
        greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, output_kind=kind)
        got = [o async for o in a.generate(PROMPT, greedy, f"greedy-{kind.name}")]
        if kind == RequestOutputKind.DELTA:
            texts[kind] = "".join(o.outputs[0].text for o in got)
            tokens[kind] = [t for o in got for t in o.outputs[0].token_ids]
        else:
            texts[kind], tokens[kind] = got[-1].outputs[0].text, list(got[-1].outputs[0].token_ids)
    same = len(set(texts.values())) == 1 and len({tuple(t) for t in tokens.values()}) == 1
    found.append(
        ("CUMULATIVE, DELTA, FINAL_ONLY join alike", same, f"{len(tokens[RequestOutputKind.CUMULATIVE])} tokens")
    )

    long = SamplingParams(max_tokens=2000, temperature=0.0, ignore_eos=True)
    agen = a.generate(PROMPT, long, "reused")
    first = await agen.__anext__()
    await a.abort("reused")
    short = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    again = [o async for o in a.generate(PROMPT, short, "reused")]
    rest = [o async for o in agen]
    ok = again[-1].outputs[0].finish_reason == "length" and len(again[-1].outputs[0].token_ids) == 8
    ok = ok and bool(rest) and rest[-1].outputs[0].finish_reason == "abort" and first is not None
    found.append(("abort, then the id reused at once", ok, f"old ended {rest[-1].outputs[0].finish_reason!r}"))

    m = await asyncio.to_thread(a.call, lambda llm: llm.metrics())
    back = m.running == m.waiting == m.kv_pages_in_use == 0 and m.kv_pages_free + m.kv_pages_cached == m.kv_pages_total
    found.append(
        ("every KV page back", back, f"in use {m.kv_pages_in_use}, free {m.kv_pages_free}, cached {m.kv_pages_cached}")
    )
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="dummy:Qwen3-0.6B")
    args = ap.parse_args()
    a = AsyncLLM.from_engine_args(AsyncEngineArgs(model=args.model))
    try:
        results = asyncio.run(checks(a))
    finally:
        a.shutdown()
    for name, ok, detail in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
