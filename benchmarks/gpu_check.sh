#!/usr/bin/env bash
# What a CUDA host checks, in one command, from the repo root with agentrl importable:
#   bash benchmarks/gpu_check.sh OUT_DIR
# 1. the tests marked gpu that need no vLLM (the compiled Triton kernel, every advantage and loss on CUDA
#    against CPU, the precision probe timing the GPU) and the rest of the kernel tests, compiled;
# 2. the DeepSpeed learner with ZeRO-3 (as the recipes use) on one GPU through torchrun: a short warm-up, one RL
#    step of 4 trees and a 16-task eval before and after, the hf generator sampling from the partitioned model;
# 3. the quickstart as committed (`agentrl train configs/quickstart.yaml`) on the GPU;
# 4. the ZeRO-3 run's settings with ZeRO-2.
# Each part has its own time limit (GPU_CHECK_LIMITS="tests zero3 quickstart zero2", seconds), cut to what is left
# of GPU_CHECK_DEADLINE (seconds for the whole script, default none); a part with under a minute left is skipped.
# Each writes its log to OUT_DIR; a table of what passed and how long it took ends the output and OUT_DIR/table.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash benchmarks/gpu_check.sh OUT_DIR}
mkdir -p "$out"
py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
"$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_check.sh: no CUDA device here')" || exit 1
read -r lim_tests lim_z3 lim_quick lim_z2 <<< "${GPU_CHECK_LIMITS:-240 180 600 120}"
deadline=${GPU_CHECK_DEADLINE:-0}
rows=()
part() {  # part NAME LIMIT CMD...: run CMD under a time limit, log to OUT/NAME.log, add a row to the table
  local name=$1 limit=$2; shift 2
  if [ "$deadline" -gt 0 ]; then
    local left=$((deadline - SECONDS - 20))
    [ "$left" -lt 60 ] && { rows+=("| $name | skipped: ${left} s left of GPU_CHECK_DEADLINE | - |"); return; }
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  local start=$SECONDS
  echo "=== $name (limit ${limit}s): $*"
  timeout --signal=TERM --kill-after=15 "$limit" "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]} took=$((SECONDS - start))
  local verdict=passed
  [ "$rc" = 124 ] && verdict="stopped at the ${limit} s limit" || { [ "$rc" != 0 ] && verdict="failed (exit $rc)"; }
  rows+=("| $name | $verdict | ${took} s |")
}
{ date -u +"%Y-%m-%d %H:%M UTC"; "$py" -c "import torch; print(torch.cuda.get_device_name(0), 'torch', torch.__version__)"
  echo "${GPU_CHECK_REV:-$(git rev-parse HEAD 2>/dev/null)}"; } > "$out/README.txt"
part tests "$lim_tests" "$py" -m pytest -q -p no:cacheprovider tests/kernels tests/algos/test_algos_registry.py \
  tests/train/test_precision.py
small=(train.steps=1 train.sft_warmup_steps=10 train.eval_episodes=16 rollout.tasks_per_step=4)
part zero3 "$lim_z3" "$py" -m torch.distributed.run --nproc_per_node 1 -m agentrl.cli train configs/quickstart.yaml \
  train.engine=deepspeed train.zero_stage=3 "${small[@]}" "train.out_dir=$out/zero3"
part quickstart "$lim_quick" "$py" -m agentrl.cli train configs/quickstart.yaml "train.out_dir=$out/quickstart"
part zero2 "$lim_z2" "$py" -m torch.distributed.run --nproc_per_node 1 -m agentrl.cli train configs/quickstart.yaml \
  train.engine=deepspeed train.zero_stage=2 "${small[@]}" "train.out_dir=$out/zero2"
{ echo "| part | result | wall |"; echo "|---|---|---|"; printf '%s\n' "${rows[@]}"; } | tee "$out/table.txt"
