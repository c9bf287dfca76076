#!/usr/bin/env bash
# CI (#44): the docs. The generated parts (README tables, docs/reference/) must equal what the code
# gives, and the site must build with --strict (no broken link, anchor, nav entry or API reference).
# The snippet tests run with the rest of the suite (tests/test_docs.py).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
.venv/bin/python scripts/gen_docs.py --check
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir .cache/site
echo "docs: generated parts current, site built strictly in $(( $(date +%s) - start )) s (.cache/site)"
