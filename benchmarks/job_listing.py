"""Job listings on a coordinator with a long history: ``GET /v1/cluster`` (``elastictrain status``,
the status page) as it is now, against the reply every listing gave before, which carried every
job the coordinator ever had (``?ended=all``, measured in the same run).

Starts a real coordinator process (SQLite, ``--policy fifo``, no nodes), submits 20 jobs that wait,
then ``--jobs`` jobs as job arrays and cancels them (ended jobs, as a busy cluster's history is), and
times:

* ``listing_default_median``: ``GET /v1/cluster``: the jobs that have not ended and the 1000 that
  ended last; ``listing_status_cli_median``: what ``elastictrain status`` asks for (``ended=10``);
* ``listing_user_filter_median``: what ``elastictrain status -u alice`` asks for (``ended=10&user=alice``:
  squeue's filter, applied by the coordinator; the first tenth of the jobs are hers), which before asked
  for every job and filtered them itself;
* ``listing_all_median``: ``GET /v1/cluster?ended=all`` in one reply, the baseline;
* ``listing_all_paged_median``: every job as ``status --all`` and ``history`` ask for them now: in
  pages of the client's size (``PAGE``, 500: ``limit=500``, then ``after=`` the last page's ``next``),
  joined by the client;
* ``health_p99_*``: ``GET /v1/health`` latency from this process while another one lists jobs in a
  loop (``idle``: while nothing else is asked): the coordinator answers every client on one event
  loop, so a big listing holds up a worker's shard lease or heartbeat as long as it takes
  (``while_listing_all``: every job in one reply, the baseline; ``_paged``: in pages);
* ``metrics_median``, ``users_median``, ``projects_median``: ``GET /metrics`` (a Prometheus scrape),
  ``/v1/cluster/users`` and ``/v1/cluster/projects`` with that history, against the same requests
  before it (``*_fresh_median``, the 20 waiting jobs only; ``*_vs_fresh``): the coordinator sums the
  ended jobs as they end, so these read the jobs not ended, not the history (as its users' usage
  samples do every 5 s).

* ``memory_per_ended_job``: the coordinator's resident memory after the history, less before it, per
  ended job; ``_after_restart``: the same for a coordinator started again on that database (against
  its memory with the 20 waiting jobs only; ``restart_seconds``: how long that start took);
  ``record_bytes_packed`` against ``record_bytes_unpacked``: what an ended job's record takes as the
  coordinator keeps it (all but the 1000 that ended last are packed: coordinator/records.py) and as a
  record, measured in this process on the same records (``record_packed_vs_unpacked``).

Prints ``name: value unit`` lines; ``--quick`` submits 3,000 jobs instead of 30,000.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import multiprocessing
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from elastictrain import CoordinatorClient  # noqa: E402
from elastictrain.coordinator.process import CoordinatorProcess  # noqa: E402
from elastictrain.runtime.client import PAGE  # noqa: E402
from elastictrain.wire import JobSubmit  # noqa: E402


def fill(c: CoordinatorClient, jobs: int) -> None:
    """``jobs`` ended jobs (arrays of up to 1,000 tasks, each cancelled while held; the first tenth
    alice's)."""
    for user, left in (("alice", max(1, jobs // 10)), ("default", jobs - max(1, jobs // 10))):
        while left > 0:
            n = min(1000, left)
            for j in c.submit_array(JobSubmit(["sweep.py"], "/tmp", array=f"0-{n - 1}", hold=True, user=user)).jobs:
                c.cancel(j.id)
            left -= n


def scrapes(c: CoordinatorClient, url: str, token: str, repeat: int) -> tuple[float, float, float]:
    """Median seconds of ``GET /metrics`` (a Prometheus scrape, on a kept connection), ``GET
    /v1/cluster/users`` and ``GET /v1/cluster/projects`` (``elastictrain users``, ``projects``)."""
    host, port = url.split("//")[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def scrape() -> None:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
        reply = conn.getresponse()
        text = reply.read()
        assert reply.status == 200 and b"elastictrain_jobs{" in text, (reply.status, text[:200])

    try:
        return timed(scrape, repeat), timed(lambda: c.users(), repeat), timed(lambda: c.projects(), repeat)
    finally:
        conn.close()


def timed(call, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def _load(url: str, token: str, ended, page, stop) -> None:
    """(In a process of its own, so that the probe shares no interpreter with it.)"""
    c = CoordinatorClient(url, token, timeout=60.0)
    while not stop.is_set():
        c.cluster_status(ended=ended, page=page)
    c.close()


def health_under(url: str, token: str, ended, window: float, page=None) -> float:
    """The 99th percentile of health-check latency while another process lists jobs in a loop
    (``ended``: its listing's ``ended``, in pages of ``page`` jobs, None: in one reply; ``"none"``:
    no listing)."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    load = ctx.Process(target=_load, args=(url, token, ended, page, stop), daemon=True) if ended != "none" else None
    if load is not None:
        load.start()
        time.sleep(3.0)  # (its interpreter's start)
    probe = CoordinatorClient(url, token, timeout=60.0)
    lat, end = [], time.monotonic() + window
    while time.monotonic() < end:
        t0 = time.perf_counter()
        probe.health()
        lat.append(time.perf_counter() - t0)
        time.sleep(0.005)
    stop.set()
    if load is not None:
        load.join(timeout=120)
    probe.close()
    lat.sort()
    return lat[min(len(lat) - 1, int(0.99 * len(lat)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=None, help="ended jobs (default 30,000; --quick 3,000)")
    ap.add_argument("--repeat", type=int, default=None, help="listings of each kind (the median is printed)")
    args = ap.parse_args()
    jobs = args.jobs or (3_000 if args.quick else 30_000)
    repeat = args.repeat or (5 if args.quick else 9)
    window = 2.0 if args.quick else 5.0
    with tempfile.TemporaryDirectory(prefix="et-bench-listing-") as tmp:
        proc = CoordinatorProcess(os.path.join(tmp, "c.db"), os.path.join(tmp, "token"),
                                  log_file=os.path.join(tmp, "c.log"), extra_args=("--policy", "fifo"))
        proc.start()
        try:
            c = CoordinatorClient(proc.url, proc.token, timeout=120.0)
            for _ in range(20):
                c.submit(JobSubmit(["train.py"], "/tmp"))
            fresh = scrapes(c, proc.url, proc.token, repeat)  # (the baseline: this coordinator before its history)
            rss0 = rss(proc.proc.pid)
            t = time.perf_counter()
            fill(c, jobs)
            print(f"# 20 waiting jobs, then {jobs:,} ended ones, submitted and cancelled in "
                  f"{time.perf_counter() - t:.1f} s; a coordinator (SQLite) on this machine")
            history = scrapes(c, proc.url, proc.token, repeat)
            rss1 = rss(proc.proc.pid)
            full = c.cluster_status(ended="all", page=None)
            assert len(full.jobs) == jobs + 20, len(full.jobs)
            assert [j.id for j in c.cluster_status(ended="all").jobs] == [j.id for j in full.jobs]  # (pages: the same)
            default = timed(lambda: c.cluster_status(), repeat)
            cli = timed(lambda: c.cluster_status(ended=10), repeat)
            hers = [j.id for j in full.jobs if j.user == "alice"]
            mine = c.cluster_status(ended=10, user="alice")
            assert [j.id for j in mine.jobs] == hers[-10:], mine.jobs
            assert mine.ended_omitted == max(0, len(hers) - 10), mine.ended_omitted
            user = timed(lambda: c.cluster_status(ended=10, user="alice"), repeat)
            every = timed(lambda: c.cluster_status(ended="all", page=None), repeat)
            paged = timed(lambda: c.cluster_status(ended="all", page=PAGE), repeat)
            idle = health_under(proc.url, proc.token, "none", window)
            under_default = health_under(proc.url, proc.token, None, window)
            under_all = health_under(proc.url, proc.token, "all", window)
            under_paged = health_under(proc.url, proc.token, "all", window, page=PAGE)
            c.close()
            proc.stop()
            t = time.perf_counter()
            proc.start()  # (on the same database: the history loaded, the older ended records packed)
            restart = time.perf_counter() - t
            c = CoordinatorClient(proc.url, proc.token, timeout=120.0)
            assert len(c.cluster_status(ended=10).jobs) == 30
            rss2 = rss(proc.proc.pid)
            c.close()
        finally:
            proc.stop()
        packed, unpacked = record_bytes(os.path.join(tmp, "c.db"))
    print(f"listing_ended_jobs: {jobs} jobs")
    print(f"listing_default_median: {default:.4f} s")
    print(f"listing_status_cli_median: {cli:.4f} s")
    print(f"listing_user_filter_median: {user:.4f} s")
    print(f"listing_all_median: {every:.4f} s")
    print(f"listing_all_paged_median: {paged:.4f} s")
    print(f"listing_default_vs_all: {default / every:.3f} x")
    print(f"listing_status_cli_vs_all: {cli / every:.3f} x")
    print(f"listing_user_filter_vs_all: {user / every:.3f} x")
    print(f"listing_all_paged_vs_all: {paged / every:.3f} x")
    print(f"health_p99_idle: {idle * 1000:.2f} ms")
    print(f"health_p99_while_listing_default: {under_default * 1000:.2f} ms")
    print(f"health_p99_while_listing_all: {under_all * 1000:.2f} ms")
    print(f"health_p99_while_listing_all_paged: {under_paged * 1000:.2f} ms")
    print(f"health_p99_listing_default_vs_all: {under_default / under_all:.3f} x")
    print(f"health_p99_listing_all_paged_vs_all: {under_paged / under_all:.3f} x")
    for i, name in enumerate(("metrics", "users", "projects")):
        print(f"{name}_median: {history[i]:.4f} s")
        print(f"{name}_fresh_median: {fresh[i]:.4f} s")
        print(f"{name}_vs_fresh: {history[i] / fresh[i]:.2f} x")
    print(f"memory_per_ended_job: {(rss1 - rss0) / jobs:.0f} B")
    print(f"memory_per_ended_job_after_restart: {(rss2 - rss0) / jobs:.0f} B")
    print(f"restart_seconds: {restart:.2f} s")
    print(f"record_bytes_packed: {packed:.0f} B")
    print(f"record_bytes_unpacked: {unpacked:.0f} B")
    print(f"record_packed_vs_unpacked: {packed / unpacked:.3f} x")


def rss(pid: int) -> int:
    """A process's resident memory in bytes (psutil, as the workers' resource monitor reads it)."""
    return psutil.Process(pid).memory_info().rss


def record_bytes(db: str, sample: int = 5000) -> tuple[float, float]:
    """Bytes per ended job's record (the first ``sample`` of the database's), as the coordinator keeps
    it packed and as a record (decoded as the coordinator decodes them), measured with tracemalloc."""
    import sqlite3
    import tracemalloc

    import msgspec

    from elastictrain.coordinator.live import JobRecord
    from elastictrain.coordinator.records import _pack

    conn = sqlite3.connect(db)
    try:
        raws = [r[0] for r in conn.execute("SELECT record FROM cluster_jobs WHERE status = 'cancelled' LIMIT ?",
                                           (sample,))]
    finally:
        conn.close()
    dec = msgspec.msgpack.Decoder(JobRecord)
    tracemalloc.start()
    try:
        a = tracemalloc.take_snapshot()
        recs = [dec.decode(r) for r in raws]
        b = tracemalloc.take_snapshot()
        cold = [_pack(r) for r in recs]
        c = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert len(cold) == len(recs) > 0

    def grew(x, y) -> float:
        return sum(d.size_diff for d in y.compare_to(x, "filename")) / len(recs)

    return grew(b, c), grew(a, b)


if __name__ == "__main__":
    main()
