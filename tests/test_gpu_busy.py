"""GPU-busy share from NVML's samples (minisgl_cli/gpu_busy.py): which samples belong to a run. The sampling itself
needs a GPU (tests/test_gpu.py::test_gpu_busy_tells_an_idle_gpu_from_a_fed_one)."""

from minisgl_cli.gpu_busy import share_inside

PERIOD = 200_000  # us, an H100's sample period


def test_a_sample_straddling_the_start_is_left_out():
    start = 10_000_000
    # stamped at the end of each period: the first period began 150 ms before the run (the GPU idle then)
    seen = {start + 50_000: 25.0} | {start + 50_000 + i * PERIOD: 99.0 for i in range(1, 10)}
    count, share = share_inside(seen, start, start + 2_000_000)
    assert count == 9 and share is not None and abs(share - 0.99) < 1e-9


def test_samples_after_the_end_are_left_out_and_whole_periods_kept():
    start = 0
    seen = {PERIOD * i: float(i) for i in range(1, 8)}  # periods [0, 200 ms], [200, 400], ...
    count, share = share_inside(seen, start, 5 * PERIOD)
    assert count == 5 and share == (1 + 2 + 3 + 4 + 5) / 5 / 100


def test_one_sample_counts_as_it_is_and_none_gives_none():
    assert share_inside({1_000: 50.0}, 0, 2_000) == (1, 0.5)
    assert share_inside({}, 0, 2_000) == (0, None)
