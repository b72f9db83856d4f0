#!/usr/bin/env bash
# The checks that need a GPU, as one script (see benchmarks/device/README.md):
#   1. `arachne run` on CUDA/NCCL against the same plan on CPU processes (losses, a dense and an MoE model);
#   2. bf16 profiles of real per-layer times (`arachne profile`) of catalog models, one GPU, tp 1;
#   3. a 4-block Llama-3.1-8B bf16 plan trained with `--measure` (time and peak memory vs the estimate).
# Usage, from the repository root:  OUT=folder bash benchmarks/device/device_check.sh
#   DRY=1: a quick rehearsal on CPU (tiny profile shapes, CPU processes in place of CUDA, no step 3).
# Wheels in .whl/ (pydantic and friends, where the GPU machine lacks them) are installed to /tmp/site first.
set -u
OUT=${OUT:?set OUT to an output folder}
D=benchmarks/device
C=$D/cluster-h200.yaml
LOG=$OUT/runs.txt
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ] && [ -z "${DRY:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
ar() { python3 -m arachne "$@"; }
say() { echo "== $(date -u +%T) $*" >>"$LOG"; echo "== $(date -u +%T) $*"; }

say "environment"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
  python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda',
torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')"; } >>"$LOG" 2>&1

SIM=""
[ -n "${DRY:-}" ] && SIM=--simulate-devices
for p in tiny-fp32 tiny-moe-fp32; do
  say "run $p cuda"
  ar run -c $C -p $D/$p.json --steps 6 --json --seed 0 $SIM >>"$LOG" 2>&1
  say "run $p cpu"
  ar run -c $C -p $D/$p.json --steps 6 --json --seed 0 --simulate-devices >>"$LOG" 2>&1
done

prof() {  # prof NAME MODEL MBS
  say "profile $2 (micro-batches $3)"
  local extra=()
  [ -n "${DRY:-}" ] && extra=(--num-layers 2 --hidden-size 256 --ffn-hidden-size 512 --vocab-size 1024
                              --sequence-length 128)
  mkdir -p "$OUT/prof"
  ar profile -m "$2" --precision bf16 --gpu H200 --tp 1 --micro-batch-sizes "$3" --blocks 2 --repeats 5 \
    -o "$OUT/prof/$1" "${extra[@]}" >>"$LOG" 2>&1
}
prof llama8b Llama-3.1-8B 1,2,4
if [ -z "${DRY:-}" ]; then
  say "run llama8b-4l-bf16 measure"
  ar run -c $C -p $D/llama8b-4l-bf16.json --steps 6 --json --seed 0 --measure >>"$LOG" 2>&1
fi
prof mixtral Mixtral-8x7B 1,2,4
prof qwen3moe Qwen3-30B-A3B 1,2,4
prof llama70b Llama-3.1-70B 1,2
say "done"
if [ -z "${DRY:-}" ]; then
  say "bf16 GEMM throughput (m x n x k, TFLOP/s, 50 back-to-back between two events, median of 10)"
  python3 - >>"$LOG" 2>&1 <<'PY'
import torch
dev = torch.device("cuda")
# 50 GEMMs between one pair of events: the host queues them faster than the GPU runs them, so the interval is
# GPU time (one GEMM per pair would put the host's dispatch, about 18 us, inside it)
for m, n, k in [(2048, 4096, 4096), (4096, 4096, 4096), (8192, 4096, 4096), (8192, 14336, 4096),
                (8192, 4096, 14336), (2048, 768, 2048), (512, 768, 2048), (8192, 8192, 8192), (8192, 28672, 8192)]:
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    ts = []
    for i in range(12):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(50):
            a @ b
        e.record(); torch.cuda.synchronize()
        if i >= 2:
            ts.append(s.elapsed_time(e) / 1e3 / 50)
    t = sorted(ts)[len(ts) // 2]
    print(f"gemm {m} {n} {k} {2 * m * n * k / t / 1e12:.1f}")
PY
  say "gemm done"
fi
