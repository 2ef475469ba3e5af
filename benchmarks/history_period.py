"""GPU time within a period (``elastictrain history --by user -S/-E``): the coordinator's kept spans
against reading the whole event log.

Writes an event log of ``--jobs`` jobs over 30 days into a coordinator database, as an older
coordinator wrote it (events only: each job starts, trains, is preempted, resumes, trains and
finishes: 7 events a job), then starts a real coordinator process on it (SQLite) and times:

* ``history_period_catch_up``: the coordinator's start on that log, which folds every event into
  spans of GPU time once (coordinator/gpu_time.py); a database written by this release never needs it;
* ``history_period_events_path``: the baseline, what ``history --by -S`` did before: read the whole
  log through ``GET /v1/cluster/events``, page by page, and fold it on the client
  (``elastictrain.usage``);
* ``history_period_spans_path``: ``GET /v1/cluster/usage?since=&until=`` (what it does now), for the
  last day and for the whole 30 days;

and checks that both give every job the same GPU-seconds. Prints ``name: value unit`` lines;
``--quick`` writes 3,000 jobs instead of 30,000.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastictrain import CoordinatorClient  # noqa: E402
from elastictrain.coordinator.process import CoordinatorProcess  # noqa: E402
from elastictrain.coordinator.store import EventRow, SQLiteStore  # noqa: E402
from elastictrain.usage import all_events, gpu_spans, within  # noqa: E402

DAY = 86_400.0


def write_log(path: str, jobs: int, now: float, seed: int = 1) -> int:
    """``jobs`` jobs' events over the 30 days before ``now``; returns how many events."""
    rng = random.Random(seed)
    rows = []
    for i in range(jobs):
        job, gpus = str(i + 1), rng.choice((1, 1, 2, 4, 8))
        t = now - 30 * DAY + rng.uniform(0, 29 * DAY)
        where = [["n%d" % rng.randrange(16), gpus]]
        steps = [(0.0, "submit", {}), (rng.uniform(0, 600), "start", {"placement": where, "run": 1}),
                 (rng.uniform(20, 60), "first_step", {"run": 1}),
                 (rng.uniform(600, 20_000), "preempted", {"run": 1}),
                 (rng.uniform(60, 3_600), "resume", {"placement": where, "run": 2}),
                 (rng.uniform(20, 60), "first_step", {"run": 2}),
                 (rng.uniform(600, 20_000), "finish", {"run": 2})]
        for dt, kind, detail in steps:
            t += dt
            rows.append((min(t, now - 1.0), kind, job, detail))
    rows.sort(key=lambda r: r[0])
    store = SQLiteStore(path)
    try:
        with store.transaction() as tx:
            for seq, (t, kind, job, detail) in enumerate(rows, 1):
                tx.add_event(EventRow(seq, t, kind, job, "n0", json.dumps(detail)))
    finally:
        store.close()
    return len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=None, help="jobs in the log (default 30,000; --quick 3,000)")
    ap.add_argument("--repeat", type=int, default=3, help="queries of each kind (the median is printed)")
    args = ap.parse_args()
    jobs = args.jobs or (3_000 if args.quick else 30_000)
    with tempfile.TemporaryDirectory(prefix="et-bench-history-") as tmp:
        now = time.time()
        db = os.path.join(tmp, "c.db")
        events = write_log(db, jobs, now)
        print(f"# {jobs:,} jobs, {events:,} events over 30 days; a coordinator (SQLite) on this machine, "
              f"{os.cpu_count()} CPUs; median of {args.repeat}")
        proc = CoordinatorProcess(db, os.path.join(tmp, "token"), log_file=os.path.join(tmp, "coordinator.log"),
                                  extra_args=("--policy", "fifo"))
        t = time.perf_counter()
        url = proc.start(timeout=600.0)
        catch_up = time.perf_counter() - t
        try:
            with CoordinatorClient(url, proc.token, timeout=600.0) as c:
                since = time.time() - DAY
                old, new, whole = [], [], []
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    log = all_events(c)
                    end = time.time()
                    base = within(gpu_spans(log, end, service=True), since, end)
                    old.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    got = c.gpu_time(since)
                    new.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    c.gpu_time()
                    whole.append(time.perf_counter() - t)
                mine = {u.job: u.service_gpu_seconds for u in got.jobs if u.service_gpu_seconds}
                # (the two reads are a moment apart: a job running then counts up to each one's now)
                assert set(mine) == set(base) and all(abs(mine[j] - base[j]) <= 10.0 * 8 for j in base), \
                    "the spans and the event log disagree"
        finally:
            proc.stop()
        o, n, w = statistics.median(old), statistics.median(new), statistics.median(whole)
        print(f"history_period_events: {events} events")
        print(f"history_period_jobs_in_last_day: {len(base)} jobs")
        print(f"history_period_catch_up: {catch_up:.3f} s")
        print(f"history_period_events_path: {o:.3f} s")
        print(f"history_period_spans_path: {n:.4f} s")
        print(f"history_period_spans_path_whole_30_days: {w:.4f} s")
        print(f"history_period_spans_vs_events_path: {n / o:.4f} x")


if __name__ == "__main__":
    main()
