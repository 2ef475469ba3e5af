"""Exactly-once data across kill -9 of workers, kill -9 of the coordinator and world-size changes.

Real processes throughout: a coordinator server, and gloo data-parallel workers
(tests/integration/workers/ledger_train.py). This test plays the launcher's part: it opens
a generation, starts its workers, and when one dies restarts the group in the next
generation, with the next world size of the schedule.
"""

import os
import random
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from elastictrain import CoordinatorClient

pytest.importorskip("torch")

WORKER = os.path.join(os.path.dirname(__file__), "workers", "ledger_train.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_group(coordinator, tmp_path, job, gen, world, env_extra):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, ET_COORDINATOR=coordinator.url, ET_TOKEN_FILE=coordinator.token_file,
                   ET_JOB_ID=job, ET_GENERATION=str(gen), RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", LEDGER_DIR=str(tmp_path / "ckpt"), **env_extra)
        log = open(tmp_path / f"gen{gen}-rank{rank}.log", "wb")
        procs.append(subprocess.Popen([sys.executable, WORKER], env=env, stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return procs


def stop_all(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def run_elastic_job(coordinator, tmp_path, *, seed, samples, schedule, worker_kills, coordinator_kill,
                    deadline_s, step_sleep=0.02, min_kills=None, taper=0):
    rng = random.Random(seed)
    (tmp_path / "ckpt").mkdir()
    job = "ledger"
    client = CoordinatorClient(coordinator.url, coordinator.token, retry_for=20.0)
    client.create_job(job, 1, 4)
    env_extra = {"LEDGER_SAMPLES": str(samples), "LEDGER_EPOCHS": "2", "LEDGER_STEP_SLEEP": str(step_sleep),
                 "LEDGER_TAPER": str(taper)}
    gen, kills_left, coord_killed = 0, worker_kills, not coordinator_kill
    history = []
    t_end = time.monotonic() + deadline_s
    for world in schedule:
        gen = client.open_generation(job, gen, world, "failure" if gen else "start").generation
        procs = start_group(coordinator, tmp_path, job, gen, world, env_extra)
        started = time.monotonic()
        # workers need ~2 s to import torch and join; kill inside the training that follows
        coord_kill_at = started + rng.uniform(3.5, 4.5) if not coord_killed and gen >= 2 else None
        kill_at = started + rng.uniform(5.0, 7.5) if kills_left else None
        outcome = None
        while outcome is None:
            assert time.monotonic() < t_end, f"job did not finish in {deadline_s} s; history {history}"
            time.sleep(0.05)
            now = time.monotonic()
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                outcome = "finished"
            elif any(c not in (None, 0) for c in codes):
                bad = [i for i, c in enumerate(codes) if c not in (None, 0)]
                logs = (tmp_path / f"gen{gen}-rank{bad[0]}.log").read_text()[-3000:]
                pytest.fail(f"worker {bad[0]} of generation {gen} failed by itself:\n{logs}")
            elif kill_at is not None and now >= kill_at:
                victim = rng.randrange(world)
                procs[victim].send_signal(signal.SIGKILL)
                kills_left -= 1
                outcome = f"killed rank {victim}"
            elif coord_kill_at is not None and now >= coord_kill_at:
                coordinator.kill()  # kill -9 mid-epoch; workers must ride it out
                time.sleep(0.5)
                coordinator.start()
                coord_killed, coord_kill_at = True, None
                history.append(f"gen {gen}: coordinator killed and restarted")
        stop_all(procs)
        history.append(f"gen {gen} (world {world}): {outcome}")
        if outcome == "finished":
            break
    else:
        pytest.fail(f"schedule ran out before the job finished: {history}")
    info = client.dataset(job, "train")
    assert info.finished and info.last_commit == "final", (info, history)
    with open(tmp_path / "ckpt" / "final.npy", "rb") as f:
        counts = np.load(f)
    lost, repeated = int(np.count_nonzero(counts == 0)), int(np.count_nonzero(counts > 1))
    assert lost == 0 and repeated == 0, f"{lost} samples lost, {repeated} repeated; {history}"
    assert counts.shape == (2, samples)
    done = worker_kills - kills_left
    assert done >= (worker_kills if min_kills is None else min_kills) and coord_killed, history
    return history


def test_exactly_once_with_kills_and_rescaling(coordinator, tmp_path):
    # world sizes 2 -> 3 -> 1 -> 2 ...: three random worker kills, one coordinator kill -9; each
    # epoch ends in shrinking shards (taper 3): the partition changes, the guarantee does not
    history = run_elastic_job(coordinator, tmp_path, seed=1, samples=100_000,
                              schedule=[2, 3, 1, 2, 3, 2, 1, 2], worker_kills=3, coordinator_kill=True,
                              deadline_s=240, step_sleep=0.03, min_kills=2, taper=3)
    print("\n".join(history))
    assert len({h.split("(world ")[1][0] for h in history if "(world " in h}) >= 2  # the world size changed


@pytest.mark.slow
@pytest.mark.parametrize("seed, taper", [(2, 0), (3, 0), (4, 5)])
def test_exactly_once_many_kills(coordinator, tmp_path, seed, taper):
    # slower steps, so that the job outlives eight kills
    run_elastic_job(coordinator, tmp_path, seed=seed, samples=100_000,
                    schedule=[3, 1, 2, 3, 2, 1, 3, 2, 2, 3, 1, 2], worker_kills=8, coordinator_kill=True,
                    deadline_s=600, step_sleep=0.08, min_kills=6, taper=taper)
