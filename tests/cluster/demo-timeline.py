#!/usr/bin/env python3
"""The demo's live timeline: a BacklogBudget's reading and decision next to what the node does
with the pods of its Deployment (starting, Ready, stopping): a line whenever the phase, the
decision or the pods change, and every five seconds otherwise; then a short summary.

usage: demo-timeline.py KUBECTL NAMESPACE BUDGET SELECTOR SECONDS
"""

import json
import subprocess
import sys
import time


def kubectl(binary, *args):
    out = subprocess.run([binary, *args], capture_output=True, text=True, check=False)
    return json.loads(out.stdout) if out.returncode == 0 and out.stdout else None


def si(value):
    if value is None:
        return "-"
    for factor, suffix in ((1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.1f}{suffix}"
    return f"{value:.0f}"


def secs(value):
    return "-" if value is None else f"{value:.0f}s"


def pod_counts(pods):
    starting = ready = stopping = 0
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp"):
            stopping += 1
            continue
        conditions = pod.get("status", {}).get("conditions", [])
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            ready += 1
        else:
            starting += 1
    return starting, ready, stopping


def main():
    binary, namespace, budget, selector, seconds = sys.argv[1:6]
    end = time.monotonic() + float(seconds)
    start = time.monotonic()
    print(f"{'time':>5}  {'λ/s':>6} {'backlog':>7} {'oldest/deadline':>15}  {'phase':<18} "
          f"{'want':>4}  pods: {'ready':>5} {'starting':>8} {'stopping':>8}")
    last, last_print, peak_ready, changes = None, 0.0, 0, 0
    while time.monotonic() < end:
        bb = kubectl(binary, "-n", namespace, "get", "backlogbudget", budget, "-o", "json") or {}
        pods = kubectl(binary, "-n", namespace, "get", "pods", "-l", selector, "-o", "json") or {}
        status = bb.get("status", {})
        observed = status.get("observed", {})
        starting, ready, stopping = pod_counts(pods.get("items", []))
        peak_ready = max(peak_ready, ready)
        deadline = bb.get("spec", {}).get("completionDeadline", "-")
        reading = (
            si(observed.get("produceRate")),
            si(observed.get("backlog")),
            f"{secs(observed.get('oldestUnfinishedAge'))}/{deadline}",
            status.get("phase", "-"),
            status.get("desiredReplicas", "-"),
            ready, starting, stopping,
        )
        now = time.monotonic()
        if last is not None and reading[4] != last[4]:
            changes += 1
        # The readings (λ, backlog, age) move every second; the events are the rest.
        if last is None or reading[3:] != last[3:] or now - last_print >= 5:
            elapsed = int(now - start)
            print(f"{elapsed // 60:>2}:{elapsed % 60:02}  {reading[0]:>6} {reading[1]:>7} "
                  f"{reading[2]:>15}  {reading[3]:<18} {reading[4]!s:>4}         "
                  f"{reading[5]:>5} {reading[6]:>8} {reading[7]:>8}", flush=True)
            last, last_print = reading, now
        time.sleep(1)
    print(f"summary: Ready consumer pods peaked at {peak_ready}; the budget changed its "
          f"replica count {changes} times")


if __name__ == "__main__":
    main()
