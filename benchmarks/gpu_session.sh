#!/bin/bash
# Every GPU measurement in one call, for a lent GPU machine with torch already installed
# (docs/gpu.md). Run from the repository root; writes its log to $OUT (default /tmp/et-gpu-out).
# Wheels the machine lacks (msgspec, uvicorn, httptools) may be carried in .whl/.
# Each part is bounded in time; the whole run ends within BUDGET seconds (default 500).
set -u
OUT=${OUT:-/tmp/et-gpu-out}
mkdir -p "$OUT"
BUDGET=${BUDGET:-500}
START=$(date +%s)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/et-site .whl/*.whl \
    && export PYTHONPATH=/tmp/et-site
fi
export PYTHONPATH=$PWD:$PWD/integrations/torch${PYTHONPATH:+:$PYTHONPATH}
PY=python3
PARTS=${PARTS:-probe monitor checkpoint oom_plan nccl_recovery interleave}  # interleave_long: 3 s x 5 runs; loops
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
part() {  # part NAME SECONDS command...: at most SECONDS, and never past the budget
  local name=$1 limit=$2; shift 2
  case " $PARTS " in *" $name "*) ;; *) return ;; esac
  local l; l=$(left); [ "$l" -lt "$limit" ] && limit=$l
  echo "=== $name (limit ${limit}s)"
  if [ "$limit" -le 5 ]; then echo "skipped: out of time"; return; fi
  timeout -k 5 "$limit" "$@"
  echo "=== $name: exit $?"
}
{
  part probe 30 bash -c 'nvidia-smi -L; python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"'
  part monitor 40 $PY benchmarks/gpu_monitor_check.py --seconds 4
  part checkpoint 120 $PY benchmarks/checkpoint_gpu.py --gib 4 --reps 3 --dir /tmp
  rm -rf /tmp/et-oom && mkdir -p /tmp/et-oom
  part oom_plan 120 $PY -m elastictrain.launcher.cli --standalone --nproc-per-node 1 --max-restarts 3 \
    --oom-policy accumulate examples/torch_oom_accumulate.py --device cuda --gpu-memory-gib 1 --mib-per-sample 24 \
    --oom-from 25 --steps 40 --ckpt-dir /tmp/et-oom/ckpt --out /tmp/et-oom/result.json
  case " $PARTS " in *" oom_plan "*) echo "oom_plan_result: $(cat /tmp/et-oom/result.json 2>/dev/null || echo none)";; esac
  part nccl_recovery 150 $PY benchmarks/launcher.py --quick --backend nccl --nproc 1 --kill-after 3 \
    --only torchrun,torchrun_noshare,etrun,etrun_kept
  part interleave 300 $PY benchmarks/interleave.py --device cuda --quick
  part interleave_long 240 $PY benchmarks/interleave.py --device cuda --mixes cpu_cpu,io_cpu_gpu --item-every 1
  part loops 200 bash -c 'for spec in "io,cpu,gpu 1" "io,cpu,gpu 50" "cpu,cpu 50"; do set -- $spec; '"$PY"' benchmarks/interleave_loops.py --jobs $1 --item-every $2; done'
  echo "=== total $(( $(date +%s) - START )) s"
} 2>&1 | tee "$OUT/gpu_session.log"
