"""The process every Python worker starts as: ``python -u -m elastictrain.launcher.runner``.

It reads one JSON command from stdin (environment, working directory, entrypoint, args),
becomes that worker and runs the script or module as ``__main__``. A *warm spare* is the
same process started ahead of need with ``--preload torch``: it pays the import while
training runs and waits on stdin, so a restarted worker starts in milliseconds instead of
the ~1.5 s ``import torch`` takes. An uncaught exception is written to
``TORCHELASTIC_ERROR_FILE`` in torchelastic's format, so ``etrun`` can report the root cause.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import sys
import time
import traceback


def _user_traceback(exc: BaseException) -> str:
    """The traceback without the frames of this runner and of runpy."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__)
                              or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def write_error(path: str, message: str, tb: str) -> None:
    """Write torchelastic's error file (what ``etrun`` reports as the root cause)."""
    data = {"message": {"message": message,
                        "extraInfo": {"py_callstack": tb, "timestamp": str(int(time.time()))}}}
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass  # the traceback still reaches stderr below


def _die_with_launcher(parent: int) -> None:
    """If etrun dies (even by SIGKILL), take this worker and its children down with it:
    an orphaned worker would hold its collectives and leases until they time out."""
    import signal
    import threading

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                try:
                    os.killpg(0, signal.SIGKILL)
                finally:
                    os._exit(137)

    threading.Thread(target=watch, name="et-launcher-watch", daemon=True).start()


def _bind_numa(mode: str, gpu: int) -> None:
    """``etrun --numa-binding``: bind this worker's threads to the CPUs near its GPU, with
    torch's own topology code (torch.numa.binding); a failure is reported, not fatal."""
    try:
        from torch.numa.binding import AffinityMode, NumaOptions, _maybe_apply_numa_binding_to_current_process

        _maybe_apply_numa_binding_to_current_process(
            gpu_index=gpu, numa_options=NumaOptions(AffinityMode(mode), should_fall_back_if_binding_fails=True))
    except Exception as exc:  # an older torch, no topology in /sys: run unbound
        print(f"etrun: --numa-binding {mode} not applied on GPU {gpu}: {exc}", file=sys.stderr, flush=True)


def _limit_memory(limit: int) -> None:
    """etrun's --memory-limit: cap this worker's data segment (heap and anonymous mappings, what
    tensors and arrays use; not the shared libraries torch maps), so that running out raises
    MemoryError (torch: "can't allocate memory") in the worker instead of waking the host's OOM
    killer."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (ValueError, OSError) as exc:
        print(f"etrun: --memory-limit not applied: {exc}", file=sys.stderr, flush=True)


def _keep_destroyed_groups(keep: int = 2) -> None:
    """Hold a reference to the last ``keep`` process groups a script destroys, so that freeing
    a DDP model afterwards (a script that calls ``dist.destroy_process_group()`` and then returns
    from ``main``) never frees the group itself. Freeing a gloo group joins its threads while
    holding the GIL, and a gloo thread still destroying a finished work item needs the GIL for
    the Python context the backward pass stashed in it: a deadlock at exit (pytorch issue
    56297), seen here in about one run in four of examples/torch_group_job.py when torch._dynamo
    was imported ahead. Older groups are released as newer ones are kept (an elastic job
    destroys one per recovery); long idle, their threads join at once. Applies when
    torch.distributed is already imported (a zygote or warm spare); the process ends with
    ``os._exit`` (``_exit``), so the kept groups are never torn down."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not getattr(dist, "is_available", lambda: False)() or getattr(dist, "_et_keeps", False):
        return
    real = dist.destroy_process_group
    kept: list = []

    def destroy_process_group(group=None):
        try:
            c10d = dist.distributed_c10d
            groups = list(c10d._world.pg_map) if group is None else [group]
            groups = [g for g in groups if g is not None]
            kept.extend(groups)
            del kept[:-max(keep, len(groups))]
        except Exception:  # noqa: BLE001 - a torch without these internals: destroy as asked
            pass
        return real(group)

    destroy_process_group.__doc__ = real.__doc__
    dist.destroy_process_group = destroy_process_group
    dist.distributed_c10d.destroy_process_group = destroy_process_group
    dist._et_keeps = True


def import_preload(names) -> None:
    """Import ``names`` (those not installed are skipped) with the cyclic garbage collector paused,
    then freeze what they made (``gc.freeze``). Imports make long-lived objects, not garbage, and
    the collections they would trigger scan the growing heap again and again: a quarter of
    ``import torch, torch._dynamo`` on a small machine (2.1 s -> 1.6 s: benchmarks/launcher.py's
    ``preload_import_median`` and ``preload_import_gc_paused_median``). Frozen, those objects are
    skipped by every later collection, here and in the processes forked from here (the zygote's
    workers), whose collections then do not write to, and so copy, the pages they share with the
    zygote (CPython's advice for forking servers)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        for name in names:
            try:
                __import__(name)
            except ImportError:
                pass
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def main() -> None:
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--preload":
        _die_with_launcher(os.getppid())
        import_preload(filter(None, args[1].split(",")))
        serve(watching=True)
    else:
        serve()


def serve(watching: bool = False) -> None:
    """Read the command from stdin and become the worker (a fresh runner, a warm spare, or a
    process the zygote forked: see zygote.py). Dies with its parent (etrun, or the zygote)."""
    if not watching:
        _die_with_launcher(os.getppid())
    line = sys.stdin.readline()
    if not line:
        return  # the launcher retired this spare
    cmd = json.loads(line)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(cmd["env"])
    for p in reversed([p for p in cmd["env"].get("PYTHONPATH", "").split(os.pathsep) if p]):
        if p not in sys.path:
            sys.path.insert(0, p)
    os.chdir(cmd["cwd"])
    torch = sys.modules.get("torch")
    if torch is not None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    _keep_destroyed_groups()
    if os.environ.get("ET_MEMORY_CGROUP"):  # etrun --memory-enforce cgroup: in before the script runs
        from .memcg import join

        if not join(os.environ["ET_MEMORY_CGROUP"], os.getpid()):
            print(f"etrun: could not join the memory cgroup {os.environ['ET_MEMORY_CGROUP']}", file=sys.stderr,
                  flush=True)
    elif os.environ.get("ET_MEMORY_LIMIT", "").isdigit():
        _limit_memory(int(os.environ["ET_MEMORY_LIMIT"]))
    if os.environ.get("ET_NUMA_BINDING"):
        _bind_numa(os.environ["ET_NUMA_BINDING"], int(os.environ.get("ET_GPU_INDEX", "0")))
    entry = cmd["entrypoint"]
    sys.argv = [entry, *cmd["args"]]
    try:
        if cmd["module"]:
            sys.path.insert(0, os.getcwd())
            runpy.run_module(entry, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(entry)))
            runpy.run_path(entry, run_name="__main__")
    except SystemExit as exc:
        _exit(exc.code)
    except BaseException as exc:
        tb = _user_traceback(exc)
        error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if error_file and not os.path.exists(error_file):  # torch's @record may have written it
            write_error(error_file, f"{type(exc).__name__}: {exc}", tb)
        sys.stderr.write(tb)
        sys.stderr.flush()
        # as Python ends a script that raised: its atexit hooks run (a checkpoint still persisting is
        # finished, runtime/checkpoint.py); its other threads are not waited for (a failed worker exits)
        _exit(130 if isinstance(exc, KeyboardInterrupt) else 1, join=False)
    _exit(0)


def exit_status(code) -> int:
    """The process status ``sys.exit(code)`` gives: None is 0, an int itself, anything else is
    printed to stderr and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr, flush=True)
    return 1


def _exit(code, join: bool = True) -> None:
    """End the worker as a normal exit would (join non-daemon threads, unless ``join`` is False,
    run atexit handlers, flush), then skip the interpreter's teardown: destroying torch's C++
    state there (gloo and intra-op threads of a torch imported by a warm spare before the job's
    environment was set) aborted about one worker in three with "terminate called without an
    active exception"."""
    import atexit
    import threading

    status = exit_status(code)
    me = threading.current_thread()
    for t in threading.enumerate():
        if join and t is not me and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status & 0xFF)  # as the shell sees sys.exit(status)


if __name__ == "__main__":
    main()
