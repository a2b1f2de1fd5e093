#!/usr/bin/env python3
"""Reference replay worker: one batch of a ReplayJob, as the contract in README.md describes.

It reads its batch from the frozen id list, checks the list against the hash the operator
recorded, and hands every event id to `replay_one` at the permitted rate. `replay_one` is the
part each team writes for its own dead-letter store and broker; here it only logs, so the
script can be tried locally:

    printf 'evt-1\\nevt-2\\nevt-3\\n' > /tmp/ids
    REPLAY_OPERATION_ID=replay-test REPLAY_NAME=demo REPLAY_NAMESPACE=default \\
    REPLAY_SOURCE=orders.dlq REPLAY_DESTINATION= REPLAY_EVENT_IDS_FILE=/tmp/ids \\
    REPLAY_EVENT_IDS_SHA256=$(sha256sum /tmp/ids | cut -d' ' -f1) REPLAY_STAGE=main \\
    REPLAY_FIRST_EVENT=1 REPLAY_EVENT_COUNT=2 REPLAY_BATCH_SIZE=1 REPLAY_FIRST_BATCH=1 \\
    REPLAY_RATE_PER_SECOND=5 REPLAY_PAUSE_BETWEEN=0s JOB_COMPLETION_INDEX=1 \\
    python3 worker.py

Exit status 0 means every event of the batch was replayed (now or by an earlier attempt of the
same operation); anything else fails the batch, which stops the Job and halts the replay.
"""

import hashlib
import json
import os
import re
import sys
import time

DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class BatchFailed(Exception):
    """The batch cannot be completed; the message says which event and why."""


def go_duration_seconds(text):
    """Seconds of a Go duration such as 250ms, 10s or 1m30s."""
    if text in ("", "0"):
        return 0.0
    parts = DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise BatchFailed(f"REPLAY_PAUSE_BETWEEN {text!r} is not a Go duration")
    return sum(float(n) * UNIT_SECONDS[u] for n, u in parts)


def env(name):
    value = os.environ.get(name)
    if value is None:
        raise BatchFailed(f"{name} is not set: this program runs inside a ReplayJob's Job")
    return value


def log(**fields):
    """One JSON line per event: the replay's audit trail on the worker's side."""
    print(json.dumps(fields, sort_keys=True), flush=True)


def batch_ids():
    """The ids of this Job index: lines [first + i*size, min(first + (i+1)*size, first + count))."""
    path = env("REPLAY_EVENT_IDS_FILE")
    with open(path, "rb") as f:
        content = f.read()
    digest = hashlib.sha256(content).hexdigest()
    if digest != env("REPLAY_EVENT_IDS_SHA256"):
        raise BatchFailed(f"{path} has sha256 {digest}, not the frozen scope's; refusing to replay")
    ids = content.decode("utf-8").splitlines()
    first = int(env("REPLAY_FIRST_EVENT"))
    count = int(env("REPLAY_EVENT_COUNT"))
    size = int(env("REPLAY_BATCH_SIZE"))
    index = int(env("JOB_COMPLETION_INDEX"))
    start = first + index * size
    end = min(start + size, first + count)
    if not (first <= start < end <= len(ids)):
        raise BatchFailed(f"index {index} selects lines {start}-{end} outside the frozen list")
    return ids[start:end]


def replay_one(event_id, context):
    """Replays one dead-lettered event. Replace this with the team's own code, which must:

    - look the event up in the dead-letter store of context["source"] by its id, and check it
      matches context["filters"] (event type, tenant, time range) when they are given;
    - skip it if this operation already replayed it (a batch can run twice: a Pod retry, or a
      suspend and resume), using context["operation_id"] and the event id as the key;
    - publish the stored payload and headers unchanged, with the original event id, to
      context["destination"] or, when that is empty, to the event's original topic or queue,
      adding only the operation id (e.g. a `replay-operation-id` header);
    - mark the dead letter as replayed by this operation, without deleting it or its failure
      evidence;
    - raise BatchFailed when any of this fails after its own bounded retries.
    """
    log(event_id=event_id, operation_id=context["operation_id"], outcome="would-replay")


def main():
    try:
        ids = batch_ids()
        context = {
            "operation_id": env("REPLAY_OPERATION_ID"),
            "replay": f'{env("REPLAY_NAMESPACE")}/{env("REPLAY_NAME")}',
            "source": env("REPLAY_SOURCE"),
            "destination": env("REPLAY_DESTINATION"),
            "filters": {
                key: os.environ.get(var, "")
                for key, var in [
                    ("event_type", "REPLAY_EVENT_TYPE"),
                    ("tenant", "REPLAY_TENANT"),
                    ("from", "REPLAY_TIME_FROM"),
                    ("to", "REPLAY_TIME_TO"),
                ]
            },
        }
        rate = float(env("REPLAY_RATE_PER_SECOND"))
        if rate <= 0:
            raise BatchFailed("REPLAY_RATE_PER_SECOND must be positive")
        pause = go_duration_seconds(env("REPLAY_PAUSE_BETWEEN"))
        batch = int(env("REPLAY_FIRST_BATCH")) + int(env("JOB_COMPLETION_INDEX"))
        log(batch=batch, stage=env("REPLAY_STAGE"), events=len(ids), replay=context["replay"])
        interval = 1.0 / rate
        next_at = time.monotonic()
        for event_id in ids:
            # Evenly paced: never faster than the approved rate, bursts included.
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            replay_one(event_id, context)
            next_at += interval
        # The next batch (the next Job index) starts only after the pause.
        time.sleep(pause)
        log(batch=batch, outcome="done")
        return 0
    except BatchFailed as failure:
        log(outcome="failed", reason=str(failure))
        return 1


if __name__ == "__main__":
    sys.exit(main())
