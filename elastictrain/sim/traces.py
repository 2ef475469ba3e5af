"""Trace loaders: Tiresias CSV (s), Muri CSV (ms, per-stage times), Gavel ``.trace``, and ours.

Every loader returns ``list[JobSpec]`` sorted by submit time. A bad row raises
:class:`TraceError` naming the file, line, column and value.

Native format (``.csv`` with this header; seconds): ``job_id,num_gpu,submit_time,iterations,
iteration_time,model,user,stage_times`` where ``stage_times`` is ``;``-separated (may be empty),
and optionally ``priority`` (an integer from -1000 to 1000; ``simulate --priority-preemption``),
``gpu_type``, ``project``, and for an elastic job ``min_gpu``, ``max_gpu`` (the workers it may run
on; empty or 0: ``num_gpu``) and ``serial`` (the fraction of its iteration more workers do not
shorten, Amdahl's law; empty or 0: linear scaling).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
from operator import attrgetter, itemgetter
from typing import IO, Callable, Optional

from ..errors import ConfigError
from ..model import JobSpec

_ARRIVAL = attrgetter("submit_time", "job_id")  # a trace's order: by submission, ties by job id

__all__ = ["TraceError", "load_trace", "load_tiresias", "load_muri", "load_gavel", "load_native", "open_text",
           "SHIPPED"]

#: the public traces shipped with the project (traces/README.md): ``os.path.join(SHIPPED, "muri", ...)``
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "traces")


def open_text(path: str) -> IO[str]:
    """Open a text data file, gzipped (``.gz``) or not; ``x.csv`` also finds ``x.csv.gz``.

    Raises:
        OSError: neither exists (the caller names the flag).
    """
    if not os.path.exists(path) and os.path.exists(path + ".gz"):
        path = path + ".gz"
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), newline="")
    return open(path, newline="")

#: model skew (largest tensor / total), from the Tiresias simulator's model table
SKEW = {"vgg19": .717, "vgg16": .744, "vgg11": .774, "alexnet": .611, "resnet152": .060, "resnet101": .075,
        "resnet50": .112, "inception4": .044, "inception3": .138}


class TraceError(ConfigError):
    """A trace file has a bad row; the message names file, line, column and value."""


#: the smallest value each numeric column may take (inclusive unless marked ">"), all finite
_LOW = {"job_id": 0, "num_gpu": 1, "submit_time": 0, "iterations": ">0", "duration": ">0", "iteration_time": ">0",
        "stage_times": 0, "min_gpu": 0, "max_gpu": 0, "serial": 0}
_HIGH = 1e15  # beyond any real trace (31 million years in seconds); keeps arithmetic exact enough


def _num(path: str, line: int, row: dict, col: str, conv: Callable = float):
    """The value of ``col`` as a finite number within the column's range.

    Raises:
        TraceError: missing, not a number, NaN or infinite, fractional where an integer is
            needed, or out of range; the message names the file, line, column and value.
    """
    raw = row.get(col)
    if raw is None or raw.strip() == "":
        raise TraceError(f"{path}:{line}: column {col!r} is missing or empty")
    try:
        v = float(raw)
    except ValueError:
        raise TraceError(f"{path}:{line}: column {col!r} has value {raw!r}, which is not a number") from None
    if not math.isfinite(v) or abs(v) > _HIGH:
        raise TraceError(f"{path}:{line}: column {col!r} has value {raw!r}; it must be a finite number below 1e15")
    if conv is int:
        if not v.is_integer():
            raise TraceError(f"{path}:{line}: column {col!r} has value {raw!r}; it must be a whole number")
        v = int(v)
    low = _LOW.get(col)
    if low is not None and (v <= 0 if low == ">0" else v < low):
        bound = "> 0" if low == ">0" else f">= {low}"
        raise TraceError(f"{path}:{line}: column {col!r} has value {raw!r}; it must be {bound}")
    return v


def _check(path: str, line: int, fn: Callable[[], JobSpec]) -> JobSpec:
    try:
        return fn()
    except TraceError:
        raise
    except ConfigError as exc:
        raise TraceError(f"{path}:{line}: {exc}") from None


def _rows(path: str, required: tuple[str, ...]):
    with open_text(path) as f:
        reader = csv.DictReader(f)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}:1: header lacks column(s) {', '.join(missing)} "
                             f"(has: {', '.join(reader.fieldnames or [])})")
        for i, row in enumerate(reader, start=2):
            yield i, row


def load_tiresias(path: str) -> list[JobSpec]:
    """``job_id,num_gpu,submit_time,iterations,model_name,duration,interval`` in seconds."""
    out = []
    for ln, r in _rows(path, ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration")):
        it = _num(path, ln, r, "iterations")
        out.append(_check(path, ln, lambda: JobSpec(
            _num(path, ln, r, "job_id", int), _num(path, ln, r, "num_gpu", int), _num(path, ln, r, "submit_time"),
            it, _num(path, ln, r, "duration") / it if it > 0 else 0.0, r["model_name"])))
    return sorted(out, key=_ARRIVAL)


def load_muri(path: str) -> list[JobSpec]:
    """Muri's CSV: times in milliseconds; ``iteration_time`` and ``resource_time_*`` per iteration."""
    out = []
    for ln, r in _rows(path, ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "iteration_time")):
        stages = tuple(_num(path, ln, r, k) / 1000.0 for k in sorted(r) if k.startswith("resource_time_"))
        out.append(_check(path, ln, lambda: JobSpec(
            _num(path, ln, r, "job_id", int), _num(path, ln, r, "num_gpu", int),
            _num(path, ln, r, "submit_time") / 1000.0, _num(path, ln, r, "iterations"),
            _num(path, ln, r, "iteration_time") / 1000.0, r["model_name"], stages)))
    return sorted(out, key=_ARRIVAL)


def load_gavel(path: str, throughputs: Optional[str] = None, gpu: str = "v100") -> list[JobSpec]:
    """Gavel's 7-field TSV: ``job_type, command, num_steps_arg, needs_data_dir, total_steps,
    arrival_time, scale_factor``. The iteration time comes from Gavel's throughput table
    (``simulation_throughputs.json`` next to the trace's folder unless given), isolated
    throughput on ``gpu``; where the table lacks a (type, scale) pair, the single-GPU figure
    is used (perfect scaling)."""
    if throughputs is None:
        throughputs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))),
                                   "simulation_throughputs.json")
    try:
        with open_text(throughputs) as f:
            tables = json.load(f)
        table = tables[gpu]
    except (OSError, KeyError, ValueError) as exc:
        raise TraceError(f"{path}: cannot read the throughput table {throughputs} for {gpu}: {exc}") from None
    out = []
    with open_text(path) as f:
        for ln, line in enumerate(f, start=1):
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            if len(cols) != 7:
                raise TraceError(f"{path}:{ln}: expected 7 tab-separated fields, got {len(cols)}")
            job_type, _cmd, _arg, _data, steps, arrival, scale = cols
            key = str((job_type, int(scale))) if scale.isdigit() else None
            entry = table.get(key) if key else None
            if entry is None:  # Gavel has no distributed figure for some types: assume linear scaling
                key = str((job_type, 1))
                entry = table.get(key)
            if entry is None or "null" not in entry:
                raise TraceError(f"{path}:{ln}: column 'job_type' has value {job_type!r} (scale {scale}) with no "
                                 f"throughput in {throughputs}")
            try:
                speeds = tuple((t, tables[t][key]["null"] / entry["null"]) for t in sorted(tables)
                               if "_" not in t and key in tables[t] and "null" in tables[t][key])
                out.append(JobSpec(ln - 1, int(scale), float(arrival), float(steps), 1.0 / entry["null"],
                                   job_type.split(" ")[0], speeds=speeds))
            except (ValueError, ConfigError) as exc:
                raise TraceError(f"{path}:{ln}: {exc}") from None
    return sorted(out, key=_ARRIVAL)


def load_native(path: str) -> list[JobSpec]:
    jobs = _native_fast(path)
    return jobs if jobs is not None else _native_checked(path)


_NATIVE = ("job_id", "num_gpu", "submit_time", "iterations", "iteration_time")
_ELASTIC = ("min_gpu", "max_gpu", "serial")


def _native_fast(path: str) -> Optional[list[JobSpec]]:
    """The common case of :func:`load_native` in one tight loop (simulations load traces of
    100,000 rows); None at the first doubt (a bad row, a missing column, a number written as
    ``8.0``), and :func:`_native_checked` reads the file again and names what is wrong."""
    out = []
    with open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, [])
        if not all(c in header for c in _NATIVE):
            return None
        pick = itemgetter(*(header.index(c) for c in _NATIVE))
        model, user, stages, prio, kind, proj = (header.index(c) if c in header else -1 for c in (
            "model", "user", "stage_times", "priority", "gpu_type", "project"))
        if any(c in header for c in _ELASTIC):  # (elastic jobs: read by the checked loader)
            return None
        width = len(header)
        try:
            for row in reader:
                if not row:  # a blank line (DictReader skips them too)
                    continue
                if len(row) != width:
                    return None
                job, gpus, submit, its, it = pick(row)
                job, gpus = int(job), int(gpus)
                submit, its, it = float(submit), float(its), float(it)
                if not (0 <= job <= _HIGH and 1 <= gpus <= _HIGH and 0 <= submit <= _HIGH and 0 < its <= _HIGH
                        and 0 < it <= _HIGH):
                    return None
                st = tuple(map(float, filter(None, row[stages].split(";")))) if stages >= 0 else ()
                if st and not all(0 <= x <= _HIGH for x in st):
                    return None
                out.append(JobSpec(job, gpus, submit, its, it, row[model] if model >= 0 else "", st,
                                   row[user] if user >= 0 else "", priority=int(row[prio]) if prio >= 0 else 0,
                                   gpu_type=row[kind] if kind >= 0 else "", project=row[proj] if proj >= 0 else ""))
        except (ValueError, ConfigError):
            return None
    return sorted(out, key=_ARRIVAL)


def _native_checked(path: str) -> list[JobSpec]:
    out = []
    for ln, r in _rows(path, _NATIVE):
        stages = tuple(_num(path, ln, {"stage_times": x}, "stage_times")
                       for x in (r.get("stage_times") or "").split(";") if x)
        out.append(_check(path, ln, lambda: JobSpec(
            _num(path, ln, r, "job_id", int), _num(path, ln, r, "num_gpu", int), _num(path, ln, r, "submit_time"),
            _num(path, ln, r, "iterations"), _num(path, ln, r, "iteration_time"), r.get("model", ""), stages,
            r.get("user", ""), priority=_num(path, ln, r, "priority", int) if r.get("priority") else 0,
            gpu_type=r.get("gpu_type") or "", project=r.get("project") or "",
            **{c: _num(path, ln, r, c, float if c == "serial" else int) for c in _ELASTIC if r.get(c)})))
    return sorted(out, key=_ARRIVAL)


def load_trace(path: str, fmt: str = "auto") -> list[JobSpec]:
    """Load a trace, detecting its format from the file unless ``fmt`` names one.

    Raises:
        TraceError: the file is unreadable, of an unknown format, or has a bad row.
    """
    if fmt == "auto":
        if path.endswith((".trace", ".trace.gz")):
            fmt = "gavel"
        else:
            try:
                with open_text(path) as f:
                    header = f.readline()
            except OSError as exc:
                raise TraceError(f"{path}: {exc.strerror}") from None
            fmt = ("muri" if "iteration_time" in header and "resource_time" in header
                   else "native" if "iteration_time" in header else "tiresias")
    loaders = {"tiresias": load_tiresias, "muri": load_muri, "gavel": load_gavel, "native": load_native}
    if fmt not in loaders:
        raise TraceError(f"unknown trace format {fmt!r}; use one of {', '.join(loaders)}")
    try:
        jobs = loaders[fmt](path)
    except OSError as exc:
        raise TraceError(f"{path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{path}: not a text CSV file ({exc})") from None
    if not jobs:
        raise TraceError(f"{path}: the trace has no jobs (a header and at least one row are needed)")
    ids = set()
    for j in jobs:
        if j.job_id in ids:
            raise TraceError(f"{path}: job_id {j.job_id} appears twice; job ids must be unique")
        ids.add(j.job_id)
    return jobs
