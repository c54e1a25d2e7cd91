"""The benchmarks' workloads: nano-vllm's random prompts, or real prompts from a local dataset file, for
bench-offline (`Workload`) and bench-serve (`ServeWorkload`, which adds shared-prefix groups and prompts sent as
text)."""

from __future__ import annotations

import codecs
import csv
import functools
import io
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

# nano-vllm / mini-sglang draw prompt ids with randint(0, 10000); the range is part of the published workload.
PUBLISHED_MAX_ID = 10000
TEXT_COLUMNS = ("prompt", "text", "question", "instruction", "input", "content")
TURN_COLUMNS = ("conversations", "messages")  # ShareGPT's turns, OpenAI chat's messages


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
    skipped: str | None = None  # a dataset's rows skipped for an empty prompt: DatasetPrompts.skipped_note()
    skipped_rows: int = 0
    column: str | None = None  # a dataset's prompt column (DatasetPrompts.column)

    @property
    def num_seqs(self) -> int:
        return len(self.prompts)

    @property
    def input_tokens(self) -> int:
        return sum(map(len, self.prompts))

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)


@dataclass(frozen=True, slots=True)
class DatasetPrompts:
    """The prompts read from a dataset file, and the rows passed over for an empty or missing prompt."""

    texts: list[str]
    column: str  # where the prompts came from
    turns: bool = False  # the column holds conversations: each prompt is a row's first user turn
    skipped: int = 0  # the file's rows whose prompt is empty, blank or missing (or a conversation with no user turn)
    first_skipped: str = ""  # the first of them: "line 3" (JSON lines, CSV) or "row 3" (a JSON list, Parquet)

    def skipped_note(self, path: Path) -> str | None:
        if not self.skipped:
            return None
        what = f"no user turn in {self.column!r}" if self.turns else f"no text in {self.column!r}"
        if self.skipped == 1:
            return f"{path}: {self.first_skipped} has {what} and was skipped"
        return f"{path}: {self.skipped:,} rows with {what} were skipped (the first: {self.first_skipped})"


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


class ColumnError(ValueError):
    """--dataset-column names a column the file lacks (the CLI blames that flag, not --dataset)."""


def read_dataset_prompts(path: Path, limit: int, column: str | None = None) -> DatasetPrompts:
    """The first `limit` prompts of a local JSON/JSONL/CSV/Parquet file, or of a directory `datasets` saved
    (save_to_disk): the first user turn of ShareGPT
    `conversations` (or OpenAI `messages`), or a text column.

    The prompt column is `column` (--dataset-column), else the file's, as guidellm picks it: the first of
    TURN_COLUMNS + TEXT_COLUMNS that any row has, or a file's only column. It holds conversations when it is one of
    TURN_COLUMNS or a row's value there is a list of objects. A row whose value there is empty or missing is skipped
    and counted (as vLLM's ShareGPT reader drops a conversation with no reply), never filled from another column."""
    if not path.exists():
        raise ValueError(f"dataset {path} does not exist")
    if path.is_dir() and not any((path / f).is_file() for f in SAVED_MARKERS):
        raise ValueError(f"dataset {path} is a directory, not a file (nor a dataset that `datasets` saved)")
    if not path.is_file() and not path.is_dir():
        raise ValueError(f"dataset {path} is not a regular file")
    # a saved directory's newest file says whether it changed
    st = path.stat() if path.is_file() else max((f.stat() for f in path.rglob("*")), key=lambda s: s.st_mtime_ns)
    read = _read_file(path, st.st_mtime_ns, st.st_size, column)
    return read if len(read.texts) <= limit else replace(read, texts=read.texts[:limit])


# A bench-serve sweep reads the file once per load point: ShareGPT's 650 MB JSON takes ~10 s to parse each time.
@functools.lru_cache(maxsize=2)
def _read_file(path: Path, mtime_ns: int, size: int, column: str | None) -> DatasetPrompts:
    """All the prompts of the file's `column` (None: the file's own), as it is at `mtime_ns` and `size`."""
    kind = path.suffix.lower()
    if path.is_dir():
        columns, rows = _saved_rows(path, column)
    elif kind not in (".json", ".jsonl", ".csv", ".parquet"):
        raise ValueError(f"dataset {path}: use a .json, .jsonl, .csv or .parquet file, or a directory `datasets` saved")
    elif kind == ".parquet":
        columns, rows = _parquet_rows(path, column)
    else:
        text = _text(path)
        if not text.strip():
            raise ValueError(f"dataset {path} is empty")
        columns, rows = _csv_rows(path, text) if kind == ".csv" else _json_rows(path, text)
    if not rows:
        raise ValueError(f"dataset {path} holds no rows")
    if column is not None and column not in columns:
        raise ColumnError(
            f"dataset {path} has no column {column!r}; its columns: {', '.join(map(str, columns)) or 'none'}"
        )
    col = column or _prompt_column(columns)
    if col is None:
        raise ValueError(
            f"dataset {path} has no 'conversations', 'messages' or text column "
            f"({', '.join(TEXT_COLUMNS)}); its columns: {', '.join(map(str, columns)) or 'none'}"
        )
    turns = col in TURN_COLUMNS or any(_is_conversation(row.get(col)) for _, row in rows)
    texts: list[str] = []
    skipped: list[str] = []
    for where, row in rows:
        value, what = row.get(col), repr(col)
        if turns:
            value, what = _first_user_turn(value, f"dataset {path}: {where}: {col!r}"), f"the user turn in {col!r}"
        if value is not None and not isinstance(value, str):
            # str() of a number or a list made prompts of "5" or "[1, 2]"
            raise ValueError(
                f"dataset {path}: {where}: {what} must be text, got {type(value).__name__} {str(value)[:40]!r}"
            )
        if prompt := (value or "").strip():
            texts.append(prompt)
        else:
            skipped.append(where)
    if not texts:
        raise ValueError(f"dataset {path} holds no non-empty prompts (in its {col!r} column)")
    return DatasetPrompts(texts, col, turns, len(skipped), skipped[0] if skipped else "")


def _prompt_column(columns: list[str]) -> str | None:
    """guidellm's choice: the first of TURN_COLUMNS + TEXT_COLUMNS among `columns`, or the only one."""
    return next((c for c in (*TURN_COLUMNS, *TEXT_COLUMNS) if c in columns), columns[0] if len(columns) == 1 else None)


def _is_conversation(value: object) -> bool:
    return isinstance(value, list) and any(isinstance(turn, dict) for turn in value)


def _text(path: Path) -> str:
    """A text file's contents: UTF-8 (a byte-order mark dropped), or UTF-16 with its mark (PowerShell's `>`)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read dataset {path}: {e.strerror or e}") from None
    utf16 = data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-16" if utf16 else "utf-8")
    except UnicodeDecodeError as e:
        line, line_start = data.count(b"\n", 0, e.start) + 1, data.rfind(b"\n", 0, e.start) + 1
        raise ValueError(
            f"dataset {path}: line {line} is not {e.encoding.upper()} (byte 0x{data[e.start]:02x} at "
            f"byte {e.start - line_start + 1} of the line): save the file as UTF-8"
        ) from None


Rows = list[tuple[str, dict]]  # (where the row is, for messages: "line 3" or "row 3"; its fields)


def _json_rows(path: Path, text: str) -> tuple[list[str], Rows]:
    """JSON lines (a .jsonl, or a .json that holds them), a JSON list of objects (or of strings: a 'text' column),
    or one object."""
    items: list[tuple[str, object]] | None = None
    if path.suffix.lower() == ".json":
        try:
            doc = json.loads(text)
            items = [(f"row {i}", r) for i, r in enumerate(doc, 1)] if isinstance(doc, list) else [("row 1", doc)]
        except json.JSONDecodeError as e:
            if e.msg != "Extra data" or not text.lstrip().startswith("{"):
                raise ValueError(f"dataset {path}: line {e.lineno} column {e.colno}: invalid JSON: {e.msg}") from None
    if items is None:
        items = []
        for no, line in enumerate(text.split("\n"), 1):  # not splitlines(): U+2028 may stand in a JSON string
            try:
                if line.strip():
                    items.append((f"line {no}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise ValueError(f"dataset {path}: line {no} column {e.colno}: invalid JSON: {e.msg}") from None
    rows: Rows = []
    for where, item in items:
        if not isinstance(item, dict | str):
            raise ValueError(
                f"dataset {path}: {where} is {type(item).__name__} {str(item)[:40]!r}, not an object "
                "(expected JSON lines, or a JSON list, of objects)"
            )
        rows.append((where, item if isinstance(item, dict) else {"text": item}))
    return list(dict.fromkeys(k for _, r in rows for k in r)), rows


def _csv_rows(path: Path, text: str) -> tuple[list[str], Rows]:
    """Comma-separated, or by the ';', tab or '|' its header row uses (a ';' file read with commas was one column,
    'id;prompt', whose cells, ids and all, became the prompts)."""
    csv.field_size_limit(1 << 30)  # a prompt longer than the default 131,072 characters was an error
    try:
        sep = csv.Sniffer().sniff(text.split("\n", 1)[0], delimiters=",;\t|").delimiter
    except csv.Error:  # a header of one column
        sep = ","
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=sep, strict=True)  # strict: an unclosed quote
    rows: Rows = []
    try:
        for row in reader:
            if None in row:  # DictReader's key for the cells past the header's: `hello, world` lost its `world`
                raise ValueError(
                    f"dataset {path}: line {reader.line_num} has more cells than the header's "
                    f"{len(reader.fieldnames or [])} (quote a cell that holds {sep!r})"
                )
            rows.append((f"line {reader.line_num}", row))
    except csv.Error as e:
        raise ValueError(f"dataset {path}: after line {reader.line_num}: {e}") from None
    return [c for c in reader.fieldnames or [] if c], rows


# What `datasets`' save_to_disk leaves in its directory: a Dataset's, a DatasetDict's
SAVED_MARKERS = ("state.json", "dataset_dict.json")


def _saved_rows(path: Path, column: str | None) -> tuple[list[str], Rows]:
    """A dataset saved by `datasets` (Dataset.save_to_disk; of a DatasetDict, its 'train' split or its only one), read
    through `datasets` itself (Arrow files, memory-mapped)."""
    import datasets

    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # its "Loading dataset from disk" bar, under --quiet too
    try:
        ds = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as e:  # a damaged or partial save: FileNotFoundError, json's or Arrow's ValueError
        raise ValueError(f"cannot read dataset {path} as a directory `datasets` saved: {e}") from None
    finally:
        if bars:
            datasets.enable_progress_bars()
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds and len(ds) != 1:
            raise ValueError(
                f"dataset {path} holds the splits {', '.join(ds)}: none is 'train' (give the split's folder)"
            )
        ds = ds["train" if "train" in ds else next(iter(ds))]
    names, read = ds.column_names, _read_columns(ds.column_names, column)
    # of no columns, to_list() is no rows: a file without a prompt column said it "holds no rows"
    rows = ds.select_columns(read).to_list() if read else [{}] * ds.num_rows
    return names, [(f"row {i}", r) for i, r in enumerate(rows, 1)]


def _read_columns(names: list[str], column: str | None) -> list[str]:
    """The columns of a Parquet file or saved dataset that may hold its prompts (its others can be large)."""
    if column is not None:
        return [c for c in names if c == column]
    return [c for c in names if c in (*TURN_COLUMNS, *TEXT_COLUMNS) or len(names) == 1]


def _parquet_rows(path: Path, column: str | None) -> tuple[list[str], Rows]:
    """The rows' prompt columns only (a file's other columns can be large)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"dataset {path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    try:
        f = pq.ParquetFile(path)
        names = f.schema_arrow.names
        table = f.read(columns=_read_columns(names, column))
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"cannot read dataset {path} as Parquet: {e}") from None
    return names, [(f"row {i}", r) for i, r in enumerate(table.to_pylist(), 1)]


def _first_user_turn(conv: object, what: str) -> object:
    """The first turn from 'human' or 'user' (ShareGPT's 'from'/'value', OpenAI's 'role'/'content'), its content
    parts joined (_joined_parts); None when there is none."""
    if conv is not None and not isinstance(conv, list):
        raise ValueError(
            f"{what} must be a list of turns ({{'from' or 'role', 'value' or 'content'}}), "
            f"got {type(conv).__name__} {str(conv)[:40]!r}"
        )
    for turn in conv or []:
        if not isinstance(turn, dict):
            raise ValueError(f"{what}: a turn must be an object, got {turn!r:.40}")
        if turn.get("from", turn.get("role")) in ("human", "user"):
            return _joined_parts(turn.get("value", turn.get("content")), what)
    return None


def _joined_parts(content: object, what: str) -> object:
    """OpenAI content parts ([{"type": "text", "text": ...}, ...]) as one text, the parts joined with "\n" as
    vLLM's string-format chat templates join them; any other content as it is. A part that is not text (an image,
    audio) is an error: the prompt would silently lose it."""
    if not isinstance(content, list) or not all(isinstance(part, dict) for part in content):
        return content
    texts = []
    for i, part in enumerate(content, 1):
        kind = part.get("type")
        if kind != "text":
            raise ValueError(
                f"{what}: the user turn's part {i} is of type {kind!r}: only text parts can be a prompt "
                "(the benchmarks send text)"
            )
        if not isinstance(text := part.get("text"), str):
            raise ValueError(f"{what}: the user turn's part {i} (type 'text') has no text, got {text!r:.40}")
        texts.append(text)
    return "\n".join(texts)


def dataset_workload(
    path: Path,
    encode: Callable[[str], list[int]],
    num_seqs: int,
    output_len: tuple[int, int],
    seed: int,
    max_model_len: int,
    skip: int = 0,
    column: str | None = None,
) -> Workload:
    """Real prompts (tokenized with the model's tokenizer) with output lengths drawn from `output_len`;
    a prompt too long for the context keeps its first tokens. The requests take the file's prompts from the
    `skip`-th on (a bench-serve sweep gives each load prompts of its own); past the file's last prompt they start
    again from its first, as vLLM's benchmarks oversample (`repeated` counts those requests). `column`: the file's
    prompt column (read_dataset_prompts)."""
    dataset = read_dataset_prompts(path, skip + num_seqs, column)
    read = dataset.texts
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
    return Workload(
        prompts,
        output_lens,
        str(path),
        truncated=truncated,
        repeated=repeated,
        texts=texts,
        skipped=dataset.skipped_note(path),
        skipped_rows=dataset.skipped,
        column=dataset.column,
    )


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
    skipped: str | None = None  # Workload's
    skipped_rows: int = 0
    column: str | None = None  # Workload's


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
    column: str | None = None,
) -> ServeWorkload:
    """Random prompts (nano-vllm's draw, ids folded into small vocabularies) or a dataset's (from its `skip`-th
    prompt on); with prefix groups, request i starts with group i % G's shared random prefix of `prefix_len`
    tokens. Text prompts are the dataset's own (a prompt cut to fit, its kept tokens' text), or random ids decoded
    by the tokenizer."""
    repeated, skipped, skipped_rows, used_column = 0, None, 0, None
    cut: frozenset[int] = frozenset()
    if dataset is not None:
        assert tokenizer is not None
        context = max_model_len or 1 << 30
        base = dataset_workload(dataset, tokenizer.encode, n, output_len, seed, context, skip, column)
        prompts, output_lens = base.prompts, base.output_lens
        texts = None
        if text and base.texts is not None:  # a prompt cut to fit the context goes out as its kept tokens' text
            texts = [t if t is not None else _cut_text(tokenizer, p) for t, p in zip(base.texts, prompts)]
        source, repeated = str(dataset), base.repeated
        cut = frozenset(i for i, t in enumerate(base.texts or []) if t is None)
        skipped, skipped_rows, used_column = base.skipped, base.skipped_rows, base.column
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
    return ServeWorkload(prompts, output_lens, texts, source, repeated, cut, skipped, skipped_rows, used_column)
