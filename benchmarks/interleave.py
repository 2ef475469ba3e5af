"""Interleaving realistic training loops in one process: the executor against doing nothing.

Job kinds, each bottlenecked on a different resource (stages marked with ``et.stage``):

* ``io``: ``load`` reads from storage (one storage path, serving one read at a time), then a
  short ``compute`` on the accelerator;
* ``cpu``: ``preprocess`` is numpy augmentation on the host, then a short ``compute``;
* ``gpu``: a long ``compute`` (many kernels), nothing else;
* ``comm``: a short ``compute``, then ``sync`` sends gradients over one network link.

Mixes: io+cpu+gpu, gpu+gpu, io+io, cpu+cpu, and io+cpu+gpu+comm. Every mix runs in every mode,
measured in the same run: ``free`` (threads, no gate, each job its own stream), ``locks`` (one
lock per resource, held for the stage's host time), ``timeshare`` (whole iterations round
robin, the device drained at the end of a turn, as GPU time-slicing does), ``executor``
(:class:`~elastictrain.runtime.interleave.InterleaveGroup`), and ``predicted`` (eq. 3: each job's
time alone over the interleaved iteration of the best ordering of the profiles measured alone,
at most 1). A job's rate in a mode is normalized by its rate
alone; per mix the script prints, as ``name: value unit``:

* ``interleave_<mix>_<variant>_<mode>_sum`` and ``..._min_member`` (the slowest member's
  normalized rate), from the run with the median sum of several (the modes alternate);
* ``interleave_<mix>_executor_vs_best_baseline`` (over the best of free, locks, timeshare;
  target >= 0.95) and ``interleave_<mix>_executor_vs_predicted`` (target >= 0.9 where the
  jobs are complementary: io+cpu+gpu and the 4-job mix).

Each variant runs with the loss read back every iteration (``item1``: the host waits for the
device at the end of every compute stage, as scripts that log ``loss.item()`` do) and every
50 iterations (``item50``: compute stages return once their kernels are launched).

``--device cpu`` (the default): the accelerator is emulated by one thread pinned to its own
core, running the jobs' kernels (torch matmuls, one thread) one at a time in launch order, with
events that complete when the kernels before them have run (what CUDA streams on one GPU give);
the host's work runs on the other cores. ``--device cuda``: the kernels run on the GPU, each
job on its own CUDA stream, events are CUDA events. ``--quick``: shorter runs, every figure.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import elastictrain as et  # noqa: E402
from elastictrain.policies.interleaving import best_ordering  # noqa: E402
from elastictrain.runtime.interleave import GroupJob, InterleaveGroup, auto_host_slots  # noqa: E402
from elastictrain.runtime.stages import Recorder, use_recorder  # noqa: E402

RESOURCES = ("load", "preprocess", "compute", "sync")
MIXES = {"io_cpu_gpu": ("io", "cpu", "gpu"), "gpu_gpu": ("gpu", "gpu"), "io_io": ("io", "io"),
         "cpu_cpu": ("cpu", "cpu"), "four": ("io", "cpu", "gpu", "comm")}
COMPLEMENTARY = ("io_cpu_gpu", "four")


# ---------------------------------------------------------------- the machine
class _Done:
    __slots__ = ("flag",)

    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag

    def query(self) -> bool:
        return self.flag.is_set()


class EmulatedDevice:
    """An accelerator on CPU: one thread on its own core runs kernels in launch order. Launches
    are asynchronous (a bounded queue, as CUDA's; 64 kernels, so that iterations counted at
    launch are at most that far ahead of the device), events complete when the work before
    them ran."""

    def __init__(self, core: "int | None") -> None:
        self.q: queue.Queue = queue.Queue(maxsize=64)
        self.core = core
        threading.Thread(target=self._run, name="emulated-device", daemon=True).start()

    def _run(self) -> None:
        if self.core is not None:
            os.sched_setaffinity(0, {self.core})
        while True:
            self.q.get()()

    def launch(self, fn) -> None:
        self.q.put(fn)

    def event(self) -> _Done:
        flag = threading.Event()
        self.q.put(flag.set)
        return _Done(flag)

    def sync(self) -> None:
        self.event().flag.wait()


class CudaDevice:
    """The real thing: kernels go to the calling thread's current CUDA stream."""

    def launch(self, fn) -> None:
        fn()

    def event(self):
        ev = torch.cuda.Event()
        ev.record()
        return ev

    def sync(self) -> None:
        torch.cuda.current_stream().synchronize()


class Serial:
    """A resource that serves one request at a time (a storage path, a network link)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def use(self, seconds: float) -> None:
        with self.lock:
            time.sleep(seconds)


class Machine:
    def __init__(self, device: str) -> None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if device == "cuda":
            self.device, self.dev = CudaDevice(), "cuda"
        else:
            # the device gets the last core; the host (this thread and every job thread) the others
            core = cores[-1] if len(cores) > 1 else None
            if core is not None:
                os.sched_setaffinity(0, set(cores[:-1]))
            self.device, self.dev = EmulatedDevice(core), "cpu"
        self.storage, self.network = Serial(), Serial()


# ---------------------------------------------------------------- jobs
class Job:
    """One training loop of ``kind`` (see the module docstring); ``item_every``: how often the
    host reads the loss back (waits for the device)."""

    LOAD_S, PREP_S, KERNEL_S, SYNC_S = 0.015, 0.010, 0.001, 0.010
    SHORT, LONG = 2, 12  # kernels in a short and a long compute stage

    def __init__(self, kind: str, machine: Machine, item_every: int) -> None:
        self.kind, self.m, self.item_every = kind, machine, item_every
        n = 384 if machine.dev == "cuda" else 192
        g = torch.Generator().manual_seed(1)
        self.a = (torch.randn(n, n, generator=g) / n ** 0.5).to(machine.dev)
        self.x = torch.randn(n, n, generator=g).to(machine.dev)
        self.raw = np.random.default_rng(1).random((64, 1024), dtype=np.float32)
        self.kernels = self.LONG if kind == "gpu" else self.SHORT
        self.reps, self.prep_reps = 1, 1
        self._calibrate()

    def _kernel(self) -> None:
        x = self.x
        for _ in range(self.reps):
            x = torch.tanh(x @ self.a)
        self.x = x

    def _prep(self) -> None:
        a = self.raw
        for _ in range(self.prep_reps):
            a = np.sqrt(np.abs(np.tanh(a * 1.01 + 0.1)) + 1e-3)
        self.last = a

    def _time(self, fn, n: int = 5) -> float:
        fn()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n

    def _calibrate(self) -> None:
        """Size a kernel to KERNEL_S and the numpy work to PREP_S (timed over many, warmed up)."""
        dev = self.m.device
        self.reps = 20

        def kernels():
            for _ in range(5):
                dev.launch(self._kernel)
            dev.sync()

        t = self._time(kernels) / (5 * self.reps)
        self.reps = max(1, round(self.KERNEL_S / t))
        self.prep_reps = 20
        t = self._time(self._prep) / self.prep_reps
        self.prep_reps = max(1, round(self.PREP_S / t))

    def step(self, it: int, exact: bool = False) -> None:
        dev = self.m.device
        if self.kind == "io":
            with et.stage("load"):
                self.m.storage.use(self.LOAD_S)
        if self.kind == "cpu":
            with et.stage("preprocess"):
                self._prep()
        with et.stage("compute"):
            for _ in range(self.kernels):
                dev.launch(self._kernel)
            if exact or it % self.item_every == 0:
                dev.sync()  # loss.item()
        if self.kind == "comm":
            with et.stage("sync"):
                self.m.network.use(self.SYNC_S)

    def loop(self, stop: threading.Event, counts: list, i: int, gate=None, stream=None):
        return counting_loop(self.step, self.m.device.sync, stop, counts, i, gate, self.m.dev == "cuda" and stream)


# ---------------------------------------------------------------- modes
class Locks:
    def __init__(self) -> None:
        self.locks = {r: threading.Lock() for r in RESOURCES}

    def enter(self, stage: str) -> None:
        self.locks[stage].acquire()

    def exit(self, stage: str) -> None:
        self.locks[stage].release()


class TimeShare:
    """Whole iterations take turns; a turn ends when the job's device work has drained."""

    def __init__(self, jobs: list[Job]) -> None:
        self.cond, self.turn, self.n, self.jobs = threading.Condition(), 0, len(jobs), jobs

    def member(self, i: int):
        ts, first, last = self, _stages(self.jobs[i].kind)[0], _stages(self.jobs[i].kind)[-1]

        class M:
            def enter(self, stage):
                if stage == first:
                    with ts.cond:
                        ts.cond.wait_for(lambda: ts.turn == i)

            def exit(self, stage):
                if stage == last:
                    ts.jobs[i].m.device.sync()
                    with ts.cond:
                        ts.turn = (ts.turn + 1) % ts.n
                        ts.cond.notify_all()
        return M()


def counting_loop(step, sync, stop: threading.Event, counts: list, i: int, gate=None, stream: bool = False):
    """A job's thread body: ``step(it)`` until ``stop``, counting iterations in ``counts[i]``; with
    ``gate`` its stages pass through that gate (a time share's), with ``stream`` on a CUDA stream of
    its own; ``sync()`` waits for its device work at the end. (benchmarks/interleave_loops.py too.)"""
    def run():
        if gate is not None:
            use_recorder(Recorder(), gate)
        ctx = torch.cuda.stream(torch.cuda.Stream()) if stream else None
        if ctx is not None:
            ctx.__enter__()
        it = 0
        while not stop.is_set():
            step(it)
            it += 1
            counts[i] += 1
        sync()
        if ctx is not None:
            ctx.__exit__(None, None, None)
    return run


def _stages(kind: str) -> list[str]:
    return {"io": ["load", "compute"], "cpu": ["preprocess", "compute"], "gpu": ["compute"],
            "comm": ["compute", "sync"]}[kind]


def timed(fns: list, seconds: float, stop: threading.Event, counts: list) -> list[float]:
    threads = [threading.Thread(target=f, daemon=True) for f in fns]
    for t in threads:
        t.start()
    time.sleep(min(1.0, seconds * 0.25))  # warm up
    c0, t0 = list(counts), time.perf_counter()
    time.sleep(seconds)
    c1, dt = list(counts), time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join(60)
    return [(b - a) / dt for a, b in zip(c0, c1)]


def alone(job: Job, seconds: float) -> tuple[float, tuple]:
    """Iterations/s alone, and the stage profile with the device's time in its stage (measured
    with a sync at the end of every compute stage)."""
    stop, counts = threading.Event(), [0]
    rate = timed([job.loop(stop, counts, 0, stream=True)], seconds, stop, counts)[0]
    rec = Recorder()
    use_recorder(rec, None)
    for it in range(12):
        job.step(it, exact=True)
    use_recorder(None, None)
    its = rec.iterations[2:]
    return rate, tuple(sum(it.get(s, 0.0) for it in its) / len(its) for s in RESOURCES)


def run_mode(mode: str, jobs: list[Job], seconds: float, profiles: list[tuple]) -> list[float]:
    stop, counts = threading.Event(), [0] * len(jobs)
    if mode == "free":
        return timed([j.loop(stop, counts, i, stream=True) for i, j in enumerate(jobs)], seconds, stop, counts)
    if mode == "locks":
        locks = Locks()
        return timed([j.loop(stop, counts, i, locks, stream=True) for i, j in enumerate(jobs)], seconds, stop, counts)
    if mode == "timeshare":
        ts = TimeShare(jobs)
        return timed([j.loop(stop, counts, i, ts.member(i)) for i, j in enumerate(jobs)], seconds, stop, counts)
    device = jobs[0].m.device
    group = InterleaveGroup([GroupJob(f"{j.kind}{i}", j.loop(stop, counts, i), dict(zip(RESOURCES, p)))
                             for i, (j, p) in enumerate(zip(jobs, profiles))], resources=RESOURCES,
                            device=device if isinstance(device, EmulatedDevice) else "auto")
    out: dict = {}
    runner = threading.Thread(target=lambda: out.setdefault("r", group.run(timeout=600)), daemon=True)
    rates = timed([runner.start], seconds, stop, counts)
    runner.join(60)
    for r in out.get("r", []):
        if not r.ok:
            raise RuntimeError(f"job {r.name} failed:\n{r.traceback}")
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--mixes", default=",".join(MIXES), help="comma-separated, from " + ", ".join(MIXES))
    ap.add_argument("--item-every", default="1,50", help="variants: read the loss back every N iterations")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per mode (default 3; --quick 1)")
    ap.add_argument("--reps", type=int, default=None, help="runs per mode, the median kept (default 5; --quick 3)")
    args = ap.parse_args()
    if args.seconds is not None and not 0.2 <= args.seconds <= 60:
        ap.error("--seconds must be in [0.2, 60]")
    if args.reps is not None and not 1 <= args.reps <= 21:
        ap.error("--reps must be in [1, 21]")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no GPU")
    torch.set_num_threads(1)
    seconds, reps = (1.0, 3) if args.quick else (3.0, 5)
    seconds, reps = args.seconds or seconds, args.reps or reps
    machine = Machine(args.device)
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"emulated on CPU ({os.cpu_count()} cores)"
    print(f"# device: {name}; {seconds:.1f} s per mode, median of {reps} runs")
    for mix in args.mixes.split(","):
        if mix not in MIXES:
            ap.error(f"unknown mix {mix!r}; choose from {', '.join(MIXES)}")
        # the executor's host slots for this mix (auto: cores this thread may use, torch's threads)
        print(f"interleave_{mix}_executor_preprocess_slots: {auto_host_slots(len(MIXES[mix]))} slots")
    for every in (int(x) for x in args.item_every.split(",")):
        variant = f"item{every}"
        solo: dict = {}
        for mix in args.mixes.split(","):
            kinds = MIXES[mix]
            jobs = [Job(k, machine, every) for k in kinds]
            for k, j in zip(kinds, jobs):
                if k not in solo:
                    solo[k] = alone(j, seconds)
                    print(f"interleave_{variant}_alone_{k}: {1000 / solo[k][0]:.2f} ms/iteration")
            rates0 = [solo[k][0] for k in kinds]
            profiles = [solo[k][1] for k in kinds]
            t_best, _ = best_ordering(profiles, len(RESOURCES))
            runs: dict = {}
            for _ in range(reps):  # the modes alternate, so a drift of the machine hits them all
                for mode in ("free", "locks", "timeshare", "executor"):
                    norm = [r / s for r, s in zip(run_mode(mode, jobs, seconds, profiles), rates0)]
                    runs.setdefault(mode, []).append((sum(norm), min(norm)))
            sums, mins = {}, {}
            for mode, got in runs.items():  # the run with the median sum
                sums[mode], mins[mode] = sorted(got)[len(got) // 2]
            # eq. 3: each job's time alone over the interleaved iteration (never faster than alone)
            pred = [min(1.0, (1 / r) / t_best) for r in rates0]
            sums["predicted"], mins["predicted"] = sum(pred), min(pred)
            tag = f"interleave_{mix}_{variant}"
            for mode in sums:
                print(f"{tag}_{mode}_sum: {sums[mode]:.3f} x")
                print(f"{tag}_{mode}_min_member: {mins[mode]:.3f} x")
            best = max(sums[m] for m in ("free", "locks", "timeshare"))
            print(f"{tag}_executor_vs_best_baseline: {sums['executor'] / best:.3f} x")
            print(f"{tag}_executor_vs_predicted: {sums['executor'] / sums['predicted']:.3f} x")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
