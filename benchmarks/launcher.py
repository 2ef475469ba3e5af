"""etrun against torchrun, in one run: start-up and recovery from a killed worker.

Runs benchmarks/launcher_toy.py (an unmodified torchrun-style DDP script on gloo, 2 workers,
``--standalone``) under each launcher, several times, and times from the script's own event
log: launch -> worker process start, launch -> first completed step, and SIGKILL of rank 1
-> the next completed step of the restarted group, plus how many recoveries succeeded
(a recovery that shows no step within ``--recovery-timeout`` seconds failed).

Baselines: ``torchrun`` with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (the ratios' baseline:
it avoids stale store addresses on restart) and with default settings. etrun runs the same
unmodified script with its zygote (the default: every worker forked from one process that
imported torch once; ``etrun`` kills after ``--kill-after`` s of training, ``etrun_cold`` 1 s
after the first step), with warm spares instead (``--zygote off``: ``etrun_spares``, and
``etrun_spares_cold``, killed before the spares are ready), and ``launcher_toy_inprocess.py``,
the toy written for in-process recovery (``etrun_inprocess``; the survivor's pid before and
after shows it was not restarted), and with the zygote kept between launches (``--zygote keep``:
``etrun_kept``; its first run is a first launch, printed alone as
``etrun_kept_first_launch_to_first_step``, and the medians are of the launches after it, which
find the zygote ready). The floor of a first launch is measured too: one fresh interpreter importing
etrun's default preload list as a torchrun worker does (``preload_import_median``) and with the cyclic
garbage collector paused, as the zygote does before its first fork (``preload_import_gc_paused_median``),
and ``launch_to_first_step_floor_vs_torchrun``, the latter over torchrun's launch to first step: the
lowest launch ratio a launcher that imports torch once per node can reach on this machine. Each
recovery is split into
phases: etrun's own (detect, report, stop, rendezvous, spawn, from its log) and the new
worker's (process start, imports, init, first step, from the toy's events).
At the end the toy is told to stop (it leaves its loop after the step it is in):
``<launcher>_stop_to_exit_median`` is the time from then to the launcher's exit, the wait after
the last step for the command to return.
Prints ``name: value unit`` lines; ``--quick`` does 2 runs per launcher instead of 5.
``--backend nccl --nproc 1`` runs the toy on a GPU (NCCL allows one rank per GPU; docs/gpu.md).

``--horovod`` (needs ``make horovod``) instead compares elastic Horovod: launcher_toy_horovod.py
(``hvd.elastic.run``, unmodified) under etrun and under horovodrun's own elastic mode
(``horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script``, two host names of this
machine with one slot each, so that the failed worker's host can be blacklisted while the other
goes on), killing rank 1: ``recovery_horovod_kill_to_next_step_median_<launcher>`` is the time from
the SIGKILL to the survivor's next step, and ``recovery_horovod_etrun_vs_horovodrun`` their ratio.
Under horovodrun the job goes on with 1 worker; under etrun a replacement joins at once (2).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOY = os.path.join(HERE, "launcher_toy.py")
TOY_INPROCESS = os.path.join(HERE, "launcher_toy_inprocess.py")
TOY_HOROVOD = os.path.join(HERE, "launcher_toy_horovod.py")
BIN = os.path.dirname(sys.executable)
sys.path.insert(0, os.path.dirname(HERE))
from elastictrain.launcher.config import DEFAULT_PRELOAD  # noqa: E402
from elastictrain.launcher.zygote_keep import stop_all  # noqa: E402


def read(path: str) -> list[tuple[float, int, int, int, str]]:
    rows = []
    if os.path.exists(path):
        for line in open(path):
            p = line.split(None, 4)
            if len(p) == 5:
                rows.append((float(p[0]), int(p[1]), int(p[2]), int(p[3]), p[4].strip()))
    return rows


def wait_for(path: str, pred, timeout: float):
    deadline = time.time() + timeout
    while time.time() < deadline:
        for r in read(path):
            if pred(r):
                return r
        time.sleep(0.01)
    return None


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill the launcher and every process below it (torchrun's workers leave its process group)."""
    import psutil

    try:
        procs = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in procs:
        try:
            if "--keep" not in p.cmdline():  # a kept zygote outlives the launch that started it
                p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()


def _ask_to_stop(proc: subprocess.Popen, events: str) -> float | None:
    """The toys stop training when ``<events>.stop`` exists; give the launcher 20 s to end.
    Returns the seconds from the stop to the launcher's exit (None past 20 s): what a user waits
    after the last step for the command to return (the workers' and the launcher's own exit)."""
    t = time.time()
    open(events + ".stop", "w").close()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        return None
    return time.time() - t


def _clean_up(proc: subprocess.Popen, events: str, out, work: str) -> None:
    """Stop a run: the launcher's tree, the workers it left behind, its log and folder."""
    kill_tree(proc)
    for pid in {r[3] for r in read(events)}:  # workers a launcher left behind
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    out.close()
    shutil.rmtree(work, ignore_errors=True)


def _phases(rows, t_kill: float, nxt, log_path: str) -> dict:
    """Where the time from kill to the next step went: the launcher's own phases (etrun logs
    them), then the new worker's: process start, imports, init (process group, DDP, torch.load)
    and the first step."""
    out: dict = {}
    gen = nxt[2]
    new = [r for r in rows if r[2] == gen and r[0] > t_kill]
    starts = [r[0] for r in new if r[4] == "start"]
    if starts:
        out["phase_kill_to_worker_start"] = min(starts) - t_kill
        for label, what in (("phase_imports", "imported"), ("phase_init", "joined")):
            ts = [r[0] for r in new if r[4] == what]
            if ts:
                out[label] = max(ts) - (max(starts) if label == "phase_imports" else
                                        max(r[0] for r in new if r[4] == "imported"))
        joined = [r[0] for r in new if r[4] == "joined"]
        if joined:
            out["phase_first_step"] = nxt[0] - max(joined)
    try:
        text = open(log_path, errors="replace").read()
    except OSError:
        return out
    m = re.search(r"recovery into generation \d+ \(s\): (.*?); detected at ([0-9.]+)", text)
    if m:
        out["phase_detect"] = float(m.group(2)) - t_kill
        for name, value in re.findall(r"(\w+) ([0-9.]+)", m.group(1)):
            if name != "detect":
                out[f"phase_{name}"] = float(value)
    return out


def preload_import(env: dict, paused: bool) -> float:
    """Seconds from starting a fresh interpreter to the end of its imports of etrun's default
    preload list, one after the other in one process: as a torchrun worker imports them, or
    (``paused``) through the zygote's own ``runner.import_preload``. The interpreter's teardown is
    not counted: it leaves with os._exit, as the zygote does."""
    load = ("from elastictrain.launcher.runner import import_preload\nimport_preload(%r)" if paused else
            "for m in %r:\n    try: __import__(m)\n    except ImportError: pass") % (list(DEFAULT_PRELOAD),)
    code = load + "\nimport os, sys\nsys.stdout.write('imported\\n'); sys.stdout.flush(); os._exit(0)"
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    took = time.perf_counter() - t
    proc.wait(timeout=60)
    if line.strip() != "imported":
        raise RuntimeError(f"importing the preload list failed (exit {proc.returncode})")
    return took


def one_run(cmd: list[str], env: dict, recovery_timeout: float, kill_after: float, toy: str = TOY,
            nproc: int = 2) -> dict:
    work = tempfile.mkdtemp(prefix="et-launch-")
    events = os.path.join(work, "events")
    env = dict(env, BENCH_EVENTS=events)
    out = open(os.path.join(work, "launcher.log"), "wb")
    t0 = time.time()
    proc = subprocess.Popen(cmd + ["--nproc-per-node", str(nproc), "--max-restarts", "3", "--standalone", toy],
                            env=env, cwd=work, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    res: dict = {}
    try:
        first = wait_for(events, lambda r: r[4].startswith("step") and r[2] == 0, 60)
        starts = [r[0] for r in read(events) if r[4] == "start" and r[2] == 0]
        if first is None or not starts:
            res["error"] = "no first step"
            return res
        res["start"] = min(starts) - t0
        res["first_step"] = first[0] - t0
        time.sleep(kill_after)  # a failure comes after the job settled (etrun's spares are warm by then)
        before = {r[1]: r[3] for r in read(events) if r[2] == 0}
        victim = before[nproc - 1]  # the last rank (rank 1 of the usual 2)
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)
        nxt = wait_for(events, lambda r: r[4].startswith("step") and r[2] >= 1 and r[0] > t_kill, recovery_timeout)
        res["recovered"] = nxt is not None
        if nxt is not None:
            res["kill_to_step"] = nxt[0] - t_kill
            res.update(_phases(read(events), t_kill, nxt, os.path.join(work, "launcher.log")))
            time.sleep(0.5)
            after = {r[1]: r[3] for r in read(events) if r[2] == nxt[2]}
            res["pids"] = f"rank0 {before.get(0)}->{after.get(0)} rank1 {before.get(1)}->{after.get(1)}"
        took = _ask_to_stop(proc, events)
        if took is not None:
            res["stop_to_exit"] = took
        return res
    finally:
        _clean_up(proc, events, out, work)


def horovod_run(launcher: str, recovery_timeout: float, kill_after: float) -> dict:
    """One elastic Horovod run under ``launcher`` (etrun or horovodrun): kill rank 1 after
    ``kill_after`` s of training; the survivor's next step after the kill ends the recovery."""
    work = tempfile.mkdtemp(prefix="et-hvd-")
    events = os.path.join(work, "events")
    env = dict(os.environ, BENCH_EVENTS=events)
    if launcher == "etrun":
        cmd = [os.path.join(BIN, "etrun"), "--nproc-per-node", "2", "--max-restarts", "3", "--horovod", "on",
               TOY_HOROVOD]
    else:
        discover = os.path.join(work, "discover.sh")
        with open(discover, "w") as f:
            f.write("#!/bin/sh\necho localhost:1\necho 127.0.0.1:1\n")
        os.chmod(discover, 0o755)
        cmd = [os.path.join(BIN, "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2", "--gloo",
               "--host-discovery-script", discover, sys.executable, TOY_HOROVOD]
    out = open(os.path.join(work, "launcher.log"), "wb")
    proc = subprocess.Popen(cmd, env=env, cwd=work, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    res: dict = {}
    try:
        if wait_for(events, lambda r: r[4].startswith("step") and r[1] == 1, 90) is None:
            res["error"] = "no first step"
            return res
        time.sleep(kill_after)
        before = {r[1]: r[3] for r in read(events) if r[2] == 0}
        survivor = before[0]
        t_kill = time.time()
        os.kill(before[1], signal.SIGKILL)
        nxt = wait_for(events, lambda r: r[4].startswith("step") and r[3] == survivor and r[2] >= 1
                       and r[0] > t_kill, recovery_timeout)
        res["recovered"] = nxt is not None
        if nxt is not None:
            res["kill_to_step"] = nxt[0] - t_kill
            full = wait_for(events, lambda r: r[4].startswith("step") and r[3] not in before.values(), 10.0)
            if full is not None:  # a new worker trains: the job is back to 2
                res["kill_to_full_size"] = full[0] - t_kill
            time.sleep(1.0)
            res["workers_after"] = len({r[3] for r in read(events) if r[0] > nxt[0]})
            res["survivor_kept"] = any(r[3] == survivor for r in read(events) if r[0] > t_kill)
        _ask_to_stop(proc, events)
        return res
    finally:
        _clean_up(proc, events, out, work)


def main_horovod(runs: int, recovery_timeout: float, kill_after: float) -> None:
    print(f"# toy: {TOY_HOROVOD} (hvd.elastic.run), 2 workers on gloo, {runs} runs per launcher, kill rank 1 after "
          f"{kill_after:.0f} s of training, recovery timeout {recovery_timeout:.0f} s, {os.cpu_count()} CPUs")
    med = {}
    for name in ("horovodrun", "etrun"):
        results = []
        for i in range(runs):
            r = horovod_run(name, recovery_timeout, kill_after)
            results.append(r)
            print(f"# horovod {name} run {i + 1}: " + ", ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()), flush=True)
        vals = [r["kill_to_step"] for r in results if "kill_to_step" in r]
        med[name] = statistics.median(vals) if vals else float("nan")
        print(f"recovery_horovod_kill_to_next_step_median_{name}: {med[name]:.3f} s")
        print(f"recovery_horovod_successes_{name}: {sum(1 for r in results if r.get('recovered'))}/{runs} kills")
        print(f"recovery_horovod_survivor_kept_pid_{name}: {sum(1 for r in results if r.get('survivor_kept'))}/{runs}"
              " kills")
        full = [r["kill_to_full_size"] for r in results if "kill_to_full_size" in r]
        print(f"recovery_horovod_kill_to_full_size_median_{name}: "
              f"{statistics.median(full) if full else float('nan'):.3f} s ({len(full)}/{runs} runs back to 2 workers "
              "within 10 s)")
        after = [r["workers_after"] for r in results if "workers_after" in r]
        print(f"recovery_horovod_workers_after_{name}: {statistics.median(after) if after else float('nan'):.0f} "
              "workers")
    print(f"recovery_horovod_etrun_vs_horovodrun: {med['etrun'] / med['horovodrun']:.2f} x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 runs per launcher")
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--recovery-timeout", type=float, default=20.0)
    ap.add_argument("--kill-after", type=float, default=10.0,
                    help="seconds of training before the kill (etrun's spares start 5 s in and then import)")
    ap.add_argument("--horovod", action="store_true", help="elastic Horovod: etrun against horovodrun")
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"),
                    help="the toy's process group: gloo on the CPU, or nccl (each rank on a GPU; one rank per GPU)")
    ap.add_argument("--nproc", type=int, default=2, help="workers (default 2; NCCL on one GPU: 1)")
    ap.add_argument("--only", default=None, help="these launchers only (comma-separated names; the ratios need "
                    "torchrun, torchrun_noshare, etrun, etrun_cold, etrun_spares, etrun_spares_cold, etrun_inprocess, "
                    "etrun_kept)")
    args = ap.parse_args()
    runs = args.runs or (2 if args.quick else 5)
    if args.horovod:
        return main_horovod(runs, args.recovery_timeout, min(args.kill_after, 5.0))
    base = dict(os.environ, BENCH_BACKEND=args.backend)
    base.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    etrun, torchrun = [os.path.join(BIN, "etrun")], [os.path.join(BIN, "torchrun")]
    if not os.path.exists(etrun[0]):  # not installed (a machine with the sources on PYTHONPATH)
        etrun = [sys.executable, "-m", "elastictrain.launcher.cli"]
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(HERE), base.get("PYTHONPATH")]))
    if not os.path.exists(torchrun[0]):
        torchrun = [sys.executable, "-m", "torch.distributed.run"]
    # name: (command, environment, script, seconds of training before the kill)
    launchers = {
        "torchrun": (torchrun, base, TOY, args.kill_after),
        "torchrun_noshare": (torchrun, dict(base, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1"), TOY, args.kill_after),
        "etrun": (etrun, base, TOY, args.kill_after),
        # a failure 1 s into training: with the zygote a fork replaces the worker at once
        "etrun_cold": (etrun, base, TOY, 1.0),
        # warm spares instead of the zygote; a failure before they are ready is a cold start
        "etrun_spares": (etrun + ["--zygote", "off"], base, TOY, args.kill_after),
        "etrun_spares_cold": (etrun + ["--zygote", "off"], base, TOY, 1.0),
        "etrun_inprocess": (etrun, base, TOY_INPROCESS, args.kill_after),  # (gloo only)
        # the zygote kept between launches: the first run starts it (a first launch), the others find
        # it ready (one more run than the others, so that the warm figures have as many)
        "etrun_kept": (etrun + ["--zygote", "keep"], base, TOY, args.kill_after),
    }
    print(f"# toy: {TOY} (in-process: {TOY_INPROCESS}), {args.nproc} workers on {args.backend}, {runs} runs per "
          f"launcher, kill after "
          f"{args.kill_after:.0f} s of training (*_cold: 1 s), recovery timeout {args.recovery_timeout:.0f} s, "
          f"{os.cpu_count()} CPUs")
    summary: dict[str, dict[str, list[float]]] = {}
    if args.only:
        launchers = {k: v for k, v in launchers.items() if k in args.only.split(",")}
    for name, (cmd, env, toy, kill_after) in launchers.items():
        results = []
        kept = name == "etrun_kept"
        if kept:
            stop_all()  # its first run is a first launch
        for i in range(runs + kept):
            r = one_run(cmd, env, args.recovery_timeout, kill_after, toy, args.nproc)
            print(f"# {name} run {i + 1}{' (first launch)' * (kept and i == 0)}: "
                  + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()),
                  flush=True)
            if kept and i == 0:
                v = r.get("first_step")
                print(f"etrun_kept_first_launch_to_first_step: {v:.3f} s" if v is not None else
                      "etrun_kept_first_launch_to_first_step: nan s")
                continue
            results.append(r)
        if kept:
            stop_all()
        s = summary[name] = {k: [r[k] for r in results if k in r]
                             for k in ("start", "first_step", "kill_to_step", "stop_to_exit")}
        ok = sum(1 for r in results if r.get("recovered"))
        for key, label in (("start", "launch_to_worker_start"), ("first_step", "launch_to_first_step"),
                           ("stop_to_exit", "stop_to_exit")):
            vals = s[key]
            print(f"{name}_{label}_median: {statistics.median(vals):.3f} s" if vals else f"{name}_{label}_median: nan s")
        vals = s["kill_to_step"]
        print(f"recovery_kill_to_next_step_median_{name}: {statistics.median(vals):.3f} s" if vals else
              f"recovery_kill_to_next_step_median_{name}: nan s")
        if vals:
            print(f"recovery_kill_to_next_step_min_{name}: {min(vals):.3f} s")
        print(f"recovery_successes_{name}: {ok}/{runs} kills")
        phases = sorted({k for r in results for k in r if k.startswith("phase_")})
        for key in phases:
            pv = [r[key] for r in results if key in r]
            print(f"recovery_{key}_median_{name}: {statistics.median(pv):.3f} s")
        if name == "etrun_inprocess":
            kept = 0
            for r in results:
                m = re.match(r"rank0 (\d+)->(\d+) rank1 (\d+)->(\d+)", r.get("pids", ""))
                kept += bool(m and m.group(1) == m.group(2) and m.group(3) != m.group(4))
            print(f"recovery_inprocess_survivor_kept_pid: {kept}/{runs} kills")
        sys.stdout.flush()

    plain, floor = [], []
    if "etrun" in launchers or "torchrun" in launchers:
        for _ in range(runs):  # (alternating, so that both see the same machine)
            plain.append(preload_import(base, False))
            floor.append(preload_import(base, True))
        print(f"preload_import_median: {statistics.median(plain):.3f} s")
        print(f"preload_import_gc_paused_median: {statistics.median(floor):.3f} s")

    def median(name: str, key: str = "kill_to_step") -> float:
        vals = summary.get(name, {}).get(key)
        return statistics.median(vals) if vals else float("nan")

    base_rec = median("torchrun_noshare")
    print(f"recovery_etrun_vs_torchrun: {median('etrun') / base_rec:.2f} x")
    print(f"recovery_etrun_cold_vs_torchrun: {median('etrun_cold') / base_rec:.2f} x")
    print(f"recovery_etrun_spares_vs_torchrun: {median('etrun_spares') / base_rec:.2f} x")
    print(f"recovery_etrun_spares_cold_vs_torchrun: {median('etrun_spares_cold') / base_rec:.2f} x")
    print(f"recovery_inprocess_kill_to_next_step_median: {median('etrun_inprocess'):.3f} s")
    print(f"recovery_inprocess_vs_torchrun: {median('etrun_inprocess') / base_rec:.2f} x")
    print(f"recovery_etrun_vs_torchrun_default_store: {median('etrun') / median('torchrun'):.2f} x")
    print(f"etrun_vs_torchrun_launch_to_worker_start: {median('etrun', 'start') / median('torchrun', 'start'):.2f} x")
    print(f"etrun_vs_torchrun_launch_to_first_step: "
          f"{median('etrun', 'first_step') / median('torchrun', 'first_step'):.2f} x")
    imports = statistics.median(floor) if floor else float("nan")
    print(f"etrun_launch_to_first_step_over_preload_import_gc_paused: {median('etrun', 'first_step') / imports:.2f} x")
    print(f"launch_to_first_step_floor_vs_torchrun: {imports / median('torchrun', 'first_step'):.2f} x")
    print(f"etrun_kept_vs_torchrun_launch_to_first_step: "
          f"{median('etrun_kept', 'first_step') / median('torchrun', 'first_step'):.2f} x")
    print(f"recovery_etrun_kept_vs_torchrun: {median('etrun_kept') / base_rec:.2f} x")
    print(f"etrun_spares_vs_torchrun_launch_to_first_step: "
          f"{median('etrun_spares', 'first_step') / median('torchrun', 'first_step'):.2f} x")
    print(f"etrun_vs_torchrun_stop_to_exit: {median('etrun', 'stop_to_exit') / median('torchrun', 'stop_to_exit'):.2f} x")


if __name__ == "__main__":
    main()
