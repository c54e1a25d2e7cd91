"""Does splitting a decode step's batch in two halves on two CUDA streams hide the GEMMs behind the attention?
(issue #17; GPU only)

    source .whl/use-bundle.sh && python benchmarks/two_stream_overlap.py --out $OUT/two_stream.json

A decode step of Qwen3-0.6B's shapes, 28 layers with their own weights and their own paged KV (context lengths
as the offline workload mid-run, pages scattered), captured in one CUDA graph:
- `one`: the whole batch on one stream (today's engine): RMSNorm, qkv, FlashInfer tensor-core decode attention,
  o, RMSNorm, gate_up, SiLU, down per layer;
- `two`: the batch cut in two halves, each with its own attention plan, each half's layers on its own stream
  (forked and joined inside the graph), so one half's latency-bound GEMMs can run while the other half's
  bandwidth-bound attention streams KV;
- `two-prio`: the same with the second stream at a higher priority;
- `two-pipe`: the two halves offset by half a layer and held there by events: each half's attention waits for the
  other half's attention of the layer before it, so the attentions run one at a time, each beside the other half's
  GEMMs and small kernels (a two-batch pipeline; fifty-eighth session).
Prints ms per step and the ratio to `one`; checks both give the same output. (The modes ran one after the other
until the twenty-eighth session; now in turn, through layer_chain.interleaved_step_ms.)
H100 (benchmarks/results/throughput_h100/two_stream.txt): `two` 1.016-1.017x the time of `one` at 64-256 rows,
`two-prio` 1.005-1.043x: not adopted.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from layer_chain import (  # this script's folder is on sys.path when run as a script
    DIM,
    EPS,
    HEADS,
    HIDDEN,
    DecodeBatch,
    Q,
    interleaved_step_ms,
    layer_weights,
)

from kernels import triton_ops


def run_batch(batch: int, weights: list[dict], dev: torch.device) -> dict:
    bf = torch.bfloat16

    def rnd(*shape: int, scale: float = 0.02) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=bf) * scale

    db = DecodeBatch.draw(batch, torch.Generator().manual_seed(batch), dev)
    kv, lens = db.kv, db.lens
    full = db.wrapper(dev)
    halves = (db.wrapper(dev, 0, batch // 2), db.wrapper(dev, batch // 2, batch))

    def layer(i: int, x: torch.Tensor, res: torch.Tensor, attn, wait=None, done=None) -> torch.Tensor:
        """Layer i; the current stream waits for event `wait` before the attention and records `done` after it."""
        w = weights[i]
        h = triton_ops.rmsnorm(x, w["n1"], EPS, res)
        qkv = F.linear(h, w["qkv"])
        q = qkv[:, :Q].reshape(-1, HEADS, DIM)
        if wait is not None:
            torch.cuda.current_stream().wait_event(wait)
        o = attn.run(q, kv[i]).reshape(-1, Q)
        if done is not None:
            done.record()
        h = triton_ops.rmsnorm(F.linear(o, w["o"]), w["n2"], EPS, res)
        return F.linear(triton_ops.silu_and_mul(F.linear(h, w["gu"])), w["down"])

    def layers(x: torch.Tensor, res: torch.Tensor, attn) -> torch.Tensor:
        for i in range(len(weights)):
            x = layer(i, x, res, attn)
        return x

    def pipelined(x: torch.Tensor, res: torch.Tensor, side: torch.cuda.Stream) -> torch.Tensor:
        """Half A on the current stream, half B on `side`; attention order A0 B0 A1 B1 ... enforced by events."""
        a_done = [torch.cuda.Event() for _ in weights]
        b_done = [torch.cuda.Event() for _ in weights]
        side.wait_stream(torch.cuda.current_stream())
        xa, ra, xb, rb = x[:h], res[:h], x[h:], res[h:]
        for i in range(len(weights)):
            xa = layer(i, xa, ra, halves[0], b_done[i - 1] if i else None, a_done[i])
            with torch.cuda.stream(side):
                xb = layer(i, xb, rb, halves[1], a_done[i], b_done[i])
        torch.cuda.current_stream().wait_stream(side)
        return torch.cat([xa, xb])

    x0, r0 = rnd(batch, HIDDEN, scale=1.0), rnd(batch, HIDDEN, scale=1.0)
    h = batch // 2
    s2 = {"two": torch.cuda.Stream(), "two-prio": torch.cuda.Stream(priority=-1), "two-pipe": torch.cuda.Stream()}

    def step(mode: str, x: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
        if mode == "one":
            return layers(x, res, full)
        side = s2[mode]
        if mode == "two-pipe":
            return pipelined(x, res, side)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            yb = layers(x[h:], res[h:], halves[1])
        ya = layers(x[:h], res[:h], halves[0])
        torch.cuda.current_stream().wait_stream(side)
        return torch.cat([ya, yb])

    ms, outs = interleaved_step_ms(step, ("one", "two", "two-prio", "two-pipe"), x0, r0, rounds=12, skip=2)
    err = {m: ((out - outs["one"]).norm() / outs["one"].norm()).item() for m, out in outs.items()}
    res_row = dict(batch=batch, kv_tokens=int(lens.sum()), ms=ms, rel_err=err)
    print(
        f"batch {batch:4} ({int(lens.sum())} KV tokens): "
        + "  ".join(f"{m} {v:.3f} ms ({v / ms['one']:.3f}x)" for m, v in ms.items())
        + "  err "
        + " ".join(f"{v:.1e}" for v in err.values()),
        flush=True,
    )
    return res_row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="64,128,256")
    ap.add_argument("--out", default="two_stream.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    weights = layer_weights(dev)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        rows.append(run_batch(batch, weights, dev))
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
