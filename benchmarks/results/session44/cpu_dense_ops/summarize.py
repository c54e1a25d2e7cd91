"""Output tok/s of each run in ab.sh's JSON files: C small ops on (ops1) against off (ops0), per round and batch."""

import json
from pathlib import Path

here = Path(__file__).parent
for n in (1, 16):
    for ops in (1, 0):
        rows = []
        for f in sorted(here.glob(f"r*_ops{ops}_n{n}.json")):
            d = json.loads(f.read_text())
            runs = " / ".join(f"{r['output_throughput']:.1f}" for r in d["runs"])
            rows.append(f"{d['output_throughput']:.1f} ({runs})")
        print(f"{n:>2} requests, C ops {'on ' if ops else 'off'}: " + "; ".join(rows))
