"""The toy DDP job that benchmarks/launcher.py runs under torchrun and etrun.

Unmodified torchrun style: reads RANK/WORLD_SIZE/MASTER_* only. Appends timestamped events
(start, imported, joined, step N) to $BENCH_EVENTS so the harness can time each phase.
Stops when $BENCH_EVENTS.stop exists. $BENCH_BACKEND=nccl: NCCL, each rank on GPU LOCAL_RANK (mod the
GPUs there are); default gloo on the CPU.
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
BACKEND = os.environ.get("BENCH_BACKEND", "gloo")
DEV = torch.device("cpu")
if BACKEND == "nccl":
    DEV = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    torch.cuda.set_device(DEV)
dist.init_process_group(BACKEND)
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).to(DEV)
model = DDP(net, device_ids=[DEV.index] if BACKEND == "nccl" else None)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = os.path.join(os.path.dirname(EVENTS), "toy_ckpt.pt")
step = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt, map_location=DEV)
    model.module.load_state_dict(state["model"])
    step = state["step"]
event("joined")
x, y = torch.randn(32, 64, device=DEV), torch.randint(0, 8, (32,), device=DEV)
while not os.path.exists(EVENTS + ".stop"):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    loss.item()  # the step is done (on a GPU too) before it is logged
    event(f"step {step}")
    if step % 10 == 0 and RANK == 0:
        torch.save({"model": model.module.state_dict(), "step": step}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    time.sleep(0.05)
dist.destroy_process_group()
