#!/usr/bin/env python3
"""Summarises IPI traces kept with their kernel stacks by pvsched-bench
(PVSCHED_BENCH_IPI_STACKS=1; files *-ipi.trace beside a phase's raw files):
per file, the IPIs by (sender's comm, callsite, the first frames of the
stack), most frequent first.

    scripts/ipi-stacks.py RUN_DIR/parts/*/raw/*-ipi.trace [--top N] [--frames N]
"""
import argparse
import collections
import re
import sys


def summarise(path, frames):
    counts = collections.Counter()
    current, stack, total = None, [], 0

    def flush():
        if current:
            counts[(current[0], current[1], " < ".join(stack[:frames]))] += 1

    with open(path, errors="replace") as f:
        for line in f:
            if ": ipi_send_cpu" in line:
                flush()
                stack = []
                m = re.search(r"^\s*(.*?)-\d+\s+\[", line)
                comm = m.group(1) if m else "?"
                cs = re.search(r"callsite=(\S+)", line)
                current = (comm, cs.group(1).split("+")[0] if cs else "?")
                total += 1
            elif line.strip().startswith("=>"):
                frame = line.strip()[3:].split("+")[0]
                # The tracepoint's own frames say nothing.
                if "ipi_send_cpu" not in frame:
                    stack.append(frame)
    flush()
    return total, counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--frames", type=int, default=5)
    a = ap.parse_args()
    for path in a.traces:
        total, counts = summarise(path, a.frames)
        print(f"== {path}: {total} IPIs")
        for (comm, callsite, stack), n in counts.most_common(a.top):
            print(f"{n:6d}  {comm} | {callsite} | {stack}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
