#!/usr/bin/env python3
"""Where a VM's boost budget goes, per 100 ms, from a `pvschedctl record` trace.

For each vCPU thread, intersects its "running" slices with its boost slices
(the decision track) and prints, per 100 ms bin over all vCPUs: boosted
on-CPU ms by the reason in force, the demoted part (boosts at RT priority 1),
and the charge the boost budget sees (demoted time counted `--demoted-charge`
times), beside what the budget earns per bin (`--share` permille of each
vCPU's time). Also lists runs longer than `--long-ms`.

Usage: scripts/boost-charge.py TRACE.json [--share 300] [--demoted-charge 3]
"""

import argparse
import collections

import pvsched_trace

BIN_US = 100_000


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--share", type=int, default=300, help="boost_share_permille")
    ap.add_argument("--demoted-charge", type=int, default=3)
    ap.add_argument("--long-ms", type=float, default=4.0)
    a = ap.parse_args()
    states, boosts = pvsched_trace.slices(pvsched_trace.load(a.trace))
    running = {
        tid: [(s, e) for s, e, name, _ in sl if name == "running"] for tid, sl in states.items()
    }
    running = {tid: runs for tid, runs in running.items() if runs}
    if not running or not boosts:
        raise SystemExit("no running or boost slices in the trace")
    bins = collections.defaultdict(collections.Counter)
    for tid, runs in running.items():
        runs.sort()
        first = 0
        for start, end, why, params in sorted(boosts.get(tid, [])):
            demoted = params.endswith("/1")
            # Runs and boosts are each disjoint per thread: walk both in order.
            while first < len(runs) and runs[first][1] <= start:
                first += 1
            for rs, re in runs[first:]:
                if rs >= end:
                    break
                s, e = max(start, rs), min(end, re)
                while s < e:
                    b = int(s // BIN_US)
                    nxt = min(e, (b + 1) * BIN_US)
                    bins[b][why] += nxt - s
                    bins[b]["charge"] += (nxt - s) * (a.demoted_charge if demoted else 1)
                    if demoted:
                        bins[b]["demoted"] += nxt - s
                    s = nxt
    earn = len(running) * BIN_US * a.share / 1000 / 1000
    print(f"bin (s) | charge ms (earned {earn:.0f} per bin) | demoted ms | boosted on-CPU ms by reason")
    for b in sorted(bins):
        c = bins[b]
        reasons = ", ".join(
            f"{k} {v / 1000:.1f}"
            for k, v in sorted(c.items(), key=lambda kv: -kv[1])
            if k not in ("charge", "demoted")
        )
        print(f"{b / 10:5.1f} | {c['charge'] / 1000:6.1f} | {c['demoted'] / 1000:5.1f} | {reasons}")
    long_runs = sorted(
        (
            (s / 1e6, (e - s) / 1000, tid)
            for tid, runs in running.items()
            for s, e in runs
            if (e - s) / 1000 > a.long_ms
        ),
        key=lambda r: r[0],
    )
    print(f"\nruns longer than {a.long_ms} ms (s, ms, tid): {[(round(t, 2), round(d, 1), tid) for t, d, tid in long_runs]}")


if __name__ == "__main__":
    main()
