"""Would a prefill run beside a decode step, on a second CUDA stream, hide under it? (issue #17; GPU only)

    source .whl/use-bundle.sh && python benchmarks/prefill_decode_overlap.py --out $OUT/prefill_decode_overlap.json

bench-offline's prefill (9 steps of 16,384 tokens, 0.34 s of a 6.8 s run on an H100) is GEMM-bound, its decode steps
read KV: the two use different parts of the GPU. Qwen3-0.6B's shapes, 28 layers with their own weights, in CUDA
graphs:
- `decode`: one decode step of B rows (context lengths as the offline workload mid-run, pages scattered): RMSNorm,
  qkv, FlashInfer's tensor-core decode, o, RMSNorm, gate_up, SiLU, down per layer;
- `prefill`: one prefill step of N fresh prompt tokens (prompts of the workload's lengths): the same layers at N rows,
  the attention through FlashInfer's fa3 ragged kernel;
- `one stream`: the two one after the other (what a step that carries both costs today, less its shared launches);
- `two streams`: the prefill on a second stream forked and joined inside the graph, beside the decode.
Prints ms for each and the share of the shorter one that the two streams hide.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from layer_chain import (  # this script's folder is on sys.path when run as a script
    DIM,
    EPS,
    HEADS,
    HIDDEN,
    KV,
    KV_HEADS,
    DecodeBatch,
    Q,
    layer_weights,
)

from kernels import triton_ops


def layers(x: torch.Tensor, res: torch.Tensor, weights: list[dict], attend: Callable) -> torch.Tensor:
    for i, w in enumerate(weights):
        h = triton_ops.rmsnorm(x, w["n1"], EPS, res)
        qkv = F.linear(h, w["qkv"])
        q = qkv[:, :Q].reshape(-1, HEADS, DIM)
        k = qkv[:, Q : Q + KV].reshape(-1, KV_HEADS, DIM)
        v = qkv[:, Q + KV :].reshape(-1, KV_HEADS, DIM)
        o = attend(i, q, k, v).reshape(-1, Q)
        h = triton_ops.rmsnorm(F.linear(o, w["o"]), w["n2"], EPS, res)
        x = F.linear(triton_ops.silu_and_mul(F.linear(h, w["gu"])), w["down"])
    return x


def graph_ms(fn: Callable[[], object], reps: int = 12) -> float:
    """Median ms of a CUDA-graph replay of fn (eager calls, said so, if fn cannot be captured)."""
    fn()  # compile / plan-time work outside the graph
    torch.cuda.synchronize()
    run: Callable[[], object] = fn
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    except RuntimeError as e:
        print(f"  (not captured, timed eagerly: {str(e)[:120]})")
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times[2:])


def main() -> None:
    import flashinfer

    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="32,128,256")
    ap.add_argument("--prefill-tokens", default="4096,16384")
    ap.add_argument("--out", default="prefill_decode_overlap.json")
    args = ap.parse_args()
    dev, bf = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    weights = layer_weights(dev)
    g = torch.Generator().manual_seed(0)
    rows = []
    for batch in map(int, args.batches.split(",")):
        db = DecodeBatch.draw(batch, g, dev)
        kv, lens, dw = db.kv, db.lens, db.wrapper(dev)
        xd, rd = torch.randn(batch, HIDDEN, device=dev, dtype=bf), torch.randn(batch, HIDDEN, device=dev, dtype=bf)

        def decode(xd=xd, rd=rd, dw=dw, kv=kv) -> torch.Tensor:
            return layers(xd, rd.clone(), weights, lambda i, q, k, v: dw.run(q, kv[i]))

        for tokens in map(int, args.prefill_tokens.split(",")):
            prompt_lens: list[int] = []
            while sum(prompt_lens) < tokens:  # the workload's prompt lengths, the last one cut to fit
                prompt_lens.append(min(int(torch.randint(100, 1025, (1,), generator=g)), tokens - sum(prompt_lens)))
            qo = torch.zeros(len(prompt_lens) + 1, dtype=torch.int32)
            qo[1:] = torch.tensor(prompt_lens, dtype=torch.int32).cumsum(0)
            pw = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
                torch.zeros(256 * 2**20, dtype=torch.uint8, device=dev), "NHD", backend="fa3"
            )
            pw.plan(qo, qo, HEADS, KV_HEADS, DIM, causal=True, q_data_type=bf, sm_scale=DIM**-0.5)
            xp, rp = (
                torch.randn(tokens, HIDDEN, device=dev, dtype=bf),
                torch.randn(tokens, HIDDEN, device=dev, dtype=bf),
            )

            def prefill(xp=xp, rp=rp, pw=pw) -> torch.Tensor:
                return layers(xp, rp.clone(), weights, lambda i, q, k, v: pw.run(q, k, v))

            side = torch.cuda.Stream()

            def both_one() -> None:
                decode()
                prefill()

            def both_two(side=side) -> None:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    prefill()
                decode()
                torch.cuda.current_stream().wait_stream(side)

            cases: list[tuple[str, Callable[[], object]]] = [
                ("decode", decode),
                ("prefill", prefill),
                ("one stream", both_one),
                ("two streams", both_two),
            ]
            ms = {name: graph_ms(fn) for name, fn in cases}
            hidden = (ms["one stream"] - ms["two streams"]) / min(ms["decode"], ms["prefill"])
            row = dict(batch=batch, kv_tokens=int(lens.sum()), prefill_tokens=tokens, ms=ms, hidden_share=hidden)
            rows.append(row)
            print(
                f"decode {batch:3} rows ({row['kv_tokens']:7,} KV tokens) + prefill {tokens:6,} tokens: "
                + "  ".join(f"{name} {t:7.3f} ms" for name, t in ms.items())
                + f"  two streams hide {hidden:.0%} of the shorter",
                flush=True,
            )
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
