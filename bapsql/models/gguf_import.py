"""GGUF file → Hugging Face model folder (config.json, model.safetensors, tokenizer, chat template).

Contract of `import_gguf(gguf_file, out_dir, *, dtype="float32", force=False, extra_files=None, progress=None)`:

- checks first, with a `ModelError` that says what to do: the file exists, starts with the GGUF magic, the ``gguf``
  package is installed (transformers reads GGUF through it), and its ``general.architecture`` is one transformers'
  GGUF loader supports (the error names the architecture and the supported ones);
- loads the tokenizer and the causal LM through transformers (``gguf_file=``), which dequantizes every tensor to
  ``dtype``, then saves an unquantized copy (a fresh model of the same class, its state dict loaded strictly: the
  GGUF-quantized model itself refuses `save_pretrained`);
- the folder gets a chat template whenever the GGUF carries ``tokenizer.chat_template`` (``chat_template.jinja``,
  written from the GGUF when the tokenizer did not save one), and a ``generation_config.json`` whose eos ids are the
  GGUF's eos / end-of-turn / end-of-message ids and the tokenizer's eos token (nothing model-specific hard-coded);
- writes everything into a hidden temp folder beside ``out_dir`` (``.NAME.partial-XXXX``), ``extra_files`` last,
  and renames it into place at the end: a crash never leaves a half folder under ``out_dir``'s name. An
  ``out_dir`` that exists and is not empty is refused unless ``force`` (then replaced once the new one is complete);
- ``progress(line)`` (print-like, optional) hears one line per stage with its time.

Requires torch, transformers and ``gguf`` (``pip install gguf``; `scripts/install.sh` installs it); they are imported
inside the functions.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from bapsql.errors import ModelError

GGUF_MAGIC = b"GGUF"
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
_EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


@dataclass(frozen=True)
class ImportResult:
    """What `import_gguf` wrote: the folder, the GGUF's architecture and the saved model's type, its size, the eos
    ids put in ``generation_config.json``, whether it has a chat template, the files (sorted) and the wall time."""

    out_dir: Path
    architecture: str
    model_type: str
    num_parameters: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    chat_template: bool
    files: tuple[str, ...]
    seconds: float


@dataclass(frozen=True)
class GGUFInfo:
    """The few metadata values `import_gguf` needs, read without loading any tensor."""

    architecture: str
    name: str | None
    chat_template: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None


def require_gguf() -> None:
    """Raise `ModelError` with the install command when the ``gguf`` package is missing."""
    if importlib.util.find_spec("gguf") is None:
        raise ModelError("reading a GGUF file needs the `gguf` package: `pip install gguf` "
                         "(or `bash scripts/install.sh`, which installs it with the engines extra)")


def check_gguf_file(path: str | Path) -> Path:
    """The path of an existing GGUF file (magic bytes checked), or `ModelError`."""
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"GGUF file not found: {p}" + (" (it is a folder)" if p.is_dir() else ""))
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelError(f"{p} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}); pass a .gguf "
                         "model file as llama.cpp writes them")
    return p


def read_gguf_info(path: str | Path) -> GGUFInfo:
    """Architecture, name, chat template and special-token ids of a GGUF file (metadata only)."""
    p = check_gguf_file(path)
    require_gguf()
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(p))
    except Exception as exc:  # noqa: BLE001 - a damaged file raises anything from struct/numpy
        raise ModelError(f"{p}: cannot read the GGUF metadata ({type(exc).__name__}: {exc}); "
                         "the file may be truncated or damaged: download it again") from None

    def scalar(key: str):
        field = reader.fields.get(key)
        if field is None or not field.data:
            return None
        part = field.parts[field.data[0]]
        if field.types and int(field.types[0]) == 8:  # GGUFValueType.STRING
            return bytes(part).decode("utf-8", errors="replace")
        return part[0].item() if hasattr(part[0], "item") else part[0]

    arch = scalar("general.architecture")
    if not isinstance(arch, str):
        raise ModelError(f"{p}: the GGUF has no general.architecture; it is not a model file transformers can load")
    eos: list[int] = []
    for key in _EOS_KEYS:
        value = scalar(key)
        if isinstance(value, int) and value not in eos:
            eos.append(value)
    bos, pad = scalar("tokenizer.ggml.bos_token_id"), scalar("tokenizer.ggml.padding_token_id")
    return GGUFInfo(architecture=arch, name=scalar("general.name"), chat_template=scalar("tokenizer.chat_template"),
                    bos_token_id=bos if isinstance(bos, int) else None, eos_token_ids=tuple(eos),
                    pad_token_id=pad if isinstance(pad, int) else None)


def supported_architectures() -> frozenset[str]:
    """The GGUF architectures transformers' loader knows (empty when transformers does not say)."""
    names: set[str] = set()
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

        names.update(GGUF_SUPPORTED_ARCHITECTURES)
    except ImportError:  # pragma: no cover - depends on the transformers version
        pass
    try:
        from transformers.integrations.gguf import GGUF_CONFIG_ARCHS

        names.update(GGUF_CONFIG_ARCHS)
    except ImportError:  # pragma: no cover - depends on the transformers version
        pass
    return frozenset(names - {"general", "tokenizer"})


def _is_supported(arch: str, supported: frozenset[str]) -> bool:
    # transformers renames a few llama.cpp spellings (qwen2moe -> qwen2_moe, gpt-oss -> gpt_oss, t5encoder -> t5).
    candidates = {arch, arch.replace("-", "_"), re.sub(r"moe$", "_moe", arch), arch.removesuffix("encoder")}
    return not supported or bool(candidates & supported)


def _ensure_chat_template(folder: Path, info: GGUFInfo) -> bool:
    """Whether ``folder`` has a chat template, writing the GGUF's as ``chat_template.jinja`` when the tokenizer's
    save left none."""
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    if (folder / "chat_template.jinja").is_file() or config.get("chat_template"):
        return True
    if info.chat_template:
        (folder / "chat_template.jinja").write_text(info.chat_template, encoding="utf-8")
        return True
    return False


def _write_generation_config(folder: Path, info: GGUFInfo, tok) -> list[int]:
    """``generation_config.json`` with the GGUF's eos / eot / eom ids then the tokenizer's eos; returns the eos ids."""
    from transformers import GenerationConfig

    eos = list(info.eos_token_ids)
    if tok.eos_token_id is not None and int(tok.eos_token_id) not in eos:
        eos.append(int(tok.eos_token_id))
    bos = info.bos_token_id if info.bos_token_id is not None else tok.bos_token_id
    pad = info.pad_token_id if info.pad_token_id is not None else tok.pad_token_id
    GenerationConfig(bos_token_id=bos, eos_token_id=eos[0] if len(eos) == 1 else (eos or None),
                     pad_token_id=pad).save_pretrained(folder)
    return eos


def _make_readable(root: Path) -> None:
    """mkdtemp makes the folder 0700 and safetensors writes 0600; a model cache is read by other users and nodes."""
    root.chmod(0o755)
    for f in root.iterdir():
        if f.is_file():
            f.chmod(0o644)


def _replace_dir(tmp: Path, out: Path) -> None:
    """Move the finished ``tmp`` to ``out``, replacing whatever ``out`` held only after ``tmp`` is in place."""
    if not out.exists():
        tmp.rename(out)
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}-{int(time.time() * 1000)}"
    out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def import_gguf(gguf_file: str | Path, out_dir: str | Path, *, dtype: str = "float32", force: bool = False,
                extra_files: Mapping[str, str] | None = None,
                progress: Callable[[str], None] | None = None) -> ImportResult:
    """Convert ``gguf_file`` into a transformers folder at ``out_dir`` (module docstring)."""
    t0 = time.perf_counter()
    say = progress or (lambda _line: None)
    if dtype not in DTYPES:
        raise ModelError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    src = check_gguf_file(gguf_file).resolve()
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise ModelError(f"{out} already exists and is not empty; pass force=True (--force) to replace it, "
                         "or choose another output folder")
    info = read_gguf_info(src)
    say(f"read GGUF metadata: architecture {info.architecture}, {src.stat().st_size / 1e6:.1f} MB "
        f"({time.perf_counter() - t0:.1f} s)")
    t = time.perf_counter()
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise ModelError(f"GGUF import needs torch and transformers ({exc}); run `bash scripts/install.sh`") from None
    supported = supported_architectures()
    if not _is_supported(info.architecture, supported):
        raise ModelError(f"{src}: GGUF architecture {info.architecture!r} is not supported by transformers' GGUF "
                         f"loader (supported: {', '.join(sorted(supported))}); convert the original checkpoint "
                         "instead, or upgrade transformers")

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # transformers' load / save bars; the stage lines say what happens
    try:
        try:
            tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
            say(f"loaded transformers and the tokenizer ({time.perf_counter() - t:.1f} s); dequantizing the "
                f"weights to {dtype} ...")
            t = time.perf_counter()
            quantized = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name,
                                                             dtype=getattr(torch, dtype))
        except (ValueError, KeyError, NotImplementedError) as exc:
            raise ModelError(f"{src}: transformers cannot load this GGUF (architecture {info.architecture!r}): "
                             f"{type(exc).__name__}: {exc}") from None
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # save_pretrained refuses a config carrying the GGUF quantization
        config.dtype = dtype
        model = type(quantized)(config).to(getattr(torch, dtype))
        try:
            model.load_state_dict(quantized.state_dict(), strict=True)
        except RuntimeError as exc:
            raise ModelError(f"{src}: the dequantized weights do not fit {type(model).__name__}: {exc}") from None
        del quantized
        say(f"dequantized {info.architecture} weights ({time.perf_counter() - t:.1f} s); writing ...")
        t = time.perf_counter()
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        has_template = _ensure_chat_template(tmp, info)
        eos = _write_generation_config(tmp, info, tok)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        _make_readable(tmp)
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    say(f"wrote {out} ({time.perf_counter() - t:.1f} s)")
    return ImportResult(out_dir=out, architecture=info.architecture, model_type=str(config.model_type),
                        num_parameters=sum(p.numel() for p in model.parameters()),
                        vocab_size=int(config.vocab_size), eos_token_ids=tuple(eos), chat_template=has_template,
                        files=tuple(sorted(p.name for p in out.iterdir() if p.is_file())),
                        seconds=time.perf_counter() - t0)
