"""Request traces: the Qwen/Bailian and Mooncake JSONL formats, and prompts synthesized from their hash ids.

Qwen (alibaba-edu/qwen-bailian-usagetraces-anon): `timestamp` in seconds, `hash_ids` of 16-token blocks, plus
`chat_id`, `parent_chat_id`, `turn`, `type`. Mooncake (kvcache-ai/Mooncake FAST'25): `timestamp` in milliseconds,
`hash_ids` of 512-token blocks. Both: `input_length`, `output_length`, one JSON object per line.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path

FORMATS = {"qwen": (1.0, 16), "mooncake": (1e-3, 512)}  # format -> (timestamp unit in seconds, block size)
QWEN_KEYS = ("chat_id", "parent_chat_id", "turn", "type")


class TraceError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class TraceRequest:
    index: int  # position among the trace's good requests
    line: int  # 1-based line number in the file
    timestamp: float  # seconds from the trace's start
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    chat_id: int | None = None
    parent_chat_id: int | None = None
    turn: int | None = None
    type: str | None = None


@dataclass(slots=True)
class Trace:
    path: str
    format: str
    block_size: int
    requests: list[TraceRequest]
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line, why) with --skip-bad-lines

    def window(self, start: int = 0, num_requests: int | None = None) -> Trace:
        """Requests [start, start + num_requests); the first one's arrival becomes time zero."""
        reqs = self.requests[start : None if num_requests is None else start + num_requests]
        t0 = reqs[0].timestamp if reqs else 0.0
        reqs = [replace(r, timestamp=r.timestamp - t0) for r in reqs]
        return Trace(self.path, self.format, self.block_size, reqs, self.skipped)

    def block_tokens(self, r: TraceRequest) -> list[tuple[int, int]]:
        """(hash id, tokens of the prompt it covers) for each block; ids past the prompt are ignored."""
        bs = self.block_size
        return [(h, min(bs, r.input_length - j * bs)) for j, h in enumerate(r.hash_ids) if j * bs < r.input_length]

    def reuse_upper_bound(self, over: set[int] | None = None) -> float | None:
        """Share of prompt tokens in blocks whose hash id appeared earlier: the best hit rate any prefix cache
        of unlimited size could reach on this trace (hit tokens / prompt tokens); None without requests.
        `over`: the indices of the requests measured (default all); every earlier request still fills the cache,
        as one a replay cut off or failed had reached the cache before it ended."""
        seen: dict[int, int] = {}
        hit = total = 0
        for r in self.requests:
            counted = over is None or r.index in over
            total += r.input_length if counted else 0
            for h, n in self.block_tokens(r):
                hit += min(n, seen.get(h, 0)) if counted else 0
                seen[h] = max(seen.get(h, 0), n)
        return hit / total if total else None


# Lengths and timestamps are scaled as floats (--length-scale, --time-scale, milliseconds): JSON integers past this
# would lose digits there, or overflow a float.
MAX_TRACE_INT = 2**53


def _int(rec: dict, key: str, minimum: int) -> int:
    v = rec.get(key)
    if v is None:
        raise TraceError(f"missing field {key!r}")
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"{key!r} must be an integer (got {v!r})")
    if v < minimum:
        raise TraceError(f"{key!r} must be >= {minimum} (got {_short(v)})")
    if v > MAX_TRACE_INT:
        raise TraceError(f"{key!r} must be <= 2**53 (got {_short(v)})")
    return v


def _short(v: object) -> str:
    """A value for an error line, an integer of hundreds of digits by its length."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**30:
        return f"an integer of {len(str(abs(v)))} digits"
    return repr(v)


def detect_format(rec: dict) -> str:
    return "qwen" if any(k in rec for k in QWEN_KEYS) else "mooncake"


def parse_record(rec: object, fmt: str, index: int, line: int) -> TraceRequest:
    if not isinstance(rec, dict):
        raise TraceError(f"expected a JSON object, got {type(rec).__name__}")
    ts = rec.get("timestamp")
    if ts is None:
        raise TraceError("missing field 'timestamp'")
    finite = isinstance(ts, int) and not isinstance(ts, bool) or isinstance(ts, float) and math.isfinite(ts)
    if not finite or ts < 0:
        raise TraceError(f"'timestamp' must be a finite number >= 0 (got {_short(ts)})")
    if ts > MAX_TRACE_INT:
        raise TraceError(f"'timestamp' must be <= 2**53 (got {_short(ts)})")
    hashes = rec.get("hash_ids")
    if hashes is None:
        raise TraceError("missing field 'hash_ids'")
    if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
        raise TraceError("'hash_ids' must be a list of integers")
    extra = {}
    if fmt == "qwen":
        extra = {k: rec.get(k) for k in QWEN_KEYS}
        if extra["type"] is not None and not isinstance(extra["type"], str):
            raise TraceError(f"'type' must be a string (got {extra['type']!r})")
    return TraceRequest(
        index,
        line,
        ts * FORMATS[fmt][0],
        _int(rec, "input_length", 1),
        _int(rec, "output_length", 1),
        tuple(hashes),
        **extra,
    )


def read_trace(
    path: Path | str, fmt: str = "auto", block_size: int | None = None, skip_bad_lines: bool = False
) -> Trace:
    """Parse a JSONL trace. A bad line (bad JSON, missing field, bad value, timestamp going back) raises a
    TraceError naming the file and line, or is counted in `skipped` with skip_bad_lines."""
    path = Path(path)
    if fmt not in ("auto", *FORMATS):
        raise TraceError(f"unknown trace format {fmt!r}; choose auto, {', '.join(FORMATS)}")
    if block_size is not None and block_size < 1:
        raise TraceError(f"block size must be >= 1 (got {block_size})")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e}") from e
    if raw[:2] == b"\x1f\x8b":
        raise TraceError(f"{path} is gzip-compressed: decompress it first (gunzip -k {path})")
    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark, as Windows tools write UTF-8 (json refused it)
    reqs: list[TraceRequest] = []
    skipped: list[tuple[int, str]] = []
    for lineno, line in enumerate(raw.splitlines(), 1):  # bytes: only \n, \r and \r\n end a line
        if not line.strip():
            continue
        try:
            try:
                text = line.decode()
            except UnicodeDecodeError as e:
                raise TraceError(f"not UTF-8 text (byte 0x{line[e.start]:02x} at column {e.start + 1})") from None
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as e:
                raise TraceError(f"invalid JSON: {e.msg} at column {e.colno}") from None
            except ValueError as e:  # e.g. an integer of more digits than Python converts (its int_max_str_digits)
                raise TraceError(f"invalid JSON: {e}") from None
            if fmt == "auto" and isinstance(rec, dict):
                fmt = detect_format(rec)
            r = parse_record(rec, "mooncake" if fmt == "auto" else fmt, len(reqs), lineno)
            if reqs and r.timestamp < reqs[-1].timestamp:
                raise TraceError(
                    f"timestamp goes back in time ({rec['timestamp']} after the previous request's "
                    f"{reqs[-1].timestamp / FORMATS[fmt][0]:g})"
                )
        except TraceError as e:
            if not skip_bad_lines:
                raise TraceError(f"{path}:{lineno}: {e}") from None
            skipped.append((lineno, str(e)))
            continue
        reqs.append(r)
    if not reqs:
        raise TraceError(f"{path}: no usable requests" + (f" ({len(skipped)} bad lines skipped)" if skipped else ""))
    fmt = "mooncake" if fmt == "auto" else fmt
    return Trace(str(path), fmt, block_size or FORMATS[fmt][1], reqs, skipped)


# The blocks PromptSynth keeps drawn, in bytes (~40 per token: a list's pointer and the int it points to): a trace's
# first blocks come back often (a system prompt; a conversation's last turn), most never. Kept whole, the Mooncake
# trace's 182,790 blocks of 512 took 3.7 GB; kept for good, a block is drawn once (0.1-0.2 ms) instead of each time.
BLOCK_CACHE_BYTES = 64 << 20


class PromptSynth:
    """Token ids for trace prompts: hash id h always gives the same block of tokens (so prefix sharing in the
    trace becomes real prefix-cache hits); tokens past a request's hash ids are unique to that request. The blocks
    used last are kept (BLOCK_CACHE_BYTES), the others drawn again when they come back."""

    def __init__(self, vocab_size: int, block_size: int, seed: int = 0):
        self.vocab, self.bs, self.seed = vocab_size, block_size, seed
        self._blocks: OrderedDict[int, list[int]] = OrderedDict()
        self._capacity = max(1, BLOCK_CACHE_BYTES // (40 * block_size + 100))

    def _draw(self, *key: int) -> list[int]:
        import numpy as np

        # --seed may be negative (the engine takes any 64-bit seed); SeedSequence takes only non-negative words
        rng = np.random.default_rng([self.seed & (2**64 - 1), *(k & (2**64 - 1) for k in key)])
        return rng.integers(0, self.vocab, self.bs).tolist()

    def block(self, hash_id: int) -> list[int]:
        b = self._blocks.get(hash_id)
        if b is None:
            b = self._blocks[hash_id] = self._draw(0, hash_id)
            if len(self._blocks) > self._capacity:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(hash_id)
        return b

    def prompt(self, hash_ids: tuple[int, ...], input_length: int, unique_key: int) -> list[int]:
        ids: list[int] = []
        for h in hash_ids:
            if len(ids) >= input_length:
                break
            ids += self.block(h)
        j = 0
        while len(ids) < input_length:
            ids += self._draw(1, unique_key, j)
            j += 1
        return ids[:input_length]
