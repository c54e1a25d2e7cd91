"""Per-layer attention of the saturated replay's mixed steps, FlashInfer's kernel choices side by side (GPU; issue #15).

In issue #15's replays the longest inter-token gaps are mixed steps that carry a full 1,024-token chunk of a long
prompt beside every running request's decode row. This times one layer's attention for such batches as the engine
builds them (decode rows first, then chunks with KV before them, then fresh prompts; page size 16, scattered pages),
through the engine's backend (kernels/attention/flashinfer_backend.py) with its switches set per variant:
- `one pass fa2`: decode rows and chunks in one paged fa2 prefill pass (the engine before this benchmark);
- `split, fa2 chunks` / `split, fa3 chunks`: decode rows through the decode kernel, chunks through the paged prefill
  kernel's fa2 or fa3 build whatever their length;
- `engine`: the defaults (decode rows split off only at SPLIT_MIN_GROUP query heads per KV head or more, fa3 for the
  chunks only when each brings CHUNK_FA3_MIN_TOKENS or more);
- `decode only`: the decode rows alone through the decode wrapper, what the step would cost without the chunk.
Fresh prompts go through the ragged fa3 kernel in every variant. Shapes: Qwen3-0.6B on one GPU (16 q heads, 8 KV
heads), one rank of Qwen3-32B at TP=4 (16 q heads, 2 KV heads) and Llama-3.1-8B on one GPU (32, 8; its group of 4
split off since the twenty-second session), head_dim 128, bf16. Each output is checked against `one pass fa2`.
Median of 20 CUDA-event timed calls after one untimed call; host plan time too.
Usage there: python benchmarks/mixed_attention.py OUT.json
"""

from __future__ import annotations

import json
import random
import sys
from functools import partial

import torch
from attention_batches import backend_timing, paged_batch, timed

from kernels.attention import flashinfer_backend as fib
from kernels.attention.base import AttnMeta

D, PS = 128, 16
dev = torch.device("cuda")
SWITCHES = ("SPLIT_DECODE_ROWS", "SPLIT_MIN_GROUP", "CHUNK_FA3_MIN_TOKENS")
DEFAULTS = tuple(getattr(fib, name) for name in SWITCHES)
VARIANTS = {  # name: the three switches' values
    "one pass fa2": (False, 1, 10**9),
    "split, fa2 chunks": (True, 1, 10**9),
    "split, fa3 chunks": (True, 1, 0),
    "engine": DEFAULTS,
}


def layouts() -> list[tuple[str, int, int, list[tuple[int, int]]]]:
    """(name, q heads, KV heads, [(q_len, kv_len)] with decode rows first)."""
    rng = random.Random(0)

    def decode(n: int, mean: int) -> list[tuple[int, int]]:
        return [(1, rng.randint(mean // 3, mean * 5 // 3)) for _ in range(n)]

    out = []
    shapes = (("0.6B", 16, 8, 200, 3500), ("32B/TP4", 16, 2, 130, 3400), ("Llama-8B", 32, 8, 130, 3400))
    for model, h, kvh, rows, ctx in shapes:
        d = decode(rows, ctx)
        for prefix in (0, 3000, 10000):
            out.append((f"{model}: {rows} decode + 1024 chunk, prefix {prefix}", h, kvh, d + [(1024, 1024 + prefix)]))
        out.append((f"{model}: {rows} decode + 3 x 300-token prompts", h, kvh, d + [(300, 300)] * 3))
        for new in (16, 64, 128, 256):  # cached prefixes (chat turns): does fa3 pay for short chunks?
            out.append((f"{model}: {rows} decode + 16 x {new} after 3000", h, kvh, d + [(new, 3000 + new)] * 16))
    return out


def main() -> None:
    import flashinfer

    results = []
    for name, H, KVH, reqs in layouts():
        torch.manual_seed(0)
        pool, meta = paged_batch(reqs, KVH, D, PS, dev)
        q_lens, kv_lens, tables, out_slots = meta.q_lens, meta.kv_lens, meta.page_tables, meta.out_slots
        T = sum(q_lens)
        q = torch.randn(T, H, D, dtype=torch.bfloat16, device=dev)
        k = pool.k[0].view(-1, KVH, D)[out_slots].clone()
        v = pool.v[0].view(-1, KVH, D)[out_slots].clone()
        row: dict[str, object] = {"layout": name, "tokens": T, "kv_tokens": sum(kv_lens)}
        ref = None
        for label, values in VARIANTS.items():
            for switch, value in zip(SWITCHES, values):
                setattr(fib, switch, value)
            be = fib.FlashInferBackend(pool, H, KVH, D, dev)
            timing, o = backend_timing(be, meta, q, k, v)
            ref = o if ref is None else ref
            row[label] = {**timing, "rel_err": float((o - ref).norm() / ref.norm())}
        for switch, value in zip(SWITCHES, DEFAULTS):
            setattr(fib, switch, value)
        nd = fib.leading_decode_rows(meta)
        dmeta = AttnMeta(True, q_lens[:nd], kv_lens[:nd], tables[:nd], out_slots[:nd])
        dec = be.decode[0]
        be._plan(dec, dmeta, be.split_kv(dmeta.kv_lens))
        row["decode only"] = {"us": timed(partial(dec.run, q[:nd], (pool.k[0], pool.v[0])))}
        results.append(row)
        print(json.dumps(row), flush=True)
    json.dump(
        {"gpu": torch.cuda.get_device_name(), "flashinfer": flashinfer.__version__, "rows": results},
        open(sys.argv[1], "w"),
        indent=1,
    )
    for r in results:
        print(f"{r['layout']} ({r['tokens']} tokens, {r['kv_tokens']} KV):")
        for label, e in r.items():
            if isinstance(e, dict):
                extra = f"  plan {e['plan_ms']:5.2f} ms  rel err {e['rel_err']:.1e}" if "plan_ms" in e else ""
                print(f"  {label:<18} {e['us']:8.1f} us{extra}")


if __name__ == "__main__":
    main()
