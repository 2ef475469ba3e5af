"""Synthetic traces of any size, Philly-like: ``elastictrain trace synth --jobs N --seed S --out F``.

Where the distributions come from: each job is a job drawn at random (with replacement) from
the three Philly-derived Muri traces shipped in ``traces/muri`` (trace1, trace3 and trace4:
5,124 jobs of Microsoft's Philly cluster, as the Muri authors sampled and profiled them). So the
GPU counts (1 to 32, mostly 1, 4 and 8), the durations (heavy-tailed: median about an hour,
99th percentile about a month) and each job's model and stage profile are Philly's, jointly,
as those traces have them. Arrivals are a Poisson process whose rate makes the offered load
(GPU-seconds asked per second) ``load`` times the cluster's ``gpus``; job sizes are capped at
``gpus``; users are assigned round-robin over ``users`` names. ``priorities`` (optional): each
job draws one of these uniformly, from a generator of its own, so the rest of the trace is the
same with or without them (``simulate --priority-preemption``). ``elastic`` (optional): each job
is elastic with this probability, from a generator of its own: it may run on half to twice its
GPUs (within 1..``gpus``), and a serial fraction drawn uniformly from 0 to 0.3 says how it scales
(Amdahl's law). Those two are this generator's assumptions, not Philly's: its traces say nothing
of how a job scales.

The output is the native trace format (seconds; ``stage_times`` ``;``-separated), gzipped when
the file name ends in ``.gz``. The same seed always gives the same trace.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import random
from typing import Optional

from ..errors import ConfigError
from ..model import JobSpec
from .traces import SHIPPED, load_trace

__all__ = ["synthesize", "write_native", "SOURCES"]

SOURCES = tuple(os.path.join(SHIPPED, "muri", f"trace{i}.csv.gz") for i in (1, 3, 4))


def synthesize(jobs: int, seed: int = 0, gpus: int = 64, load: float = 0.9, users: int = 8,
               sources: Optional[tuple[str, ...]] = None, priorities: tuple[int, ...] = (),
               elastic: float = 0.0) -> list[JobSpec]:
    """``jobs`` jobs resampled from the Philly-derived traces (see the module docstring).

    Raises:
        ConfigError: a count or the load is out of range.
    """
    if not 1 <= jobs <= 10_000_000:
        raise ConfigError(f"--jobs must be in [1, 10000000], got {jobs}")
    if not 1 <= gpus <= 1_000_000 or not 0.01 <= load <= 100 or not 1 <= users <= 100_000:
        raise ConfigError(f"--gpus must be in [1, 1000000], --load in [0.01, 100] and --users in [1, 100000]; got "
                          f"{gpus}, {load}, {users}")
    if not all(isinstance(p, int) and -1000 <= p <= 1000 for p in priorities) or len(priorities) > 1000:
        raise ConfigError(f"--priorities must be up to 1000 integers from -1000 to 1000, got {priorities!r}")
    if not 0.0 <= elastic <= 1.0:
        raise ConfigError(f"--elastic must be a fraction in [0, 1], got {elastic!r}")
    pool = [j for path in (sources or SOURCES) for j in load_trace(path)]
    rng = random.Random(seed)
    picks = [pool[rng.randrange(len(pool))] for _ in range(jobs)]
    mean_demand = sum(min(p.num_gpu, gpus) * p.duration for p in picks) / jobs
    rate = load * gpus / mean_demand  # jobs per second
    prio = random.Random(f"{seed}:priorities")
    flex = random.Random(f"{seed}:elastic")
    t, out = 0.0, []
    for i, p in enumerate(picks):
        t += rng.expovariate(rate)
        g = min(p.num_gpu, gpus)
        lo = hi = 0
        serial = 0.0
        if elastic and flex.random() < elastic:
            lo, hi, serial = max(1, g // 2), min(gpus, 2 * g), round(flex.uniform(0.0, 0.3), 3)
        out.append(JobSpec(i, g, round(t, 3), p.iterations, p.iteration_time, p.model,
                           p.stage_times, f"user{i % users}",
                           priority=priorities[prio.randrange(len(priorities))] if priorities else 0,
                           min_gpu=lo, max_gpu=hi, serial=serial))
    return out


def write_native(jobs: list[JobSpec], path: str) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    prio = any(j.priority for j in jobs)  # (the columns only where some job has one)
    kind = any(j.gpu_type for j in jobs)
    proj = any(j.project for j in jobs)
    flex = any(j.min_gpu or j.max_gpu or j.serial for j in jobs)
    w.writerow(["job_id", "num_gpu", "submit_time", "iterations", "iteration_time", "model", "user", "stage_times"]
               + ["priority"] * prio + ["gpu_type"] * kind + ["project"] * proj
               + ["min_gpu", "max_gpu", "serial"] * flex)
    for j in jobs:
        w.writerow([j.job_id, j.num_gpu, repr(j.submit_time), repr(float(j.iterations)), repr(j.iteration_time),
                    j.model, j.user, ";".join(repr(x) for x in j.stage_times)] + [j.priority] * prio
                   + [j.gpu_type] * kind + [j.project] * proj
                   + ([j.min_gpu or "", j.max_gpu or "", repr(j.serial) if j.serial else ""] if flex else []))
    data = buf.getvalue().encode()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with (gzip.open(tmp, "wb", compresslevel=6) if path.endswith(".gz") else open(tmp, "wb")) as f:
        f.write(data)
    os.replace(tmp, path)
    return path
