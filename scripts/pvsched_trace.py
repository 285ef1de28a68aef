"""Reading a `pvschedctl record` trace (Chrome trace JSON) in the scripts beside this file."""

import collections
import json
import re

_VCPU = re.compile(r"vCPU (\d+) \(tid (\d+)\)")
_DECISIONS = re.compile(r"vCPU (\d+) pvsched decisions")


def load(path):
    """The trace's events."""
    with open(path) as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def vcpu_of_decision_track(events):
    """{decision track tid: its vCPU thread's tid}, from the tracks' names (pvschedctl
    gives each vCPU thread a track of pvschedd's decisions beside its own)."""
    threads, decisions = {}, {}
    for e in events:
        if e.get("ph") != "M" or e.get("name") != "thread_name":
            continue
        name = e["args"]["name"]
        if m := _VCPU.fullmatch(name):
            threads[(e["pid"], int(m.group(1)))] = e["tid"]
        elif m := _DECISIONS.fullmatch(name):
            decisions[(e["pid"], int(m.group(1)))] = e["tid"]
    return {d: threads[k] for k, d in decisions.items() if k in threads}


def slices(events):
    """({vCPU tid: [(start, end, state, pid)]}, {vCPU tid: [(start, end, reason, params)]}):
    each vCPU thread's state slices (running, preempted, ...) and its boosts (from its
    decision track), in µs."""
    vcpu_of = vcpu_of_decision_track(events)
    states = collections.defaultdict(list)
    boosts = collections.defaultdict(list)
    for e in events:
        if e.get("ph") != "X":
            continue
        start, end = e["ts"], e["ts"] + e["dur"]
        if e["name"].startswith("boost: "):
            if e["tid"] in vcpu_of:
                params = e.get("args", {}).get("params", "")
                boosts[vcpu_of[e["tid"]]].append((start, end, e["name"][len("boost: "):], params))
        else:
            states[e["tid"]].append((start, end, e["name"], e["pid"]))
    return states, boosts
