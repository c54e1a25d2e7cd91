"""vLLM as the benchmark peer: its offline `LLM` API on the same token-id prompts, one `SamplingParams` per request
(max_tokens = the workload's output length, ignore_eos, the run's temperature).

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from minisgl_cli.peers import OnDone, PeerRun, PeerUnavailable

# (section of vllm_config, attribute) reported with the figure; missing ones (other vLLM versions) are left out.
SETTINGS = (
    ("scheduler_config", "max_num_seqs"),
    ("scheduler_config", "max_num_batched_tokens"),
    ("scheduler_config", "async_scheduling"),
    ("cache_config", "enable_prefix_caching"),
    ("cache_config", "block_size"),
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
        "the GPU machine give --vllm-env /root/vllm-site/vllm-env.sh (docs/benchmarks.md)"
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


class VllmPeer:
    """The `Peer` interface (minisgl_cli/peers.py) over vLLM's offline `LLM`."""

    def __init__(self, config) -> None:
        from engine import weights
        from minisgl_cli.hf_peer import model_config_for

        vllm = import_vllm()
        self.device = config.torch_device()
        if self.device.type != "cuda":
            raise PeerUnavailable(f"the vLLM peer runs on a CUDA GPU (got device {self.device})")
        self.dtype = config.torch_dtype(self.device)
        self.version = vllm.__version__
        kind, where = weights.resolve(config.model)
        self.model_config = model_config_for(config.model)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if kind == "dummy":
            self._tmp = tempfile.TemporaryDirectory(prefix="minisgl-vllm-")
            path, load_format = str(write_config_dir(self.model_config, Path(self._tmp.name))), "dummy"
        elif kind == "hf":
            path, load_format = str(where), "auto"
        else:
            raise PeerUnavailable("the vLLM peer takes --model dummy:<preset> or a HF directory, not a GGUF file")
        self.weights = "vLLM dummy (random) weights" if load_format == "dummy" else path
        kw: dict[str, Any] = {"max_model_len": config.max_model_len} if config.max_model_len else {}
        self.llm = vllm.LLM(
            model=path,
            load_format=load_format,
            skip_tokenizer_init=True,
            generation_config="vllm",  # vLLM's sampling defaults, never a model directory's
            dtype=str(self.dtype).removeprefix("torch."),
            seed=config.seed,
            tensor_parallel_size=config.tp,
            **kw,
        )

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
        vc = self.llm.llm_engine.vllm_config
        settings = {}
        for section, name in SETTINGS:
            value = getattr(getattr(vc, section, None), name, None)
            if value is not None:
                settings[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
        return {
            "api": "LLM.generate",
            "model": self.model_config.name or "",
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "weights": self.weights,
            "vllm_version": self.version,
            "settings": settings,
        }

    def close(self) -> None:
        # vLLM's engine core is a process of its own: end it now rather than at interpreter exit.
        shutdown = getattr(getattr(self.llm.llm_engine, "engine_core", None), "shutdown", None)
        if shutdown is not None:
            shutdown()
        del self.llm
        if self._tmp is not None:
            self._tmp.cleanup()
