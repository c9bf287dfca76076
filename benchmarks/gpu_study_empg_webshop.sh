#!/usr/bin/env bash
# EMPG vs GRPO on WebShop at 15 turns (issue #41's GPU row, configs/studies/empg_vs_grpo.yaml): one command on a
# machine with a CUDA GPU, from anywhere, with agentrl installed (`bash scripts/setup.sh`):
#   bash benchmarks/gpu_study_empg_webshop.sh [study key=value ...]     e.g. seeds=[0]
# The study's runs (models, checkpoints) go to runs/studies/empg_vs_grpo_gpu; its report, results, plots and
# each run's summary, metrics, resolved config and command to benchmarks/results/study_empg_webshop_gpu/, dated
# in README.txt. Re-running continues the study (finished runs are kept). Without a GPU it stops at once.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
"$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu_study_empg_webshop.sh: no CUDA device here; this study (WebShop, 15 turns, 3 seeds) needs a GPU')"
out=runs/studies/empg_vs_grpo_gpu
dest=benchmarks/results/study_empg_webshop_gpu
"$py" -m agentrl.cli study configs/studies/empg_vs_grpo.yaml "out_dir=$out" "$@"
mkdir -p "$dest"
for f in report.md results.json study.yaml success.png reward.png clipfrac.png context.png; do
  [ -f "$out/$f" ] && cp "$out/$f" "$dest/"
done
for run in "$out"/seed-*/*/; do
  rel=${run#"$out"/}; mkdir -p "$dest/$rel"
  for f in summary.json metrics.jsonl resolved_config.yaml command.txt; do [ -f "$run/$f" ] && cp "$run/$f" "$dest/$rel"; done
done
{ date -u +"%Y-%m-%d %H:%M UTC"; "$py" -c "import torch; print(torch.cuda.get_device_name(0))"; git rev-parse HEAD 2>/dev/null || true; } > "$dest/README.txt"
echo "records in $dest"
