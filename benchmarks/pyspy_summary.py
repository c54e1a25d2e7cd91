"""Summarize a `py-spy record -t -i -f raw` file: per thread, the share of samples each function is on the stack
(inclusive) and at the top of it (self). Usage: python benchmarks/pyspy_summary.py raw.txt [--thread NAME] [--top N]"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict

FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def short(frame: str) -> str:
    m = FRAME.match(frame)
    if not m:
        return frame
    return f"{m['fn']} ({m['file'].split('site-packages/')[-1]})"


def main() -> None:
    args = sys.argv[1:]
    top = 40
    want: str | None = None
    if "--top" in args:
        i = args.index("--top")
        top = int(args[i + 1])
        del args[i : i + 2]
    if "--thread" in args:
        i = args.index("--thread")
        want = args[i + 1]
        del args[i : i + 2]
    totals: Counter[str] = Counter()
    incl: dict[str, Counter[str]] = defaultdict(Counter)
    leaf: dict[str, Counter[str]] = defaultdict(Counter)
    for line in open(args[0]):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        head = frames[0]
        name = head.split(": ", 1)[1] if ": " in head else head
        if want and name != want:
            continue
        frames = [short(f) for f in frames[1:]]  # the first is the thread, "thread (id)" or "thread (id): name"
        count = int(n)
        totals[name] += count
        for f in set(frames):
            incl[name][f] += count
        if frames:
            leaf[name][frames[-1]] += count
    for name, total in totals.most_common():
        if total < 50:
            continue
        print(f"== thread {name}: {total} samples")
        print("  inclusive:")
        for f, c in incl[name].most_common(top):
            print(f"    {100 * c / total:5.1f}%  {f}")
        print("  self:")
        for f, c in leaf[name].most_common(top // 2):
            print(f"    {100 * c / total:5.1f}%  {f}")


if __name__ == "__main__":
    main()
