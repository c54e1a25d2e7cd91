"""Engine flags shared by every command (Annotated aliases), and the EngineConfig they build; their defaults are
EngineConfig's. Nothing here imports torch: `minisgl --help` must stay fast."""

from __future__ import annotations

import functools
import inspect
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from typer.core import TyperArgument, TyperCommand

from engine.config import EngineConfig
from engine.model_config import PRESETS

if TYPE_CHECKING:
    from typer._click.core import Context as ClickContext  # typer's own copy of click
    from typer._click.formatting import HelpFormatter

Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help=f"HF directory, .gguf file, or dummy:<preset> ({', '.join(PRESETS)}). "
        "Default: embedded SmolLM2-135M-Instruct.",
    ),
]
Device = Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")]
Dtype = Annotated[
    str,
    typer.Option(
        help="auto (bf16 on GPU and on CPUs with native bf16, else fp32; a .gguf model, the default one included, is "
        "fp32 on every CPU) | float32 | bfloat16 | float16"
    ),
]
PageSize = Annotated[int, typer.Option(help="tokens per KV page", min=1)]
NumPages = Annotated[int | None, typer.Option(help="KV pool size in pages (instead of --kv-cache-gb)", min=2)]
KvCacheGb = Annotated[
    float | None,
    typer.Option(help="KV pool budget in GiB (default: 1 on CPU, --memory-fraction of GPU memory)", min=0.001),
]
KvCacheDtype = Annotated[
    str,
    typer.Option(
        help="KV cache storage: auto (the model's dtype) | fp8 (or fp8_e4m3; scale 1: half the bytes per token, so "
        "twice the tokens and half the KV a decode step reads; attention results change slightly)",
    ),
]
MemoryFraction = Annotated[
    float,
    typer.Option(
        help="GPU memory fraction for weights + KV: sizes the KV pool on CUDA without --num-pages / --kv-cache-gb",
        min=0.01,
        max=1.0,
    ),
]
# the --dataset benchmarks' prompt file and its prompt column (bench-offline, bench-serve)
Dataset = Annotated[
    Path | None,
    typer.Option(
        help="real prompts from a local .json/.jsonl/.csv/.parquet file or a directory `datasets` saved (ShareGPT "
        "`conversations` or a text column)"
    ),
]
DatasetColumn = Annotated[
    str | None,
    typer.Option(
        help="the --dataset file's prompt column: a text column, or one of conversations (the first user turn); "
        "default: conversations, messages, then prompt, text, question, instruction, input, content, or the file's "
        "only column"
    ),
]
# the --url benchmarks' client options (bench-serve, bench-trace)
ServedModel = Annotated[str | None, typer.Option(help="model name sent with --url (default: the first of /v1/models)")]
ApiKey = Annotated[str | None, typer.Option(envvar="OPENAI_API_KEY", help="bearer token for --url", show_default=False)]
RequestTimeout = Annotated[float, typer.Option(help="seconds per request with --url", min=1.0)]
MaxRunning = Annotated[int, typer.Option(help="max concurrently running requests", min=1)]
VllmArgs = Annotated[
    list[str] | None,
    typer.Option(
        "--vllm-arg",
        help="KEY=VALUE passed to vLLM's engine arguments (repeatable; e.g. max_num_seqs=256 to admit as many "
        "requests as minisgl's default); VALUE is read as JSON (numbers, true/false, null), else as a string",
    ),
]
MaxBatchTokens = Annotated[
    int,
    typer.Option(
        "--max-batch-tokens",
        "--max-prefill-tokens",
        help="token budget per step: running requests' decode tokens plus prefill chunks (chunked prefill)",
        min=1,
    ),
]
MixedBatch = Annotated[
    bool,
    typer.Option(
        "--mixed-batch/--no-mixed-batch",
        help="one step carries every running request's decode token plus prefill chunks (off: prefill steps first, "
        "then decode)",
    ),
]
MixedPrefillTokens = Annotated[
    int | None,
    typer.Option(
        help="with mixed batches, the most prefill tokens a step adds while requests are decoding (smaller: shorter "
        "gaps between a stream's tokens; larger: prompts prefill in fewer steps); with nothing decoding, prefill fills "
        "--max-batch-tokens (unset, as bench-offline leaves it: --max-batch-tokens either way)",
        min=1,
    ),
]
MaxRunningTokens = Annotated[
    int | None,
    typer.Option(
        help="admit no new request while running requests' contexts hold this many tokens (each decode step reads "
        "all of their KV, so this bounds the inter-token gap under load; default: no cap)",
        min=1,
    ),
]
MaxModelLen = Annotated[int | None, typer.Option(help="context length limit (default: the model's)", min=2)]
NoRadix = Annotated[bool, typer.Option("--no-radix-cache", help="disable the radix prefix cache")]
Backend = Annotated[
    str,
    typer.Option(
        "--attention-backend",
        help="auto | torch | flashinfer | fa (FlashAttention-4, extra 'fa'), or PREFILL,DECODE such as fa,flashinfer",
    ),
]
GraphBs = Annotated[
    int, typer.Option(help="largest decode batch captured in a CUDA graph (0: off; FlashInfer decode only)", min=0)
]
PiecewiseTokens = Annotated[
    int,
    typer.Option(
        help="largest prefill/mixed step (tokens) run through CUDA graphs captured in pieces between the attention "
        "calls (0: off; FlashInfer for both phases only)",
        min=0,
    ),
]
NoOverlap = Annotated[bool, typer.Option("--no-overlap", help="disable overlap scheduling")]
Tp = Annotated[int, typer.Option(help="tensor-parallel size (launch with torchrun --nproc-per-node N)", min=1)]
Seed = Annotated[
    int, typer.Option(help="engine random seed: requests without a seed of their own draw from it, so a run repeats")
]


# The engine flags, in the order --help lists them after a command's own, with their defaults: EngineConfig's own, and
# off for the `no_*` switches (a command may change a default: with_engine_flags). `--seed` is each command's own: it
# seeds the workload too.
_ENGINE_DEFAULTS = {f.name: f.default for f in fields(EngineConfig)}
ENGINE_FLAGS: tuple[tuple[str, Any, Any], ...] = tuple(
    (name, option, False if name.startswith("no_") else _ENGINE_DEFAULTS[name])
    for name, option in (
        ("model", Model),
        ("device", Device),
        ("dtype", Dtype),
        ("page_size", PageSize),
        ("num_pages", NumPages),
        ("kv_cache_gb", KvCacheGb),
        ("kv_cache_dtype", KvCacheDtype),
        ("memory_fraction", MemoryFraction),
        ("max_running_requests", MaxRunning),
        ("max_batch_tokens", MaxBatchTokens),
        ("max_running_tokens", MaxRunningTokens),
        ("max_model_len", MaxModelLen),
        ("no_radix_cache", NoRadix),
        ("attention_backend", Backend),
        ("cuda_graph_max_bs", GraphBs),
        ("piecewise_graph_tokens", PiecewiseTokens),
        ("no_overlap", NoOverlap),
        ("mixed_batch", MixedBatch),
        ("mixed_prefill_tokens", MixedPrefillTokens),
        ("tp", Tp),
    )
)
ENGINE_FLAG_NAMES = tuple(name for name, _, _ in ENGINE_FLAGS)
# Engine flags that only a CUDA device reads (a CPU engine has no CUDA graphs, no overlap scheduling, and a KV budget
# of its own)
CUDA_ONLY_FLAGS = ("memory_fraction", "cuda_graph_max_bs", "piecewise_graph_tokens", "no_overlap")
F = TypeVar("F", bound=Callable[..., Any])


def with_engine_flags(**defaults: Any) -> Callable[[F], F]:
    """A command taking every engine flag: typer sees the command's own parameters, then ENGINE_FLAGS (with these
    defaults instead where given); the command receives the engine flags in its `**engine_flags` keyword arguments."""
    names = [name for name, _, _ in ENGINE_FLAGS]
    if unknown := set(defaults) - set(names):
        raise TypeError(f"not engine flags: {sorted(unknown)}")

    def decorate(command: F) -> F:
        hints = typing.get_type_hints(command, include_extras=True)
        own = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(command).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        engine = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=flag, default=defaults.get(name, value))
            for name, flag, value in ENGINE_FLAGS
        ]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            refuse_non_finite(kwargs["ctx"], kwargs)
            return command(**kwargs)

        params = own + engine
        setattr(run, "__signature__", inspect.Signature(params))  # noqa: B010  (what typer reads)
        run.__annotations__ = {p.name: p.annotation for p in params}
        return typing.cast(F, run)

    return decorate


def refuse_non_finite(ctx: typer.Context, values: Mapping[str, Any]) -> None:
    """A float flag's range (min=...) lets inf through: a scale, rate or size of inf waits forever or overflows far
    from the flag, after the model has loaded. Exit 2, naming the flag."""
    for p in ctx.command.params:
        v = values.get(p.name or "")
        if isinstance(v, float) and not math.isfinite(v):
            raise typer.BadParameter(
                f"must be a finite number (got {v})", param_hint=" / ".join(f"'{o}'" for o in p.opts)
            )


def engine_config(seed: int = 0, **flags: Any) -> EngineConfig:
    """Build an EngineConfig from the engine flags among `flags` (ENGINE_FLAGS' defaults for those not given; other
    flags are ignored); bad values become a clean CLI error."""
    values = {name: flags.get(name, default) for name, _, default in ENGINE_FLAGS}
    no_radix_cache, no_overlap = values.pop("no_radix_cache"), values.pop("no_overlap")
    try:
        return EngineConfig(**values, radix_cache=not no_radix_cache, overlap=False if no_overlap else None, seed=seed)
    except ValueError as e:
        # EngineConfig names the field ("num_pages must be >= 2"): name the flag the user typed instead
        field = str(e).split(" ", 1)[0]
        flag = "--" + field.replace("_", "-") if field in values or field in ("radix_cache", "overlap") else None
        raise typer.BadParameter(str(e), param_hint=flag) from e


def given(ctx: typer.Context, *names: str) -> list[str]:
    """The flags among the parameters `names` that the command line set, spelled as --help spells them (a switch
    as its --no-... form when that is the one given), in --help's order. A value read from an environment variable
    (OPENAI_API_KEY, MINISGL_VLLM_ENV) or a default is not given: a variable set for every shell must not break the
    commands that do not read it."""
    wanted = set(names)
    flags = []
    for p in ctx.command.params:
        if p.name not in wanted or not p.opts:
            continue
        # compared by name: typer vendors click, ParameterSource with it, in a private module
        source = ctx.get_parameter_source(p.name)
        if source is None or source.name != "COMMANDLINE":
            continue
        flags.append(p.secondary_opts[0] if p.secondary_opts and ctx.params.get(p.name) is False else p.opts[0])
    return flags


def refuse_given(ctx: typer.Context, why: str, *names: str) -> None:
    """Refuse the flags among the parameters `names` that the command line set, for `why` (this run would not read
    them): a flag accepted and ignored looks as if it had changed the result. Exit 2, naming them."""
    if flags := given(ctx, *names):
        raise typer.BadParameter(why, param_hint=", ".join(flags))


def refuse_each(ctx: typer.Context, reasons: Mapping[str, str]) -> None:
    """refuse_given for parameters with reasons of their own ({name: why}); those sharing a reason are named
    together."""
    for why in dict.fromkeys(reasons.values()):
        refuse_given(ctx, why, *(name for name, w in reasons.items() if w == why))


def refuse_engine_flags(ctx: typer.Context, why: str, read: tuple[str, ...] = ()) -> None:
    """Refuse the engine flags given on the command line, but those in `read`: the run starts no minisgl engine to
    read them (`why`)."""
    refuse_given(ctx, why, *(name for name in ENGINE_FLAG_NAMES if name not in read))


def refuse_by_url(ctx: typer.Context, url: str | None, reads_model: bool, url_only: tuple[str, ...]) -> None:
    """A benchmark run in-process or against --url (bench-trace, bench-serve): refuse the flags `url_only` without
    --url, and with it the engine flags (the server runs its own engine) but --max-model-len and, where the run
    reads the served model's config or tokenizer from it (`reads_model`), --model."""
    if url is None:
        refuse_given(ctx, "is for a run against --url, and there is no --url", *url_only)
        return
    why = (
        "for the in-process engine, which --url does not start (--model and --max-model-len describe the served model)"
    )
    refuse_engine_flags(ctx, why, ("model", "max_model_len"))
    if not reads_model:
        why = "is read for the served model's vocabulary and context, and --vocab-size and --max-model-len give both"
        refuse_given(ctx, why, "model")


def served_shape(
    config: EngineConfig, vocab_size: int | None, with_tokenizer: bool = False, tokenizer: Any = None
) -> tuple[int, int, Any]:
    """A --url run's vocabulary, context and (`with_tokenizer`) tokenizer for the served model: --vocab-size and
    --max-model-len where given, the rest read from --model (bench-trace, bench-serve); `tokenizer` is --model's,
    where it was already loaded."""
    from engine.tokenizer import load_tokenizer
    from engine.weights import model_config_for

    vocab, context = vocab_size, config.max_model_len
    if vocab is None or context is None or with_tokenizer and tokenizer is None:
        try:
            mc = model_config_for(config.model)
            if with_tokenizer and tokenizer is None:
                tokenizer = load_tokenizer(config.model)
        except (ValueError, FileNotFoundError) as e:
            what = "config and tokenizer" if with_tokenizer else "config"
            raise typer.BadParameter(
                f"{e} (with --url, --model names the served model's {what}; or pass --vocab-size and --max-model-len)",
                param_hint="--model",
            ) from e
        vocab, context = vocab or mc.vocab_size, context or mc.max_position_embeddings
    return vocab, context, tokenizer


def served_model_shape(
    config: EngineConfig,
    vocab_size: int | None,
    model_given: bool,
    name: str | None,
    listed_context: int | None,
    with_tokenizer: bool = False,
    quiet: bool = False,
    tokenizer: Any = None,
) -> tuple[int, int, Any]:
    """served_shape against a server that serves `name` and lists `listed_context` (its /v1/models' max_model_len;
    None when not known): without --model, the served model's own config and tokenizer where this machine can read
    that id (a dummy preset, a local path), else --model's default with a note; the context capped at the listed
    one unless --max-model-len is given. With the default model's vocabulary, a server of a smaller one refused every
    prompt, and one serving a shorter context the longest (bench-trace, bench-serve). `tokenizer`: --model's, where
    served_shape already loaded it."""
    from dataclasses import replace

    from rich.console import Console

    from engine.weights import model_config_for

    if not model_given and name is not None:
        try:
            model_config_for(name)
            config, tokenizer = replace(config, model=name), None
        except (ValueError, FileNotFoundError):
            if vocab_size is None and not quiet:
                Console(stderr=True).print(
                    f"note: the served model {name!r} is not one this machine can read: its prompts draw from"
                    f" {config.model or 'the default model'}'s vocabulary; --model or --vocab-size names the served"
                    " one's"
                )
    vocab, context, tokenizer = served_shape(config, vocab_size, with_tokenizer, tokenizer)
    if config.max_model_len is None and listed_context is not None:
        context = min(context, listed_context)
    return vocab, context, tokenizer


def refuse_unread_engine_flags(ctx: typer.Context, config: EngineConfig) -> None:
    """Refuse the engine flags given on the command line that minisgl's engine, as `config` sets it up, would not
    read: a KV budget beside the pool's size in pages, mixed-batch settings without mixed batches, CUDA settings on
    another device (resolved only when one is given: `auto` imports torch)."""
    if config.num_pages is not None:
        refuse_given(ctx, "budgets the KV pool, and --num-pages sets its size: give one of them", "kv_cache_gb")
    if config.num_pages is not None or config.kv_cache_gb is not None:
        why = "sizes the KV pool from GPU memory, and --num-pages / --kv-cache-gb size it instead"
        refuse_given(ctx, why, "memory_fraction")
    if not config.mixed_batch:
        refuse_given(ctx, "bounds prefill in mixed batches, and --no-mixed-batch runs none", "mixed_prefill_tokens")
    if given(ctx, *CUDA_ONLY_FLAGS):
        try:
            device = config.torch_device()
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--device") from e
        if device.type != "cuda":
            refuse_given(ctx, f"sets the engine on a CUDA device, and this one runs on {device}", *CUDA_ONLY_FLAGS)
        _refuse_graph_flags_off_flashinfer(ctx, config, device)


def _refuse_graph_flags_off_flashinfer(ctx: typer.Context, config: EngineConfig, device: Any) -> None:
    """The engine captures CUDA graphs over FlashInfer alone (engine/cuda_graph.py, engine/piecewise_graph.py): decode
    graphs when it decodes, piecewise graphs when it runs both phases. Under another backend the graph flags are
    not read."""
    if not given(ctx, "cuda_graph_max_bs", "piecewise_graph_tokens"):
        return
    from kernels.attention.base import resolve_backends

    prefill, decode = resolve_backends(config.attention_backend, device)
    if decode != "flashinfer":
        refuse_given(
            ctx, f"sizes the decode graphs, captured over FlashInfer only; {decode} decodes here", "cuda_graph_max_bs"
        )
    if (prefill, decode) != ("flashinfer", "flashinfer"):
        backends = prefill if prefill == decode else f"{prefill} (prefill) and {decode} (decode)"
        why = f"sizes the piecewise graphs, captured when FlashInfer runs both phases; here {backends}"
        refuse_given(ctx, why, "piecewise_graph_tokens")


def generation_defaults(model: str | None) -> dict[str, Any]:
    """The sampling defaults of the model's generation_config.json (engine.tokenizer.sampling_defaults), read before
    the model loads: a bad value ends the command at once (exit 2), naming the file, not after the load."""
    from engine.tokenizer import sampling_defaults

    try:
        return sampling_defaults(model)
    except (ValueError, FileNotFoundError) as e:
        raise typer.BadParameter(str(e), param_hint="--model") from e


def launcher_rank() -> int:
    """This process's rank under torchrun (0 without it), known before the engine joins its group."""
    import os

    return int(os.environ.get("RANK", "0"))


def load_llm(config: EngineConfig, quiet: bool = False):
    """Build the LLM with a rich progress bar for the model load; model errors exit cleanly.
    Under torchrun (--tp N) ranks > 0 never return: they mirror rank 0's engine steps until it exits."""
    import atexit
    import os

    from rich.console import Console
    from rich.markup import escape

    from minisgl_cli.ctrl_c import noting_ctrl_c
    from minisgl_cli.report import INTERRUPTED_EXIT

    console = Console(stderr=True)
    # under torchrun every rank says which it is: one rank's start may fail alone (its file, its GPU's memory)
    rank = f"rank {launcher_rank()}: " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
    try:
        with noting_ctrl_c() as ctrl_c:
            llm = _load_with_bar(config, quiet, console, rank, ctrl_c)
    except KeyboardInterrupt:
        # Typer ends a command on Ctrl-C with status 130 and not a word: the embedded model's first load takes 10 s
        console.print(f"{escape(rank)}[yellow]interrupted[/yellow] while loading the model", soft_wrap=True)
        raise typer.Exit(INTERRUPTED_EXIT) from None

    from engine.distributed import TP

    if TP.size > 1 and TP.rank != 0:
        from engine.tp_follower import run_tp_follower

        run_tp_follower(llm)
        raise typer.Exit(0)
    if TP.size > 1:
        atexit.register(llm.shutdown)  # releases the follower ranks however the command ends
    return llm


def _load_with_bar(config: EngineConfig, quiet: bool, console, rank: str, ctrl_c: list[int]):
    """LLM(config) under a rich progress bar; a model error ends the command in one line (exit 2). An error raised
    after a Ctrl-C came (`ctrl_c` not empty) is the interruption's doing and is raised as KeyboardInterrupt."""
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from engine.distributed import TPStartFailed
    from engine.llm import LLM

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=quiet or launcher_rank() != 0,
    ) as bar:
        task = bar.add_task("loading model", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        try:
            return LLM(config, progress=progress)
        except Exception as e:
            if ctrl_c:
                raise KeyboardInterrupt from e
            # OSError: an unreadable file (PermissionError), a disk error
            if isinstance(e, (ValueError, OSError, TPStartFailed)):
                console.print(f"[red]error:[/red] {escape(rank + str(e))}", soft_wrap=True)
                raise typer.Exit(2) from e
            if not rank:
                raise
            # under torchrun, what ended the start on this rank in one line (CUDA out of memory on one GPU), not a
            # traceback that each rank's output interleaves with the others'
            console.print(f"[red]error:[/red] {escape(f'{rank}{type(e).__name__}: {e}')}", soft_wrap=True)
            raise typer.Exit(1) from e


def vllm_args(items: list[str] | None) -> dict[str, Any]:
    """--vllm-arg KEY=VALUE items as a dict (whether vLLM knows each key is checked where vLLM is imported)."""
    import json

    out: dict[str, Any] = {}
    for item in items or []:
        key, eq, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key.isidentifier():
            raise typer.BadParameter(f"{item!r} is not KEY=VALUE (e.g. max_num_seqs=256)", param_hint="--vllm-arg")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def plain_metavar(argument: TyperArgument) -> str:
    """An argument's name as click writes it: upper case, `[NAME]` when optional, `NAME...` when it takes several."""
    name = argument.metavar or (argument.name or "").upper()
    name = name if argument.required else f"[{name}]"
    return name + ("..." if argument.nargs != 1 else "")


class PlainCommand(TyperCommand):
    """Every command's class: its arguments are named as click names them, `FILES...`, `TRACE`, in the usage line
    (of --help and of an error) and under "Arguments:". Typer, with rich markup off, wrote `{files}...` there and
    `files... <list[Path]>` in the help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if isinstance(param, TyperArgument) and param.metavar is None:
                param.metavar = (param.name or "").upper()  # an error's name for it too: "Missing argument 'FILES'"

    def collect_usage_pieces(self, ctx: ClickContext) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            pieces += [plain_metavar(param)] if isinstance(param, TyperArgument) else param.get_usage_pieces(ctx)
        return pieces

    def format_options(self, ctx: ClickContext, formatter: HelpFormatter) -> None:
        rows: dict[str, list[tuple[str, str]]] = {"Arguments": [], "Options": []}
        for param in self.get_params(ctx):
            if (record := param.get_help_record(ctx)) is not None:
                if isinstance(param, TyperArgument):
                    rows["Arguments"].append((plain_metavar(param), record[1]))
                else:
                    rows["Options"].append(record)
        for section, records in rows.items():
            if records:
                with formatter.section(section):
                    formatter.write_dl(records)
