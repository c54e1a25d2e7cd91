"""vLLM as the benchmark peer: its offline `LLM` API on the same token-id prompts, one `SamplingParams` per request
(max_tokens = the workload's output length, ignore_eos, the run's temperature), for bench-offline; its `AsyncLLM`
(the engine behind `vllm serve`) for bench-trace's replays.

vLLM is never a dependency of the project: it is imported here only, when `--engine vllm` asks for it, and it must
not share a process (or a PYTHONPATH) with the project's FlashInfer bundle: `bench-offline --compare vllm` runs it
as a child process (see bench_offline.py).

Weights: a `dummy:<preset>` becomes a directory holding the preset's config.json (`ModelConfig.to_hf_dict()`) and
vLLM makes its own random weights at those shapes (`load_format="dummy"`): the same shapes as minisgl's dummy
weights, not the same values, which throughput does not depend on. A HF directory is loaded as it is. Prompts are
token ids (`skip_tokenizer_init=True`, nothing detokenized). Otherwise vLLM's defaults: torch.compile and CUDA
graphs on, prefix caching, async scheduling, its own batch limits; `describe()` reports the values it used."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from minisgl_cli.peers import OnDone, PeerRun, PeerUnavailable, no_tqdm_bars

# (section of vllm_config, attribute) reported with the figure; missing ones (other vLLM versions) are left out.
SETTINGS = (
    ("scheduler_config", "max_num_seqs"),
    ("scheduler_config", "max_num_batched_tokens"),
    ("scheduler_config", "async_scheduling"),
    ("cache_config", "enable_prefix_caching"),
    ("cache_config", "block_size"),
    ("cache_config", "cache_dtype"),
    ("cache_config", "gpu_memory_utilization"),
    ("cache_config", "num_gpu_blocks"),
    ("model_config", "max_model_len"),
    ("model_config", "enforce_eager"),
    ("compilation_config", "mode"),
    ("compilation_config", "cudagraph_mode"),
    ("compilation_config", "max_cudagraph_capture_size"),
    ("parallel_config", "tensor_parallel_size"),
)


def missing(why: str) -> str:
    return (
        f"vLLM does not import here ({why}). vLLM is optional, never a dependency of minisgl: install it, or on "
        "the GPU machine give bench-offline --compare vllm --vllm-env /root/vllm-site/vllm-env.sh, or source that "
        "script before --engine vllm (bench-offline's or bench-trace's; docs/benchmarks.md)"
    )


def import_vllm():
    """The vllm module, or PeerUnavailable naming why not (anything its import raises: a missing requirement, a
    CUDA or torch mismatch)."""
    try:
        import vllm
    except Exception as e:
        raise PeerUnavailable(missing(f"{type(e).__name__}: {e}")) from e
    return vllm


def write_config_dir(model_config, where: Path) -> Path:
    """`where`/config.json for a preset: what vLLM needs to build the model with dummy weights. No
    generation_config.json: sampling defaults in it would change the workload."""
    (where / "config.json").write_text(json.dumps(model_config.to_hf_dict(), indent=2) + "\n")
    return where


def engine_arguments(
    config, overrides: dict[str, Any] | None = None
) -> tuple[dict[str, Any], tempfile.TemporaryDirectory[str] | None, str, Any]:
    """vLLM engine arguments for the run's model (shared by the offline `LLM` and the `AsyncLLM` peers), with the
    user's `--vllm-arg` overrides (keys vLLM's EngineArgs has, other than those this peer sets): the keyword
    arguments, the temporary model directory to clean up (dummy weights), the weights' description, and the
    project's ModelConfig for the model."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    from engine.model_source import resolve
    from engine.weights import model_config_for

    device = config.torch_device()
    if device.type != "cuda":
        raise PeerUnavailable(f"the vLLM peer runs on a CUDA GPU (got device {device})")
    kind, where = resolve(config.model)
    model_config = model_config_for(config.model)
    tmp: tempfile.TemporaryDirectory[str] | None = None
    if kind == "dummy":
        tmp = tempfile.TemporaryDirectory(prefix="minisgl-vllm-")
        path, load_format = str(write_config_dir(model_config, Path(tmp.name))), "dummy"
    elif kind == "hf":
        path, load_format = str(where), "auto"
    else:
        raise PeerUnavailable("the vLLM peer takes --model dummy:<preset> or a HF directory, not a GGUF file")
    kw: dict[str, Any] = {
        "model": path,
        "load_format": load_format,
        "skip_tokenizer_init": True,
        "generation_config": "vllm",  # vLLM's sampling defaults, never a model directory's
        "dtype": str(config.torch_dtype(device)).removeprefix("torch."),
        "seed": config.seed,
        "tensor_parallel_size": config.tp,
        "kv_cache_dtype": "auto" if config.kv_cache_dtype == "auto" else "fp8_e4m3",  # as minisgl stores it
    }
    if config.max_model_len:
        kw["max_model_len"] = config.max_model_len
    known = {f.name for f in dataclasses.fields(EngineArgs)}
    for key, value in (overrides or {}).items():
        if key in kw:
            raise PeerUnavailable(f"--vllm-arg {key}: set by the peer itself (from minisgl's flags)")
        if key not in known:
            raise PeerUnavailable(f"--vllm-arg {key}: not one of vLLM's engine arguments (vllm.EngineArgs)")
        kw[key] = value
    label = "vLLM dummy (random) weights" if load_format == "dummy" else path
    return kw, tmp, label, model_config


@contextmanager
def refused_arguments(tmp: tempfile.TemporaryDirectory[str] | None) -> Iterator[None]:
    """vLLM refusing its engine arguments (a bad --vllm-arg value: its config checks raise ValueError, pydantic's
    ValidationError among them, or TypeError) becomes PeerUnavailable with vLLM's reason; the model directory goes."""
    try:
        yield
    except (TypeError, ValueError) as e:
        if tmp is not None:
            tmp.cleanup()
        raise PeerUnavailable(f"vLLM refused its engine arguments: {type(e).__name__}: {e}") from e


def settings_of(vllm_config) -> dict[str, Any]:
    """The SETTINGS values a vLLM engine runs with (JSON-ready)."""
    settings = {}
    for section, name in SETTINGS:
        value = getattr(getattr(vllm_config, section, None), name, None)
        if value is not None:
            settings[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return settings


def description(peer, api: str, vllm_config) -> dict[str, Any]:
    """A vLLM peer's `describe()`: how it was called, the model, and the settings its engine runs with."""
    return {
        "api": api,
        "model": peer.model_config.name or "",
        "device": str(peer.device),
        "dtype": str(peer.dtype).removeprefix("torch."),
        "weights": peer.weights,
        "vllm_version": peer.version,
        "settings": settings_of(vllm_config),
        **({"vllm_args": peer.overrides} if peer.overrides else {}),
    }


class _VllmBase:
    """What both vLLM peers set up alike: vLLM imported, the engine arguments for the run's model (`self._kw`), and
    what `description()` reports."""

    def __init__(self, config: EngineConfig, overrides: dict[str, Any] | None = None, quiet: bool = False) -> None:
        self.vllm = import_vllm()
        self.version = self.vllm.__version__
        self.overrides = overrides or {}
        self._kw, self._tmp, self.weights, self.model_config = engine_arguments(config, self.overrides)
        self.quiet = quiet
        self.device, self.dtype = config.torch_device(), config.torch_dtype(config.torch_device())


class VllmPeer(_VllmBase):
    """The `Peer` interface (minisgl_cli/peers.py) over vLLM's offline `LLM`."""

    def __init__(self, config: EngineConfig, overrides: dict[str, Any] | None = None, quiet: bool = False) -> None:
        super().__init__(config, overrides, quiet)
        with refused_arguments(self._tmp), no_tqdm_bars(self.quiet):
            self.llm = self.vllm.LLM(**self._kw)

    def generate(
        self,
        prompts: Sequence[list[int]],
        output_lens: Sequence[int],
        temperature: float,
        on_done: OnDone | None = None,
    ) -> PeerRun:
        from vllm import SamplingParams

        inputs = [{"prompt_token_ids": list(p)} for p in prompts]  # vllm.inputs.TokensPrompt, a TypedDict
        kw = {"temperature": temperature, "ignore_eos": True, "detokenize": False}
        params = [SamplingParams(max_tokens=n, **kw) for n in output_lens]
        self.llm.reset_prefix_cache()  # every run starts cold, as minisgl's do (it clears its radix cache)
        t0 = time.perf_counter()
        outs = self.llm.generate(inputs, params, use_tqdm=False)
        duration = time.perf_counter() - t0
        done = [
            len(o.outputs[0].token_ids) for o in outs if o.outputs and o.outputs[0].finish_reason in ("length", "stop")
        ]
        if on_done:
            for n in done:
                on_done(n)
        return PeerRun("LLM.generate", done, duration, failed=len(prompts) - len(done))

    def describe(self) -> dict[str, Any]:
        return description(self, "LLM.generate", self.llm.llm_engine.vllm_config)

    def close(self) -> None:
        # vLLM's engine core is a process of its own: end it now rather than at interpreter exit.
        shutdown = getattr(getattr(self.llm.llm_engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()
        del self.llm
        if self._tmp is not None:
            self._tmp.cleanup()


class VllmAsyncPeer(_VllmBase):
    """vLLM's `AsyncLLM`, the engine client `vllm serve` runs behind its HTTP front end (engine core in a process
    of its own, outputs streamed per step), for `bench-trace --engine vllm`: each request streams its new tokens
    (`RequestOutputKind.DELTA`) and is timed as it reaches this process's event loop, as an HTTP client would time
    it less the HTTP hop. Batch limits are the ones `vllm serve` gets (`UsageContext.OPENAI_API_SERVER`).
    Build it inside the running event loop: its engine client binds to that loop."""

    def __init__(self, config: EngineConfig, overrides: dict[str, Any] | None = None, quiet: bool = False) -> None:
        super().__init__(config, overrides, quiet)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        with refused_arguments(self._tmp), no_tqdm_bars(self.quiet):
            args = AsyncEngineArgs(**self._kw)
            self.engine = AsyncLLM.from_engine_args(args, usage_context=UsageContext.OPENAI_API_SERVER)

    def sender(self, temperature: float):
        """A replay `Sender` (minisgl_cli/replay.py) through this engine."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from minisgl_cli.replay import failure

        engine = self.engine

        async def send(item, res, live) -> None:
            params = SamplingParams(
                max_tokens=item.output_len,
                temperature=temperature,
                ignore_eos=True,
                detokenize=False,
                output_kind=RequestOutputKind.DELTA,
            )
            times: list[float] = []
            res.sent = time.perf_counter()
            tokens, cached, finish = 0, None, None
            try:
                async for out in engine.generate({"prompt_token_ids": item.prompt}, params, f"trace-{item.index}"):
                    n = len(out.outputs[0].token_ids) if out.outputs else 0
                    if n:  # one event per output, as an HTTP client sees one chunk per output
                        times.append(time.perf_counter())
                        tokens += n
                        live.tokens += n
                    cached = out.num_cached_tokens if out.num_cached_tokens is not None else cached
                    finish = out.outputs[0].finish_reason if out.outputs else finish
            except Exception as e:  # a failed request fails alone
                res.error = failure(e)
            res.output_tokens, res.cache_hit_tokens = tokens, cached
            res.set_times(times)
            if res.error is None and finish not in ("length", "stop"):
                res.error = f"finished with {finish}"

        return send

    def describe(self) -> dict[str, Any]:
        return description(self, "AsyncLLM.generate (streamed deltas)", self.engine.vllm_config)

    def close(self) -> None:
        self.engine.shutdown()
        if self._tmp is not None:
            self._tmp.cleanup()
