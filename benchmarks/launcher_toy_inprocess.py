"""benchmarks/launcher_toy.py written for in-process recovery: the same model, data and events,
with the training loop wrapped by ``elastictrain_torch.elastic.run`` and checkpoints through
``TorchCheckpointer`` (every 10 steps, as the toy's ``torch.save``). Events carry the generation
from the environment, which a survivor's recovery updates."""

import os
import time

T_START = time.time()
EVENTS = os.environ["BENCH_EVENTS"]


def event(what: str, t: float = None) -> None:
    with open(EVENTS, "a") as f:
        f.write(f"{t or time.time():.6f} {os.environ['RANK']} {int(os.environ.get('ET_GENERATION', '1')) - 1} "
                f"{os.getpid()} {what}\n")


event("start", T_START)
import torch  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import elastictrain as et  # noqa: E402
from elastictrain_torch import TorchCheckpointer, elastic  # noqa: E402

event("imported")
job = et.init()
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = TorchCheckpointer(os.path.join(os.path.dirname(EVENTS), "toy_ckpt"), model=model, optimizer=opt, job=job,
                         extra_state={"step": 0})
x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))


@elastic.run(ckpt)
def train(group):
    ddp = DDP(model, process_group=group)
    step = ckpt.state["step"]
    event("joined")
    while not os.path.exists(EVENTS + ".stop"):
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        event(f"step {step}")
        if step % 10 == 0:
            ckpt.state["step"] = step
            ckpt.save(step)
        time.sleep(0.05)


train()
