"""Hugging Face transformers as the benchmark peer: the same weights, the same workload, its own batching.

Which weights the peer gets:
- the embedded default or any .gguf file: transformers dequantizes the same GGUF file with its own reader (which
  ignores rope_freqs.weight, Llama 3.1 and later: its rope frequencies are then divided by the file's factors here);
- a HF directory: `from_pretrained` on the same directory;
- a dummy preset: transformers' model class built from `ModelConfig.to_hf_dict()`, with the very weights the
  engine's dummy loader makes (built once here through `engine.loader.load_model`, copied in by HF names).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from minisgl_cli.peers import OnDone, PeerRun, PeerUnavailable, no_tqdm_bars


def load_hf_model(spec: str | None, device, dtype, quiet: bool = False):
    """transformers' model for a --model value (the module docstring says which weights); `quiet`: no progress bar."""
    from transformers import AutoModelForCausalLM

    from engine import weights
    from engine.model_source import resolve

    kind, where = resolve(spec)
    if kind == "gguf":
        path = Path(where)
        with no_tqdm_bars(quiet):
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
        _apply_rope_freqs(model, weights.gguf_config(path))
    elif kind == "hf":
        with no_tqdm_bars(quiet):
            model = AutoModelForCausalLM.from_pretrained(str(where), dtype=dtype)
    else:
        from engine.loader import load_model

        ours = load_model(spec, device, dtype, with_tokenizer=False).model  # the engine's exact dummy weights
        model = hf_twin(ours, device, dtype)
        del ours
    return model.to(device).eval()


def _apply_rope_freqs(model, cfg) -> None:
    """A GGUF's llama3 rope (its rope_freqs.weight factors, which the engine divides each frequency by) on the
    transformers model read from the same file: its GGUF reader builds the rope without them."""
    s = cfg.rope_scaling
    if not s or s.get("rope_type") != "freq_factors":
        return
    rotary = model.model.rotary_emb
    if rotary.rope_type != "default":  # a reader that maps the factors itself: nothing to add
        raise ValueError(f"transformers built a {rotary.rope_type!r} rope from a GGUF with rope_freqs.weight")
    import torch

    factors = torch.tensor(s["factors"], dtype=rotary.inv_freq.dtype, device=rotary.inv_freq.device)
    rotary.inv_freq.div_(factors)
    rotary.original_inv_freq.div_(factors)


def hf_twin(ours, device, dtype):
    """transformers' own model class for `ours.cfg`, holding ours' very weights (tensor-parallel size 1)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    d = ours.cfg.to_hf_dict()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(d.pop("model_type"), **d), dtype=dtype)
    state = ours.hf_state_dict()
    for key in [k for k in model.state_dict() if k.endswith(".experts.gate_up_proj")]:
        # transformers 5 keeps each layer's experts stacked ([E, 2I, H] gate rows then up rows; [E, H, I]), as the
        # engine does; its checkpoints (and hf_state_dict) name them one by one.
        p, n = key.removesuffix("gate_up_proj"), ours.cfg.num_experts
        state[key] = torch.stack(
            [torch.cat([state.pop(f"{p}{e}.gate_proj.weight"), state.pop(f"{p}{e}.up_proj.weight")]) for e in range(n)]
        )
        state[p + "down_proj"] = torch.stack([state.pop(f"{p}{e}.down_proj.weight") for e in range(n)])
    missing, unexpected = model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    if unexpected or set(missing) - ({"lm_head.weight"} if ours.cfg.tie_word_embeddings else set()):
        raise ValueError(f"transformers twin mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.eval()


def _generation_config(temperature: float):
    from transformers import GenerationConfig

    # eos_token_id=None: continuous batching then disables EOS (-1), i.e. ignore_eos; top_k=0 turns off HF's
    # default top-k of 50 so both engines sample from the same distribution (greedy takes none: transformers warns
    # that sampling flags beside do_sample=False are ignored).
    if temperature == 0:
        return GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0)
    return GenerationConfig(
        do_sample=True, temperature=temperature, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=0
    )


def has_generate_batch(model) -> bool:
    return hasattr(model, "init_continuous_batching")


def batches_continuously(api: str) -> bool:
    """Whether the peer runs generate_batch under `api` (auto: where transformers has it), known without a model:
    every model that generates takes it from GenerationMixin."""
    if api != "auto":
        return api == "generate_batch"
    try:
        from transformers import GenerationMixin
    except ImportError:  # the peer reports it where it loads
        return False
    return hasattr(GenerationMixin, "init_continuous_batching")


def run_generate_batch(
    model, prompts: Sequence[list[int]], output_lens: Sequence[int], temperature: float, on_done: OnDone | None = None
) -> PeerRun:
    """transformers' continuous batching manager: one add_request per prompt with its own max_new_tokens."""
    import torch

    kw: dict[str, Any] = {}
    if "workload_hints" in inspect.signature(model.init_continuous_batching).parameters:
        # What generate_batch itself passes: buffers sized for this workload, not for all free memory.
        from transformers.generation.continuous_batching.utils import WorkloadHints

        kw["workload_hints"] = WorkloadHints(
            max_prompt_length=max(map(len, prompts)), max_generated_length=max(output_lens), num_requests=len(prompts)
        )
    params = inspect.signature(model.init_continuous_batching).parameters
    if model.device.type == "cpu" and "continuous_batching_config" in params:
        # On a GPU transformers sizes its KV cache from free device memory, as its users get it; on the CPU that
        # rule takes most of the machine's RAM (13 GB of 24 here) and writes it all before the first token. A
        # cache that holds the whole workload at once is all it can use.
        # The page-size field's name differs between transformers releases (page_size in 5.23, not in the GPU
        # machine's); without one it keeps its own sizing.
        from transformers import ContinuousBatchingConfig

        default = ContinuousBatchingConfig()
        page = next((v for k in ("page_size", "block_size") if isinstance(v := getattr(default, k, None), int)), None)
        if page and "num_blocks" in inspect.signature(ContinuousBatchingConfig).parameters:
            blocks = sum(-(-(len(p) + n) // page) for p, n in zip(prompts, output_lens)) + len(prompts)
            kw["continuous_batching_config"] = ContinuousBatchingConfig(num_blocks=blocks)
    config = _generation_config(temperature)
    config.eos_token_id = -1  # what continuous batching makes of None (EOS off), without its warning on every run
    manager = model.init_continuous_batching(generation_config=config, **kw)
    extra = {"eos_token_id": -1} if "eos_token_id" in inspect.signature(manager.add_request).parameters else {}
    if hasattr(manager, "warmup"):
        manager.warmup()  # CUDA graph capture: kept out of the timing
    manager.start()
    try:
        with torch.no_grad():
            t0 = time.perf_counter()
            rids = [manager.add_request(list(p), max_new_tokens=n, **extra) for p, n in zip(prompts, output_lens)]
            done: dict[str, int] = {}
            while len(done) < len(rids):
                result = manager.get_result(timeout=1)
                if result is None:
                    if not manager.is_running():
                        raise RuntimeError("transformers' continuous batching thread stopped before finishing")
                    continue
                if result.is_finished():
                    if result.error:
                        raise RuntimeError(f"transformers request {result.request_id} failed: {result.error}")
                    done[result.request_id] = len(result.generated_tokens)
                    if on_done:
                        on_done(done[result.request_id])
            duration = time.perf_counter() - t0
    finally:
        manager.stop(block=True)
    return PeerRun("generate_batch", [done[r] for r in rids], duration)


def run_generate(
    model,
    prompts: Sequence[list[int]],
    output_lens: Sequence[int],
    temperature: float,
    batch_size: int,
    on_done: OnDone | None = None,
) -> PeerRun:
    """Padded static batches through `model.generate` (left padding; every request in a batch runs to the batch's
    longest output, only the tokens it asked for are counted)."""
    import torch

    dev = model.device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]), reverse=True)  # less padding
    made = [0] * len(prompts)
    t0 = time.perf_counter()
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        mask = torch.zeros(len(idx), width, dtype=torch.long)
        for row, i in enumerate(idx):
            ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        n = max(output_lens[i] for i in idx)
        with torch.no_grad():
            out = model.generate(
                input_ids=ids.to(dev),
                attention_mask=mask.to(dev),
                max_new_tokens=n,
                min_new_tokens=n,
                generation_config=_generation_config(temperature),
            )
        for i in idx:
            made[i] = min(output_lens[i], out.shape[1] - width)
            if on_done:
                on_done(made[i])
    return PeerRun("generate", made, time.perf_counter() - t0)


def run_peer(
    model,
    prompts: Sequence[list[int]],
    output_lens: Sequence[int],
    temperature: float,
    api: str = "auto",
    batch_size: int = 64,
    on_done: OnDone | None = None,
) -> PeerRun:
    if api == "auto":
        api = "generate_batch" if has_generate_batch(model) else "generate"
    if api == "generate_batch":
        if not has_generate_batch(model):
            raise ValueError("this transformers version has no continuous batching (generate_batch)")
        return run_generate_batch(model, prompts, output_lens, temperature, on_done)
    return run_generate(model, prompts, output_lens, temperature, batch_size, on_done)


class TransformersPeer:
    """The `Peer` interface (minisgl_cli/peers.py) over transformers: continuous batching (`generate_batch`) or
    padded static batches (`generate`)."""

    def __init__(self, config: EngineConfig, api: str = "auto", batch_size: int = 64, quiet: bool = False) -> None:
        import torch

        from engine.weights import model_config_for

        try:
            import transformers  # noqa: F401
        except ImportError as e:
            raise PeerUnavailable(f"the transformers peer needs the transformers package ({e})") from e
        if config.kv_cache_dtype != "auto":  # a comparison runs both engines on the same numbers
            raise PeerUnavailable(f"the transformers peer has no {config.kv_cache_dtype} KV cache")
        self.device = config.torch_device()
        self.dtype = config.torch_dtype(self.device)
        self.api, self.batch_size = api, batch_size
        self.name = model_config_for(config.model).name or str(config.model)
        torch.manual_seed(config.seed)
        self.model = load_hf_model(config.model, self.device, self.dtype, quiet)

    def generate(
        self,
        prompts: Sequence[list[int]],
        output_lens: Sequence[int],
        temperature: float,
        on_done: OnDone | None = None,
    ) -> PeerRun:
        return run_peer(self.model, prompts, output_lens, temperature, self.api, self.batch_size, on_done)

    def describe(self) -> dict[str, Any]:
        api = self.api if self.api != "auto" else "generate_batch" if has_generate_batch(self.model) else "generate"
        return {
            "api": api,
            "model": self.name,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
        }

    def close(self) -> None:
        del self.model
