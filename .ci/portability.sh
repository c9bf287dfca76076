#!/usr/bin/env bash
# CI, part of .ci/run (issue #23): answers must not depend on the CPU, and a bare clone must be complete.
#
# 1. The tests whose numbers can depend on SIMD kernels (retrieval and ranking, the web shop's search,
#    learner equivalence, math scoring) run again with AVX-512 switched off everywhere it is chosen at
#    run time, so a CI machine with AVX-512 takes the code paths of the common AVX2-only CPUs:
#    NumPy's dispatch (NPY_DISABLE_CPU_FEATURES: the AVX-512 targets this NumPy dispatches to, from
#    numpy's own list), torch's ATen kernels (ATEN_CPU_CAPABILITY), oneDNN (ONEDNN_MAX_CPU_ISA),
#    MKL and OpenBLAS. The resolved settings are printed and checked before the tests run.
# 2. A `git clone` of the committed tree, installed non-editable into a temp folder with nothing
#    beside it, runs `agentrl eval --agent oracle --limit 4` on math, search-qa-real and webshop from
#    another directory (the benchmark data must come from the package, not from a folder nearby).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="$PWD/.venv/bin/python"
start=$(date +%s)
rc=0

npy_off=$("$PY" -c "import numpy._core._multiarray_umath as m; print(' '.join(f for f in m.__cpu_dispatch__ if f.startswith('AVX512') or f == 'X86_V4'))")
export NPY_DISABLE_CPU_FEATURES="$npy_off" ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
       MKL_ENABLE_INSTRUCTIONS=AVX2 OPENBLAS_CORETYPE=Haswell
echo "== #23 part 1: AVX-512 off: NPY_DISABLE_CPU_FEATURES='$NPY_DISABLE_CPU_FEATURES' ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 OPENBLAS_CORETYPE=Haswell"
"$PY" - <<'EOF' || rc=1
import numpy._core._multiarray_umath as m
import torch

on = [f for f in m.__cpu_dispatch__ if (f.startswith("AVX512") or f == "X86_V4") and m.__cpu_features__.get(f)]
capability = torch.backends.cpu.get_cpu_capability()
print(f"numpy AVX-512 targets still on: {on or 'none'}; torch CPU capability: {capability}")
assert not on and capability in ("AVX2", "DEFAULT"), "AVX-512 is still on"
EOF
.venv/bin/python -m pytest -q -p no:cacheprovider -m "not docker and not gpu" \
  tests/search/test_retrievers.py tests/search/test_ranking.py tests/search/test_qa.py \
  tests/search/test_search_env.py tests/web/test_web_env.py tests/web/test_catalog.py tests/web/test_oracle.py \
  tests/train/test_learner.py tests/code/test_code_scoring.py || rc=1
unset NPY_DISABLE_CPU_FEATURES ATEN_CPU_CAPABILITY ONEDNN_MAX_CPU_ISA MKL_ENABLE_INSTRUCTIONS OPENBLAS_CORETYPE
echo "#23 part 1 took $(( $(date +%s) - start )) s"

echo "== #23 part 2: a bare clone, installed non-editable, evaluated from another directory"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
git clone -q --no-local "$PWD" "$tmp/agentrl" \
  && "$PY" -m pip install -q --no-deps --no-build-isolation --target "$tmp/site" "$tmp/agentrl" || rc=1
mkdir -p "$tmp/elsewhere"
for suite in math search-qa-real webshop; do
  (cd "$tmp/elsewhere" && env -u AGENTRL_DATA PYTHONPATH="$tmp/site" "$PY" -c \
    "import sys, agentrl; assert agentrl.__file__.startswith('$tmp/site'), agentrl.__file__; from agentrl.cli import main; main()" \
    eval --suite "$suite" --agent oracle --limit 4 --out "$tmp/out-$suite" | tail -n 3) || rc=1
  grep -qF "success: **100.0%**" "$tmp/out-$suite/report.md" 2>/dev/null \
    || { echo "#23: $suite from the bare clone did not reach 100% oracle success"; rc=1; }
done
echo "#23 portability checks took $(( $(date +%s) - start )) s, exit $rc"
exit $rc
