"""The benchmarks' workloads: nano-vllm's random prompts, or real prompts from a local dataset file, for
bench-offline (`Workload`) and bench-serve (`ServeWorkload`, which adds shared-prefix groups and prompts sent as
text)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

# nano-vllm / mini-sglang draw prompt ids with randint(0, 10000); the range is part of the published workload.
PUBLISHED_MAX_ID = 10000
TEXT_COLUMNS = ("prompt", "text", "question", "instruction", "input", "content")


@dataclass(slots=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]
    source: str  # "random" or the dataset path
    folded_ids: int = 0  # prompt ids >= vocab that were folded into the vocabulary (tiny models)
    truncated: int = 0  # dataset prompts cut to fit the context
    repeated: int = 0  # requests given a dataset prompt again: the file holds fewer prompts than requests asked for
    # a dataset's prompts as text, in request order; None where a prompt was cut to fit (only its ids were kept)
    texts: list[str | None] | None = None
    meta: dict = field(default_factory=dict)

    @property
    def num_seqs(self) -> int:
        return len(self.prompts)

    @property
    def input_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


def parse_range(text: str, name: str) -> tuple[int, int]:
    """'A:B' (inclusive) or a single 'N'; a clear error names the flag."""
    parts = text.split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (0, -1)
    except ValueError:
        raise ValueError(f"{name} must be A:B or N with integers (got {text!r})") from None
    if len(parts) > 2 or lo < 1 or hi < lo:
        raise ValueError(f"{name} must be A:B with 1 <= A <= B (got {text!r})")
    return lo, hi


def random_workload(
    num_seqs: int = 256,
    input_len: tuple[int, int] = (100, 1024),
    output_len: tuple[int, int] = (100, 1024),
    seed: int = 0,
    vocab_size: int | None = None,
) -> Workload:
    """nano-vllm's bench.py, drawn in its order so the defaults ask for exactly 133,966 output tokens.

    Ids are always drawn from [0, 10000] so the lengths (and the random stream) stay those of the published
    workload for every model; a model with a smaller vocabulary gets each id folded in as `id % vocab_size`."""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, PUBLISHED_MAX_ID) for _ in range(rng.randint(*input_len))] for _ in range(num_seqs)]
    output_lens = [rng.randint(*output_len) for _ in range(num_seqs)]
    folded = 0
    if vocab_size is not None and vocab_size <= PUBLISHED_MAX_ID:
        folded = sum(t >= vocab_size for p in prompts for t in p)
        prompts = [[t % vocab_size for t in p] for p in prompts]
    return Workload(prompts, output_lens, "random", folded_ids=folded)


def warmup_like(workload: Workload, vocab_size: int, seed: int = 12345) -> Workload:
    """Other random prompts of the same lengths as `workload`'s, up to 8 output tokens each. Warming up on these
    runs the timed run's prefill and mixed-step shapes first (their memory, kernels and GEMM plans), with no prefix
    in common: after 4 short prompts instead, the first timed run was 1.5-2.9% slower than the next on an H100, with
    3 more device allocations (benchmarks/offline_wall.py --warmup small/shapes)."""
    rng = random.Random(seed)
    hi = min(vocab_size, PUBLISHED_MAX_ID + 1)
    prompts = [[rng.randrange(hi) for _ in p] for p in workload.prompts]
    # Staggered lengths (8, 9, 10, ...): requests finish one step apart, so decode runs at every batch size the timed
    # run's tail shrinks through (with all at 8, only the full batch was warmed: a first timed run 1.9x slower on CPU).
    return Workload(prompts, [min(8 + i, n) for i, n in enumerate(workload.output_lens)], "warm-up")


@contextlib.contextmanager
def no_dataset_bars(hidden: bool) -> Iterator[None]:
    """datasets' own progress bars (its "Generating train split" as it reads a file the first time) off while a
    command under --quiet reads a dataset (`hidden`), and back as they were after. datasets is imported only then:
    a run without a dataset never needs it (the GPU machine's bundle has none)."""
    if not hidden:
        yield
        return
    import datasets

    was = datasets.is_progress_bar_enabled()
    if was:
        datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was:
            datasets.enable_progress_bars()


def read_dataset_prompts(path: Path, limit: int) -> list[str]:
    """The first `limit` prompts of a local JSON/JSONL/Parquet file: the first user turn of ShareGPT
    `conversations`, or a text column."""
    from datasets import load_dataset

    if not path.is_file():
        raise ValueError(f"dataset {path} is not a file")
    if path.stat().st_size < 64 and not path.read_bytes().strip():  # datasets' error for it had no words
        raise ValueError(f"dataset {path} is empty")
    kind = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}.get(path.suffix.lower())
    if kind is None:
        raise ValueError(f"dataset {path}: use a .json, .jsonl or .parquet file")
    try:
        ds = load_dataset(kind, data_files=str(path), split="train")
    except Exception as e:
        root: BaseException = e  # datasets wraps the parser's error in "An error occurred while generating ..."
        while root.__cause__ is not None or root.__context__ is not None:
            root = root.__cause__ or root.__context__  # type: ignore[assignment]
        why = (str(e) or type(e).__name__) if root is e else f"{e}: {type(root).__name__}: {root}"
        hint = " (expected JSON lines, or a JSON list, of objects)" if kind == "json" else ""
        raise ValueError(f"cannot read dataset {path}: {why}{hint}") from e

    def as_text(value: object, what: str) -> str:
        # str() of a number or a list made prompts of "5" or "[1, 2]" (a JSON list of numbers is read as a column)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"dataset {path}: {what} must be text, got {type(value).__name__} {str(value)[:40]!r}")
        return value or ""

    if "conversations" in ds.column_names:

        def first_turn(conv) -> str:
            if conv is not None and not isinstance(conv, list):
                raise ValueError(
                    f"dataset {path}: 'conversations' must be a list of turns ({{'from' or 'role', 'value' or "
                    f"'content'}}), got {type(conv).__name__} {str(conv)[:40]!r}"
                )
            for turn in conv or []:
                if not isinstance(turn, dict):
                    raise ValueError(f"dataset {path}: a 'conversations' turn must be an object, got {turn!r:.40}")
                role = turn.get("from", turn.get("role"))
                if role in ("human", "user"):
                    return as_text(turn.get("value", turn.get("content")), "a user turn's 'value' or 'content'")
            return ""

        def get(row: dict) -> str:
            return first_turn(row["conversations"])
    else:
        col = next((c for c in TEXT_COLUMNS if c in ds.column_names), None)
        if col is None:
            raise ValueError(
                f"dataset {path} has no 'conversations' or text column "
                f"({', '.join(TEXT_COLUMNS)}); its columns: {', '.join(ds.column_names)}"
            )

        def get(row: dict) -> str:
            return as_text(row[col], repr(col))

    prompts: list[str] = []
    for row in ds:
        if text := get(row).strip():
            prompts.append(text)
            if len(prompts) == limit:
                break
    if not prompts:
        raise ValueError(f"dataset {path} holds no non-empty prompts")
    return prompts


def dataset_workload(
    path: Path,
    encode: Callable[[str], list[int]],
    num_seqs: int,
    output_len: tuple[int, int],
    seed: int,
    max_model_len: int,
    skip: int = 0,
) -> Workload:
    """Real prompts (tokenized with the model's tokenizer) with output lengths drawn from `output_len`;
    a prompt too long for the context keeps its first tokens. The requests take the file's prompts from the
    `skip`-th on (a bench-serve sweep gives each load prompts of its own); past the file's last prompt they start
    again from its first, as vLLM's benchmarks oversample (`repeated` counts those requests)."""
    read = read_dataset_prompts(path, skip + num_seqs)
    rng = random.Random(seed)
    output_lens = [rng.randint(*output_len) for _ in range(num_seqs)]
    encoded: dict[int, list[int]] = {}
    prompts: list[list[int]] = []
    texts: list[str | None] = []
    for j, out in enumerate(output_lens):
        k = (skip + j) % len(read)
        if k not in encoded:
            encoded[k] = encode(read[k])
        room = max(max_model_len - out, 1)
        cut = len(encoded[k]) > room
        prompts.append(encoded[k][:room])
        texts.append(None if cut else read[k])
    truncated = sum(t is None for t in texts)
    repeated = max(0, min(num_seqs, skip + num_seqs - len(read)))
    return Workload(prompts, output_lens, str(path), truncated=truncated, repeated=repeated, texts=texts)


@dataclass(slots=True)
class ServeWorkload:
    """bench-serve's requests: token ids for every prompt (their lengths are the input lengths) and, when prompts go
    out as text, the text sent."""

    prompts: list[list[int]]
    output_lens: list[int]
    texts: list[str] | None
    source: str
    repeated: int = 0  # requests given a dataset's prompt again (the last ones)
    cut: frozenset[int] = frozenset()  # the indices of the requests whose dataset prompt was cut to fit


def _cut_text(tokenizer, ids: list[int]) -> str:
    """The text of a prompt cut to len(ids) tokens, re-encoding to no more than that: a cut that splits a character
    decodes to U+FFFD, which a byte-level BPE encodes as more tokens than the bytes it replaced (the request then
    overran the context it was cut to fit)."""
    for k in range(len(ids), 1, -1):
        text = tokenizer.decode(ids[:k])
        if len(tokenizer.encode(text)) <= len(ids):
            return text
    return tokenizer.decode(ids[:1])


def serve_workload(
    n: int,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    seed: int,
    vocab_size: int,
    tokenizer=None,
    text: bool = False,
    dataset: Path | None = None,
    prefix_groups: int = 0,
    prefix_len: int = 0,
    max_model_len: int | None = None,
    skip: int = 0,
) -> ServeWorkload:
    """Random prompts (nano-vllm's draw, ids folded into small vocabularies) or a dataset's (from its `skip`-th
    prompt on); with prefix groups, request i starts with group i % G's shared random prefix of `prefix_len`
    tokens. Text prompts are the dataset's own (a prompt cut to fit, its kept tokens' text), or random ids decoded
    by the tokenizer."""
    repeated = 0
    cut: frozenset[int] = frozenset()
    if dataset is not None:
        assert tokenizer is not None
        base = dataset_workload(dataset, tokenizer.encode, n, output_len, seed, max_model_len or 1 << 30, skip)
        prompts, output_lens = base.prompts, base.output_lens
        texts = None
        if text and base.texts is not None:  # a prompt cut to fit the context goes out as its kept tokens' text
            texts = [t if t is not None else _cut_text(tokenizer, p) for t, p in zip(base.texts, prompts)]
        source, repeated = str(dataset), base.repeated
        cut = frozenset(i for i, t in enumerate(base.texts or []) if t is None)
    else:
        base = random_workload(n, input_len, output_len, seed, vocab_size)
        prompts, output_lens, texts, source = base.prompts, base.output_lens, None, "random"
        if text:
            assert tokenizer is not None
            texts = [tokenizer.decode(p) for p in prompts]
    if prefix_groups:
        rng = random.Random(seed + 1)
        heads = [
            [rng.randrange(min(vocab_size, PUBLISHED_MAX_ID)) for _ in range(prefix_len)] for _ in range(prefix_groups)
        ]
        prompts = [heads[i % prefix_groups] + p for i, p in enumerate(prompts)]
        if texts is not None:
            head_texts = [tokenizer.decode(h) for h in heads]
            texts = [head_texts[i % prefix_groups] + t for i, t in enumerate(texts)]
        source += f" + {prefix_groups} prefix groups of {prefix_len} tokens"
    if texts is not None:
        prompts = [tokenizer.encode(t) for t in texts]  # what the server will count
    return ServeWorkload(prompts, output_lens, texts, source, repeated, cut)
