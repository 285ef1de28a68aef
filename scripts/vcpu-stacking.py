#!/usr/bin/env python3
"""How often two vCPU threads share one host CPU while another idles.

Samples /proc/<pid>/task/<tid>/stat of the given threads every ~0.3 ms for
SECONDS and reports how often both were runnable on the same CPU ("stacked":
one of them waits), split by whether each was RT at that moment; then the
host's idle time and the busiest threads over the same window (from
/proc/stat and every thread's utime + stime).

Usage: vcpu-stacking.py SECONDS TID TID
Used for benchmarks/LOG.md, "Rivals" (run it during a pvsched-bench lock window).
"""
import argparse
import collections
import glob
import os
import time


def thread_ticks():
    ticks = {}
    for task in glob.glob("/proc/[0-9]*/task/[0-9]*"):
        try:
            with open(task + "/stat") as f:
                stat = f.read()
            with open(task.split("/task/")[0] + "/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ticks[(comm, name, task)] = int(fields[11]) + int(fields[12])
    return ticks


def cpu_totals():
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seconds", type=float)
    ap.add_argument("tids", nargs=2)
    a = ap.parse_args()

    files = [open(f"/proc/{t}/stat", "rb", buffering=0) for t in a.tids]
    ticks0, cpu0 = thread_ticks(), cpu_totals()
    seen = collections.Counter()
    samples = 0
    end = time.time() + a.seconds
    while time.time() < end:
        now = []
        for f in files:
            f.seek(0)
            x = f.read().decode().rsplit(")", 1)[1].split()
            now.append((x[0], int(x[36]), int(x[38]) > 0))  # state, cpu, RT policy
        samples += 1
        (s0, c0, rt0), (s1, c1, rt1) = now
        if s0 == "R" and s1 == "R" and c0 == c1:
            seen["stacked, RT: %s/%s" % ("yes" if rt0 else "no", "yes" if rt1 else "no")] += 1
        time.sleep(0.0003)
    ticks1, cpu1 = thread_ticks(), cpu_totals()

    stacked = sum(seen.values())
    print(f"samples {samples}; both runnable on one CPU {100 * stacked / samples:.1f} %")
    for k, v in sorted(seen.items()):
        print(f"  {k}: {100 * v / samples:.1f} %")
    d = [y - x for x, y in zip(cpu0, cpu1)]
    print(f"host idle {100 * d[3] / sum(d):.1f} %")
    total = a.seconds * os.sysconf("SC_CLK_TCK") * os.cpu_count()
    busiest = collections.Counter()
    for k, v in ticks1.items():
        busiest[(k[0], k[1])] += v - ticks0.get(k, 0)
    for (comm, name), v in busiest.most_common(6):
        print(f"  {comm} / {name}: {100 * v / total:.1f} % of the machine")


if __name__ == "__main__":
    main()
