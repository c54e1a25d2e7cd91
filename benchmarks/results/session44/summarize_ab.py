"""Output tok/s of an A/B folder's bench-offline runs (r{round}_{label}_n{requests}.json): the median and the runs of
each round, per label and batch.

    python3 summarize_ab.py cpu_dense_ops ops1 ops0
    python3 summarize_ab.py cpu_dense_matmul new prev off
"""

import json
import sys
from pathlib import Path

folder, labels = Path(__file__).parent / sys.argv[1], sys.argv[2:]
for n in (1, 16):
    for label in labels:
        rows = []
        for f in sorted(folder.glob(f"r*_{label}_n{n}.json")):
            d = json.loads(f.read_text())
            runs = " / ".join(f"{r['output_throughput']:.1f}" for r in d["runs"])
            rows.append(f"{d['output_throughput']:.1f} ({runs})")
        print(f"{n:>2} requests, {label:>4}: " + "; ".join(rows))
