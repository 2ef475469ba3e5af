"""A DDP job that survives running out of GPU memory by accumulating gradients.

    etrun --nproc-per-node 2 --max-restarts 3 --oom-policy accumulate \
        examples/torch_oom_accumulate.py --ckpt-dir ckpt --out result.json

Each step trains on ``--batch`` samples per rank, split into ``et.accumulation()`` micro-batches
(``ET_ACCUMULATE``; 1 at first): forward/backward per micro-batch under ``no_sync()`` but the last,
each loss scaled by micro/batch, so a step's gradient is that of its whole batch, however it is split.
When a micro-batch does not fit, torch raises ``torch.cuda.OutOfMemoryError``; under
``--oom-policy accumulate`` etrun restarts the job (from its last checkpoint, data cursor and all)
with the accumulation doubled on every node, so each micro-batch is half as large.

On a machine without a GPU, ``--gpu-memory-samples N`` stands in for the device's memory: from
``--oom-from`` on, a micro-batch of more than N samples raises the same ``OutOfMemoryError`` a
CUDA allocation would. On a GPU, ``--device cuda --gpu-memory-gib G --mib-per-sample M`` runs
out for real: each rank may use G GiB of its GPU (``set_per_process_memory_fraction``) and, from
``--oom-from`` on, a micro-batch holds M MiB of activations per sample, so torch's allocator
raises the ``OutOfMemoryError`` itself (NCCL, one rank per GPU). Every save and restore prints a
digest of the parameters, so a restore onto the GPU can be checked bit for bit. Rank 0 writes ``--out``: steps, the largest global batch of a step, the
exactly-once ledger's min/max, the accumulation of each generation, and the final parameters' sum.
(Shards are handed out on demand, so at the end of the epoch one rank may still hold a shard when
the other has none: a step or two then trains fewer samples, and the count of steps can pass
samples / global batch by as many.)
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import elastictrain as et
from elastictrain_torch import TorchCheckpointer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64, help="samples per rank per step (the global batch / world)")
    ap.add_argument("--steps", type=int, default=60, help="steps of the epoch at the starting world size")
    ap.add_argument("--gpu-memory-samples", type=int, default=0,
                    help="(no GPU) the largest micro-batch that fits; 0: no limit")
    ap.add_argument("--oom-from", type=int, default=0, help="(no GPU) the step from which the limit applies")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cuda: NCCL, one rank per GPU")
    ap.add_argument("--gpu-memory-gib", type=float, default=0.0, help="(cuda) GiB of its GPU each rank may use")
    ap.add_argument("--mib-per-sample", type=float, default=0.0,
                    help="(cuda) activation MiB a sample of a micro-batch holds, from --oom-from on")
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--ckpt-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    job = et.init()
    k = et.accumulation()
    if args.batch % k:
        raise SystemExit(f"--batch {args.batch} does not split into {k} micro-batches")
    micro = args.batch // k
    dev = torch.device("cpu")
    if args.device == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        if args.gpu_memory_gib:
            total = torch.cuda.get_device_properties(dev).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, args.gpu_memory_gib * 2**30 / total), dev)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    samples = args.steps * args.batch * world
    x = torch.randn(samples, 16, generator=g)
    y = (x[:, :3].sum(1) > 0).long()
    net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 2)).double().to(dev)
    model = DDP(net, device_ids=[dev.index] if dev.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    shards = job.shards(et.DatasetSpec("train", samples, args.batch * 2, epochs=1, seed=4))
    ledger = torch.zeros(samples, dtype=torch.int32)
    ckpt = TorchCheckpointer(args.ckpt_dir, model=net, optimizer=opt, shards=shards, job=job,
                             extra_state={"progress": {"step": 0, "ledger": ledger, "runs": [], "largest": 0}})
    ckpt.install_preemption_handler()
    if ckpt.restore() is not None:
        print(f"[oom-job] restored step {ckpt.state['progress']['step']} params {_digest(net)}", flush=True)
    progress = ckpt.state["progress"]
    step, ledger, largest = progress["step"], progress["ledger"], progress.get("largest", 0)
    runs = list(progress["runs"]) + [f"accumulate={k}@{step}"]
    print(f"[oom-job] generation {job.generation} ({job.restart_reason}): {k} micro-batch(es) of {micro}, "
          f"from step {step}", flush=True)
    it = iter(shards)
    pad = torch.full((args.batch,), -1, dtype=torch.long)
    while True:
        idx = torch.tensor([i for _, i in zip(range(args.batch), it)], dtype=torch.long)
        opt.zero_grad()
        for j in range(k):
            part = idx[j * micro:(j + 1) * micro]
            if args.gpu_memory_samples and step >= args.oom_from and len(part) > args.gpu_memory_samples:
                raise torch.cuda.OutOfMemoryError(
                    f"CUDA out of memory (simulated: a micro-batch of {len(part)} samples needs more than the "
                    f"{args.gpu_memory_samples} that fit)")
            held = []  # the activations a micro-batch holds (a real OOM on a GPU), freed after its backward
            if args.mib_per_sample and step >= args.oom_from:
                held.append(torch.empty(int(len(part) * args.mib_per_sample * 2**20), dtype=torch.uint8, device=dev))
            xb, yb = (x[part].double(), y[part]) if len(part) else (x[:1].double(), y[:1])
            xb, yb = xb.to(dev), yb.to(dev)
            scale = len(part) / args.batch  # each micro-batch's share of the step's loss
            if j < k - 1:
                with model.no_sync():
                    (nn.functional.cross_entropy(model(xb), yb) * scale).backward()
            else:
                (nn.functional.cross_entropy(model(xb), yb) * scale).backward()
            held.clear()
        opt.step()
        got = pad.clone()
        got[:len(idx)] = idx
        got = got.to(dev)
        every = [torch.empty_like(got) for _ in range(world)]
        dist.all_gather(every, got)
        got = torch.cat(every).cpu()
        got = got[got >= 0]
        if len(got) == 0:
            break
        ledger.index_add_(0, got, torch.ones_like(got, dtype=torch.int32))
        step += 1
        largest = max(largest, len(got))
        ckpt.state["progress"] = {"step": step, "ledger": ledger, "runs": runs, "largest": largest}
        if ckpt.preempted(step):
            shards.close(release=False)
            return et.PREEMPTED_EXIT_CODE
        if step % args.ckpt_every == 0:
            ckpt.save(step)
            if args.device == "cuda":
                print(f"[oom-job] saved step {step} params {_digest(net)}", flush=True)
    ckpt.save(step)
    ckpt.wait()
    if rank == 0:
        out = {"steps": step, "min": int(ledger.min()), "max": int(ledger.max()), "runs": runs, "global_batch": largest,
               "param_sum": float(sum(p.detach().sum() for p in net.parameters())), "time": time.time()}
        with open(args.out + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(args.out + ".tmp", args.out)
        print(f"[oom-job] done: {step} steps, ledger min {out['min']} max {out['max']}", flush=True)
    shards.close()
    dist.destroy_process_group()
    return 0


def _digest(net: nn.Module) -> str:
    import hashlib

    h = hashlib.sha256()
    for t in net.state_dict().values():
        h.update(t.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    sys.exit(main())
