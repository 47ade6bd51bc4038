#!/usr/bin/env bash
# The prepared GPU check: on a machine with one NVIDIA GPU and no network, from a fresh checkout, run
#
#     bash scripts/gpu_check.sh            # log and outputs under $OUT when set, else runs/gpu_check
#
# It installs this package (`pip install -e . --no-deps`) and whatever of its dependencies is missing (torch, vllm and
# ray are expected preinstalled with CUDA; nothing is downloaded when everything is there), then runs
# scripts/gpu_check.py: model from config → CUDA vLLM + LoRA → bf16 learner update → adapter sync + logprob check →
# a short GRPO update → a 32-episode sweep on Ray, one summary line per step (time, GPU memory). Budget: < 8 minutes.
# Exit status: 0 all steps ok; 1 a step failed (its traceback is in the log); 2 the machine lacks a GPU or a
# dependency that cannot be installed (the message says which).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
REPO="$(pwd)"
OUT_DIR="${OUT:-$REPO/runs/gpu_check}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
exec > >(tee "$LOG") 2>&1
PY="${PYTHON:-python3}"
fail() { echo "[gpu_check] FAIL setup: $*"; exit 2; }
START=$(date +%s)

echo "[gpu_check] $(date -u +%FT%TZ) repo $REPO, log $LOG"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    || echo "[gpu_check] nvidia-smi not found (continuing: torch decides)"
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null \
    || fail "torch with CUDA is not importable by $PY (preinstall a CUDA build of torch, or set PYTHON=...)"
"$PY" -c "import vllm" 2>/dev/null \
    || fail "vllm is not importable by $PY: preinstall the CUDA vllm wheel that matches this torch (pip install vllm)"

# The package itself, without touching the preinstalled torch / vllm / ray.
"$PY" -m pip install --no-deps --no-build-isolation -e . >"$OUT_DIR/pip-install.log" 2>&1 \
    || "$PY" -m pip install --no-deps -e . >>"$OUT_DIR/pip-install.log" 2>&1 \
    || { echo "[gpu_check] pip install -e . failed (see $OUT_DIR/pip-install.log); using PYTHONPATH=$REPO instead";
         export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"; }

# What is missing among the dependencies this check imports: install it with pyproject.toml's specifier.
MISSING="$("$PY" - <<'PYEOF'
import importlib.util, re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
reqs = [*project["dependencies"], *extras["engines"], *extras["ray"]]
module = {"pyyaml": "yaml", "ray": "ray"}
for req in reqs:
    name = re.match(r"[A-Za-z0-9_.-]+", req).group(0)
    if importlib.util.find_spec(module.get(name.lower(), name.lower().replace("-", "_"))) is None:
        print(req)
PYEOF
)"
if [ -n "$MISSING" ]; then
    echo "[gpu_check] installing missing dependencies: $(echo $MISSING | tr '\n' ' ')"
    # shellcheck disable=SC2086
    echo "$MISSING" | xargs -d '\n' "$PY" -m pip install >>"$OUT_DIR/pip-install.log" 2>&1 \
        || fail "could not install $(echo $MISSING | tr '\n' ' ') (no network?): preinstall them; see $OUT_DIR/pip-install.log"
fi
"$PY" -c "import bapsql, sys; print('[gpu_check] bapsql from', bapsql.__file__)" || fail "bapsql is not importable"

export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled WANDB_MODE=offline HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false BAPSQL_CACHE_DIR="${BAPSQL_CACHE_DIR:-$OUT_DIR/cache}"
timeout --kill-after=20 "$(( 480 - ($(date +%s) - START) ))" "$PY" scripts/gpu_check.py --out "$OUT_DIR"
status=$?
[ "$status" -eq 124 ] && echo "[gpu_check] FAIL: over the 8-minute budget"
echo "[gpu_check] exit $status after $(( $(date +%s) - START )) s; log $LOG"
exit "$status"
