#!/usr/bin/env bash
# The wheels scripts/gpu_check.sh needs beside what the lent GPU image holds (issue 31): that image has torch (CUDA),
# transformers, peft, safetensors, tokenizers, pyarrow, numpy, pandas, pyyaml, click, rich and jinja2, but not the
# database side of bapsql. Run this on a machine WITH network, from the repository root:
#
#     bash scripts/gpu_wheels.sh [DIR]          # default DIR: .whl
#
# It downloads (never installs) the wheels of apsw and sqlglot, at the versions installed here (the ones the tests
# ran) or else the newest pyproject.toml allows, for the image's CPython 3.12 on manylinux x86_64 (PY_VERSION to
# change). The folder then travels with the working tree (an untracked folder travels as it is; if git ignores it,
# carry it) and gpu_check.sh unpacks it into a private folder there. It says how large the folder is: what travels
# to the device is 64 MiB at most, the repository included.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.whl}"
PY="${PYTHON:-python3}"
PY_VERSION="${PY_VERSION:-3.12}"
mkdir -p "$DIR"
SPECS="$("$PY" - <<'PYEOF'
import importlib.metadata as md, re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
for name in ("apsw", "sqlglot"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        print(next(d for d in deps if re.match(rf"{name}\b", d, re.I)).replace(" ", ""))
PYEOF
)"
echo "[gpu_wheels] downloading $(echo $SPECS) for CPython $PY_VERSION manylinux x86_64 into $DIR"
PLATFORMS=()
for n in 17 24 27 28 31 34 35; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
# shellcheck disable=SC2086
"$PY" -m pip download --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    "${PLATFORMS[@]}" --platform manylinux2014_x86_64 --platform any -d "$DIR" $SPECS
ls -l "$DIR"
echo "[gpu_wheels] $(du -sh "$DIR" | cut -f1) in $DIR; with the working tree: $(du -sh --exclude=.git --exclude=.venv \
--exclude=runs . 2>/dev/null | cut -f1) (the device takes 64 MiB at most)"
