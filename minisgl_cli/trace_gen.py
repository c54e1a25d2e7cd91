"""Small synthetic traces in the Qwen/Bailian and Mooncake formats (the samples in traces/).

Multi-turn chats over a few shared system prompts: a follow-up turn repeats its parent's full blocks (parent
prompt + its answer + a new user message), so the traces have real prefix sharing, like the published ones.
    python -m minisgl_cli.trace_gen traces/    (deterministic: the same files every time)
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Shape:
    block: int
    requests: int
    rate: float  # arrivals per second (Poisson)
    system: tuple[int, int]  # blocks of each shared system prompt
    user: tuple[int, int]  # tokens of a new user message
    output: tuple[int, int]
    max_input: int


QWEN = Shape(block=16, requests=64, rate=4.0, system=(2, 6), user=(20, 200), output=(8, 64), max_input=1200)
# The online run of the Qwen3-32B TP=4 issue: 1000 requests, longer shared system prompts and answers.
QWEN_1K = Shape(block=16, requests=1000, rate=8.0, system=(16, 128), user=(50, 1500), output=(16, 768), max_input=24000)
MOONCAKE = Shape(block=512, requests=48, rate=2.0, system=(1, 3), user=(300, 4000), output=(16, 512), max_input=24000)


def generate(shape: Shape, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    next_id = 0

    def fresh(n: int) -> list[int]:
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))

    systems = [fresh(rng.randint(*shape.system)) for _ in range(3)]
    chats: list[dict] = []  # open conversations: their last request
    out, t = [], 0.0
    for chat_id in range(shape.requests):
        t += rng.expovariate(shape.rate)
        parent = rng.choice(chats) if chats and rng.random() < 0.45 else None
        if parent is None:
            prefix = list(rng.choice(systems))
            length = len(prefix) * shape.block + rng.randint(*shape.user)
            turn, parent_id = 1, -1
        else:
            full = parent["input_length"] // shape.block
            prefix = parent["hash_ids"][:full]
            length = parent["input_length"] + parent["output_length"] + rng.randint(*shape.user)
            turn, parent_id = parent["turn"] + 1, parent["chat_id"]
            chats.remove(parent)
        if length > shape.max_input:
            continue
        blocks = -(-length // shape.block)
        rec = {
            "chat_id": chat_id,
            "parent_chat_id": parent_id,
            "timestamp": round(t, 3),
            "input_length": length,
            "output_length": rng.randint(*shape.output),
            "type": rng.choice(["text"] * 6 + ["search", "file"]),
            "turn": turn,
            "hash_ids": prefix + fresh(blocks - len(prefix)),
        }
        chats.append(rec)
        out.append(rec)
    return out


def to_mooncake(records: list[dict]) -> list[dict]:
    return [
        {
            "timestamp": round(r["timestamp"] * 1000),
            "input_length": r["input_length"],
            "output_length": r["output_length"],
            "hash_ids": r["hash_ids"],
        }
        for r in records
    ]


def write_samples(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        folder / "qwen_sample.jsonl": generate(QWEN, seed=0),
        folder / "mooncake_sample.jsonl": to_mooncake(generate(MOONCAKE, seed=1)),
        folder / "qwen_1000.jsonl": generate(QWEN_1K, seed=2),
    }
    for path, records in files.items():
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return list(files)


if __name__ == "__main__":
    for p in write_samples(Path(sys.argv[1] if len(sys.argv) > 1 else "traces")):
        print(p)
