#!/usr/bin/env python3
"""How long vCPUs stay preempted, and what lock-holder extensions do to it, from a
`pvschedctl record` trace.

Per VM (the trace's pid): the vCPUs' time running, halted and runnable; the host's
preemptions by length; and those during which a `lock_holder` boost began (an extension):
how long after the preemption it began, how long after that the vCPU ran, and how long the
whole preemption lasted (percentiles, µs).

Usage: scripts/preemptions.py TRACE.json
"""

import argparse
import bisect
import collections

import pvsched_trace

STATES = ("running", "preempted (runnable)", "halted", "woken (runnable)")
LENGTHS_US = ((100, "< 100 µs"), (300, "100-300 µs"), (1000, "0.3-1 ms"), (3000, "1-3 ms"))


def length_bucket(us):
    for limit, name in LENGTHS_US:
        if us < limit:
            return name
    return ">= 3 ms"


def percentiles(values):
    if not values:
        return "-"
    v = sorted(values)
    return " / ".join(f"{v[min(len(v) - 1, int(q * len(v)))]:.0f}" for q in (0.5, 0.9, 0.99))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    a = ap.parse_args()
    all_states, boosts = pvsched_trace.slices(pvsched_trace.load(a.trace))
    states = {
        tid: [x for x in sl if x[2] in STATES] for tid, sl in all_states.items()
    }
    states = {tid: sl for tid, sl in states.items() if sl}
    extensions = {
        tid: [s for s, _, why, _ in bs if why == "lock_holder"] for tid, bs in boosts.items()
    }
    if not states:
        raise SystemExit("no vCPU state slices in the trace")

    per_vm = collections.defaultdict(lambda: {"time": collections.Counter(),
                                              "lengths": collections.Counter(),
                                              "to_boost": [], "to_run": [], "whole": []})
    for tid, slices in states.items():
        starts = sorted(extensions.get(tid, []))
        for start, end, name, pid in slices:
            vm = per_vm[pid]
            vm["time"][name] += end - start
            if name != "preempted (runnable)":
                continue
            i = bisect.bisect_left(starts, start)
            if i < len(starts) and starts[i] < end:
                vm["to_boost"].append(starts[i] - start)
                vm["to_run"].append(end - starts[i])
                vm["whole"].append(end - start)
            else:
                vm["lengths"][length_bucket(end - start)] += 1

    for pid, vm in sorted(per_vm.items()):
        t = vm["time"]
        print(f"VM pid {pid}: " + ", ".join(f"{n} {t[n] / 1e6:.2f} s" for n in STATES))
        buckets = [name for _, name in LENGTHS_US] + [">= 3 ms"]
        print("  preemptions without an extension, by length: "
              + ", ".join(f"{b} {vm['lengths'][b]}" for b in buckets))
        print(f"  preemptions extended: {len(vm['whole'])}; p50 / p90 / p99 µs: "
              f"preemption -> boost {percentiles(vm['to_boost'])}, "
              f"boost -> running {percentiles(vm['to_run'])}, "
              f"whole preemption {percentiles(vm['whole'])}")


if __name__ == "__main__":
    main()
