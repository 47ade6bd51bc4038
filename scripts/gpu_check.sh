#!/usr/bin/env bash
# The prepared GPU check (issue 31), made for a lent device as it is: one GPU, no network, an image with torch
# (CUDA), transformers, peft, safetensors, pyarrow, numpy, pandas — and no vllm, no ray. From the repository root:
#
#     bash scripts/gpu_wheels.sh                 # once, on a machine with network: the wheels the image lacks -> .whl/
#     bash scripts/gpu_check.sh                  # on the GPU machine: Qwen3-0.6B's shape with random weights
#     bash scripts/gpu_check.sh --model DIR      # ... or a local model folder
#     bash scripts/gpu_check.sh --cpu            # rehearsal on the CPU at toy size (no GPU needed)
#
# Arguments go to scripts/gpu_check.py (see its docstring for the steps). Nothing is installed into the Python
# environment: the package runs from this working tree (PYTHONPATH), and the wheels in $WHEELS (default .whl/:
# apsw, sqlglot, ...) are unpacked into a private folder first. Log and JSON report under $OUT when set, else
# runs/gpu_check. Budget: 8 minutes in all (the check is stopped at 480 s). Exit status: 0 every step passed; 1 a
# step failed (its traceback is in the log and in gpu_check.json); 2 setup failed (no GPU without --cpu, or a module
# missing: the message says which and how to bring it).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
REPO="$(pwd)"
OUT_DIR="${OUT:-$REPO/runs/gpu_check}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
exec > >(tee "$LOG") 2>&1
PY="${PYTHON:-python3}"
WHEELS="${WHEELS:-$REPO/.whl}"
fail() { echo "[gpu_check] FAIL setup: $*"; exit 2; }
START=$(date +%s)

PYV="$("$PY" -c 'import sys; print(sys.version.split()[0])')"
echo "[gpu_check] $(date -u +%FT%TZ) repo $REPO, python $PYV, log $LOG"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# The wheels the image lacks, into a private folder (never into the environment itself).
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    SITE="$(mktemp -d /tmp/bapsql-site.XXXXXX)"
    trap 'rm -rf "$SITE"' EXIT
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl \
        >"$OUT_DIR/wheels.log" 2>&1 || fail "could not unpack the wheels in $WHEELS (see $OUT_DIR/wheels.log)"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    echo "[gpu_check] wheels from $WHEELS: $(ls "$WHEELS" | grep -c '\.whl$') unpacked into $SITE"
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

# Every module the check imports must be there; vllm is optional, ray is never imported.
MISSING="$("$PY" - <<'PYEOF'
import importlib.util
need = ["torch", "transformers", "peft", "safetensors", "tokenizers", "numpy", "pyarrow", "pandas", "yaml", "click",
        "rich", "jinja2", "apsw", "sqlglot"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
PYEOF
)"
[ -n "$MISSING" ] && fail "missing module(s): $MISSING. Run scripts/gpu_wheels.sh on a machine with network, then \
bring its folder (.whl/) along (WHEELS=DIR to use another)"
"$PY" -c "import bapsql" || fail "bapsql is not importable from $REPO"
if [[ " $* " != *" --cpu "* ]]; then
    "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
        || fail "torch sees no CUDA device (run with --cpu to rehearse on the CPU)"
fi

export WANDB_MODE=offline HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export BAPSQL_CACHE_DIR="${BAPSQL_CACHE_DIR:-$OUT_DIR/cache}"
timeout --kill-after=20 "$(( 480 - ($(date +%s) - START) ))" "$PY" scripts/gpu_check.py --out "$OUT_DIR" "$@"
status=$?
[ "$status" -eq 124 ] && echo "[gpu_check] FAIL: over the 8-minute budget"
echo "[gpu_check] exit $status after $(( $(date +%s) - START )) s; log $LOG, report $OUT_DIR/gpu_check.json"
exit "$status"
