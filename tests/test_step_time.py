"""engine/step_time.py: the least-squares fit of a step's time behind --mixed-step-ms, on steps drawn from a known
law, and the prefill share it gives."""

from __future__ import annotations

import numpy as np
import pytest

from engine.step_time import StepTimeFit

A, B, C = 2e-3, 1.7e-8, 6e-6  # 2 ms a step, 1.7 ms per 100 k tokens of context, 6 ms per 1 k prefill tokens


def observed(fit: StepTimeFit, n: int, seed: int = 0, noise: float = 0.0, prefill_share: float = 0.5) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(n):
        kv = int(rng.integers(0, 900_000))
        prefill = int(rng.integers(1, 2048)) if rng.random() < prefill_share else 0
        fit.observe(kv, prefill, A + B * kv + C * prefill + noise * rng.standard_normal())


def test_the_fit_finds_the_law_and_sizes_the_share_to_the_target() -> None:
    fit = StepTimeFit(target_s=0.020)
    observed(fit, 512)
    assert fit.coef == pytest.approx((A, B, C), rel=1e-6)
    for kv in (5_000, 123_457, 654_321):  # shares of 2,985.8, 2,650.2 and 1,146.1 tokens
        want = int((0.020 - A - B * kv) / C)
        assert fit.prefill_budget(kv, fallback=1024, most=8192) == want
    # where the context alone passes the target, a waiting prompt still moves by min_tokens; never past `most`
    assert fit.prefill_budget(1_200_000, fallback=1024, most=8192) == fit.min_tokens
    assert fit.prefill_budget(0, fallback=1024, most=1000) == 1000
    assert fit.prefill_budget(1_200_000, fallback=1024, most=64) == 64  # the step's whole budget is smaller still


def test_noisy_steps_still_give_the_law() -> None:
    fit = StepTimeFit(target_s=0.020)
    observed(fit, 2048, seed=1, noise=1e-3)  # 1 ms of jitter a step, as on a busy GPU host
    a, b, c = fit.coef or (0.0, 0.0, 0.0)
    assert a == pytest.approx(A, abs=3e-4) and b == pytest.approx(B, rel=0.1) and c == pytest.approx(C, rel=0.1)


def test_no_fit_until_steps_with_and_without_prefill_are_both_seen() -> None:
    fit = StepTimeFit(target_s=0.020)
    observed(fit, 512, prefill_share=0.0)  # decode-only steps: the prefill tokens' cost is unknown
    assert fit.coef is None and fit.prefill_budget(0, fallback=1024, most=8192) == 1024
    observed(fit, fit.min_steps - 1, prefill_share=1.0)
    assert fit.coef is None
    observed(fit, fit.refit, seed=2, prefill_share=1.0)
    assert fit.coef == pytest.approx((A, B, C), rel=1e-6)


def test_the_window_forgets_old_steps() -> None:
    """A machine that slows down (or a workload that changes) is followed: only the last `window` steps count."""
    fit = StepTimeFit(target_s=0.020, window=256)
    observed(fit, 256)
    rng = np.random.default_rng(3)
    for _ in range(256):  # every step now takes twice as long
        kv, prefill = int(rng.integers(0, 900_000)), int(rng.integers(0, 2048)) * int(rng.random() < 0.5)
        fit.observe(kv, prefill, 2 * (A + B * kv + C * prefill))
    assert len(fit.steps) == 256 and fit.coef == pytest.approx((2 * A, 2 * B, 2 * C), rel=1e-6)


def test_a_prefill_cost_of_zero_or_less_is_not_used() -> None:
    """Steps whose time does not grow with their prefill tokens (the host, not the GPU, sets the pace) give no
    share to size: the fallback stays."""
    fit = StepTimeFit(target_s=0.020)
    rng = np.random.default_rng(4)
    for i in range(512):
        kv, prefill = int(rng.integers(0, 900_000)), int(rng.integers(1, 2048)) * (i % 2)
        fit.observe(kv, prefill, A + B * kv - 1e-7 * prefill)
    assert fit.coef is None and fit.prefill_budget(0, fallback=1024, most=8192) == 1024
