"""The toy DDP job that benchmarks/launcher.py runs under torchrun and etrun.

Unmodified torchrun style: reads RANK/WORLD_SIZE/MASTER_* only. Appends timestamped events
(start, imported, joined, step N) to $BENCH_EVENTS so the harness can time each phase.
Stops when $BENCH_EVENTS.stop exists.
"""

import os
import time

T_START = time.time()
EVENTS = os.environ["BENCH_EVENTS"]
RANK = int(os.environ["RANK"])
GEN = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def event(what: str, t: float = None) -> None:
    with open(EVENTS, "a") as f:
        f.write(f"{t or time.time():.6f} {RANK} {GEN} {os.getpid()} {what}\n")


event("start", T_START)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

event("imported")
dist.init_process_group("gloo")
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = os.path.join(os.path.dirname(EVENTS), "toy_ckpt.pt")
step = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.module.load_state_dict(state["model"])
    step = state["step"]
event("joined")
x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
while not os.path.exists(EVENTS + ".stop"):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    event(f"step {step}")
    if step % 10 == 0 and RANK == 0:
        torch.save({"model": model.module.state_dict(), "step": step}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    time.sleep(0.05)
dist.destroy_process_group()
