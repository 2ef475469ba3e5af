"""A rank that blocks forever in its step: after ET_HANG_TIMEOUT without a step every worker
dumps its threads' stacks (the hung rank's names the blocking frame), the group restarts within
the timeout + 5 s and the job finishes."""

import os
import re
import time

import pytest

from .test_etrun import etrun, finish, write

pytest.importorskip("torch")


def test_a_hung_rank_is_dumped_and_the_group_restarts(tmp_path):
    script = write(tmp_path, "t.py", """
        import os, sys, time
        print(f"start {os.environ['RANK']} gen {os.environ['ET_GENERATION']} at {time.time():.3f}", flush=True)
        import torch
        import torch.distributed as dist
        import elastictrain as et

        def stuck_forever():
            time.sleep(10**6)

        job = et.init()
        dist.init_process_group("gloo")
        for step in range(1, 60):
            t = torch.ones(1)
            dist.all_reduce(t)
            job.report_step(step)
            if step == 30 and job.rank == 1 and job.generation == 1:
                print(f"hanging at {time.time():.3f}", flush=True)
                stuck_forever()
            time.sleep(0.01)
        print(f"rank {job.rank} done in generation {job.generation}", flush=True)
        dist.destroy_process_group()
    """)
    env = dict(os.environ, ET_HANG_TIMEOUT="3", ET_MONITOR_PERIOD="0.2")
    t0 = time.monotonic()
    code, out, err = finish(etrun(["--nproc-per-node", "2", "--max-restarts", "1", script], cwd=str(tmp_path),
                                  env=env), 120)
    assert code == 0, out[-2000:] + err[-3000:]
    assert "rank 1 done in generation 2" in out and "rank 0 done in generation 2" in out, out
    assert "hang: rank 1 made no training step" in err, err[-3000:]
    assert re.search(r"stuck in File \"[^\"]*t\.py\", line \d+ in stuck_forever", err), err[-3000:]
    assert "in stuck_forever" in err  # the hung rank's dump names the blocking frame
    root = err.split("root cause", 1)[1]
    assert root.split("\n")[1].strip().startswith("rank 1 "), root[:500]  # the hung rank, not its peer
    hung = float(re.search(r"hanging at ([0-9.]+)", out).group(1))
    restarted = min(float(t) for t in re.findall(r"start \d gen 2 at ([0-9.]+)", out))
    assert restarted - hung < 3 + 5, (hung, restarted)
    assert time.monotonic() - t0 < 100


def test_the_hang_watch_can_be_paused_and_turned_off(tmp_path):
    script = write(tmp_path, "t.py", """
        import time
        import elastictrain as et
        job = et.init()
        for step in range(1, 20):
            job.report_step(step)
            time.sleep(0.01)
        with job.hang_watch_paused():  # an evaluation pass: no steps for longer than the timeout
            time.sleep(2.5)
        job.report_step(20)
        print("finished", flush=True)
    """)
    env = dict(os.environ, ET_HANG_TIMEOUT="1", ET_MONITOR_PERIOD="0.1")
    code, out, err = finish(etrun([script], cwd=str(tmp_path), env=env), 60)
    assert code == 0 and "finished" in out, err[-3000:]
    code, out, err = finish(etrun([script], cwd=str(tmp_path), env=dict(env, ET_HANG_TIMEOUT="bad")), 60)
    assert code != 0 and "ET_HANG_TIMEOUT" in err


def test_a_survivor_that_hangs_before_its_next_generation_is_reported(tmp_path):
    """In-process recovery: rank 0 dies while rank 1 (opted in) is stuck outside any collective;
    etrun keeps rank 1 for generation 2, but it never reads its assignment. Its monitor ends it and
    writes the error file it was started with, and etrun reports that hang as the failure (not
    'exited with code 124, no error file')."""
    script = write(tmp_path, "t.py", """
        import os, time
        import torch
        import torch.distributed as dist
        import elastictrain as et
        from elastictrain_torch import TorchCheckpointer, elastic

        def stuck_forever():
            time.sleep(10**6)

        job = et.init()
        model = torch.nn.Linear(2, 2)
        ckpt = TorchCheckpointer("ck", model=model, job=job, extra_state={"progress": {"step": 0}})

        @elastic.run(ckpt)
        def train(group):
            step = ckpt.state["progress"]["step"]
            while step < 50:
                step += 1
                dist.all_reduce(torch.ones(1), group=group)
                job.report_step(step)
                if step == 30 and job.generation == 1:
                    if job.rank == 0:
                        os._exit(3)
                    stuck_forever()
                time.sleep(0.01)
            return step

        print(f"rank {job.rank} done at step {train()} in generation {job.generation}", flush=True)
    """)
    env = dict(os.environ, ET_HANG_TIMEOUT="3", ET_MONITOR_PERIOD="0.2")
    code, out, err = finish(etrun(["--nproc-per-node", "2", "--max-restarts", "3", script], cwd=str(tmp_path),
                                  env=env), 120)
    assert code == 0, out[-2000:] + err[-3000:]
    assert "continue in their own process" in err, err[-3000:]  # rank 1 was kept for generation 2
    assert re.search(r"rank 0 done at step 50 in generation [3-9]", out), out
    failure = err.split("worker failure in generation 2", 1)[1].split("generation 3", 1)[0]
    assert "hang: rank 1 made no training step" in failure, err[-3000:]
    assert "in stuck_forever" in failure and "no error file" not in failure, failure
