"""The launcher toy as an elastic Horovod script (``hvd.elastic.run``, ``hvd.elastic.TorchState``,
commit every 10 steps), unmodified for either launcher: horovodrun's elastic mode or etrun. Events
are ``time rank resets pid what``; ``resets`` counts this process's recoveries (a survivor's goes up,
a new worker starts at 0), so a step with more resets than before the kill is a recovered one."""

import os
import time

T_START = time.time()
EVENTS = os.environ["BENCH_EVENTS"]
RESETS = [0]


def event(what: str, rank: int, t: float = None) -> None:
    with open(EVENTS, "a") as f:
        f.write(f"{t or time.time():.6f} {rank} {RESETS[0]} {os.getpid()} {what}\n")


import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

hvd.init()
event("start", hvd.rank(), T_START)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters())
x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))


@hvd.elastic.run
def train(state):
    while not os.path.exists(EVENTS + ".stop"):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        state.step += 1
        event(f"step {state.step}", hvd.rank())
        if state.step % 10 == 0:
            state.commit()
        time.sleep(0.02)


def on_reset():
    RESETS[0] += 1


state = hvd.elastic.TorchState(model, opt, step=0)
state.register_reset_callbacks([on_reset])
train(state)
