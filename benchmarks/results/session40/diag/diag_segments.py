"""Session 40 diagnostics: which live blocks keep a dropped engine's segments reserved through empty_cache().

Loaded as a pytest plugin (`-p diag_segments`). Records allocation stacks from the start; inside every CUDA engine's
budget it collects, empties the cache and, when over 8 GiB stays reserved above what is allocated, prints each
segment that holds it: its size, pool, what is allocated in it and the Python frames that allocated that."""

import gc

import torch


def pytest_configure(config):
    torch.cuda.memory._record_memory_history(max_entries=500_000, stacks="python")
    import engine.engine as E

    orig = E.Engine._pages_from_budget

    def wrapped(self, mc):
        if self.device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
            alloc, res = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
            print(f"\n[budget] allocated {alloc / 2**30:.2f} GiB reserved {res / 2**30:.2f} GiB", flush=True)
            if res - alloc > 8 * 2**30:
                report()
        return orig(self, mc)

    E.Engine._pages_from_budget = wrapped


def _frames(block):
    fr = block.get("frames") or []
    keep = [
        f
        for f in fr
        if any(s in f.get("filename", "") for s in ("engine/", "kvcache/", "kernels/", "tests/", "flashinfer"))
    ]
    return [
        f"{f['filename'].split('/')[-2]}/{f['filename'].split('/')[-1]}:{f['line']} {f['name']}"
        for f in (keep or fr)[:6]
    ]


def report():
    snap = torch.cuda.memory._snapshot()
    segs = snap["segments"]
    print(f"[segments] {len(segs)} segments, {sum(s['total_size'] for s in segs) / 2**30:.2f} GiB", flush=True)
    by_kind = {}
    for s in segs:
        key = (s.get("segment_pool_id"), s.get("stream"), s.get("segment_type"))
        n, tot, al = by_kind.get(key, (0, 0, 0))
        by_kind[key] = (n + 1, tot + s["total_size"], al + s["allocated_size"])
    for k, (n, tot, al) in sorted(by_kind.items(), key=lambda x: -x[1][1]):
        print(
            f"[segments] pool {k[0]} stream {k[1]} {k[2]}: {n} segments {tot / 2**30:.2f} GiB, "
            f"allocated {al / 2**30:.3f} GiB",
            flush=True,
        )
    big = sorted(segs, key=lambda s: -s["total_size"])
    for s in big[:12]:
        active = [b for b in s["blocks"] if b["state"] == "active_allocated"]
        print(
            f"[segment] {s['total_size'] / 2**20:.0f} MiB pool {s.get('segment_pool_id')} allocated "
            f"{s['allocated_size'] / 2**20:.1f} MiB in {len(active)} blocks",
            flush=True,
        )
        for b in active[:3]:
            print(f"    {b['size'] / 2**20:.2f} MiB <- {_frames(b)}", flush=True)
    try:
        torch.cuda.memory._dump_snapshot("/tmp/diag_snapshot.pickle")
    except Exception as e:  # noqa: BLE001
        print("dump failed", e)
