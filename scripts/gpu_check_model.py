"""The model scripts/gpu_check.py measures: a random-weight model built from the config of a real architecture, or a
local model folder.

`ARCHS` holds the architecture configs inline (no download): ``qwen3-0.6b`` is Qwen3-0.6B's published shape (hidden
1024, 28 layers, 16 query heads and 8 KV heads of 128, MLP 3072, vocabulary 151,936, tied embeddings, RoPE theta
1e6, 40,960 positions); ``qwen3-tiny`` the same layout at toy size for the CPU rehearsal.

The tokenizer: no 151k-entry tokenizer is available offline, so `extend_tokenizer` takes the packaged byte-level BPE
(`bapsql.tokens.DEFAULT_TOKENIZER_DIR`: 8,185 learned entries, 7 special tokens, a ChatML template) and adds
decode-only entries up to the architecture's vocabulary size: ids 8,192 .. V-1 are vocabulary strings of three
byte-level characters that no merge produces. Encoding is exactly the packaged tokenizer's (prompts, chat template,
end-of-turn token); every id the model can sample decodes (to three bytes), so the engines, the agent loop and the
logs handle all 151,936 ids; the embedding, the LM head and the logprob computation have the real architecture's
size. What this cannot show: a real checkpoint's token statistics (use ``--model DIR`` for that).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QWEN3 = {"model_type": "qwen3", "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
         "tie_word_embeddings": True, "attention_bias": False, "use_sliding_window": False,
         "initializer_range": 0.02}
ARCHS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {**QWEN3, "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151_936,
                   "max_position_embeddings": 40_960},
    "qwen3-tiny": {**QWEN3, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 384, "vocab_size": 16_384,
                   "max_position_embeddings": 16_384},
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class ModelInfo:
    """The model a check runs on: its folder, where it came from, parameters, vocabulary, layers and dtype."""

    path: Path
    source: str  # "arch:<name>" or "folder"
    parameters: int
    vocab_size: int
    tokenizer_entries: int  # ids the tokenizer knows (encodable or decode-only)
    layers: int
    saved_dtype: str
    seconds: float

    def line(self) -> str:
        return (f"{self.source}: {self.parameters / 1e6:.1f}M parameters, {self.layers} layers, vocab "
                f"{self.vocab_size:,} (tokenizer {self.tokenizer_entries:,} ids), saved {self.saved_dtype}, "
                f"{self.path}")


def extend_tokenizer(src: Path, out: Path, vocab_size: int) -> int:
    """Copy the tokenizer files of ``src`` into ``out`` with decode-only BPE entries added until the tokenizer
    covers ids ``0 .. vocab_size - 1`` (module docstring); returns how many ids it covers."""
    from tokenizers import Tokenizer
    from tokenizers.pre_tokenizers import ByteLevel

    data = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = data["model"]["vocab"]
    for t in data.get("added_tokens", []):  # in the model's vocabulary too, so the special tokens keep their ids
        vocab.setdefault(t["content"], t["id"])
    used = set(vocab.values())
    alphabet = sorted(ByteLevel.alphabet())
    n = len(alphabet)
    k = 0
    for token_id in range(vocab_size):
        if token_id in used:
            continue
        while True:
            text = alphabet[k // (n * n) % n] + alphabet[k // n % n] + alphabet[k % n]
            k += 1
            if text not in vocab:
                break
        vocab[text] = token_id
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    for name in TOKENIZER_FILES[1:]:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    return Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


def build_arch_model(arch: str, out: Path, *, device: str, dtype: str, seed: int = 0) -> ModelInfo:
    """A random-weight model of ``ARCHS[arch]`` (initialised on ``device``, saved in ``dtype``) with the extended
    packaged tokenizer, written to ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from bapsql.tokens import DEFAULT_TOKENIZER_DIR

    if arch not in ARCHS:
        raise SystemExit(f"--arch: unknown {arch!r}; known: {', '.join(ARCHS)}")
    t0 = time.perf_counter()
    spec = dict(ARCHS[arch])
    specials = {t["content"]: t["id"] for t in json.loads(
        (DEFAULT_TOKENIZER_DIR / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]}
    eos, pad = specials["<|im_end|>"], specials["<|endoftext|>"]
    config = AutoConfig.for_model(spec.pop("model_type"), **spec, bos_token_id=pad, eos_token_id=eos,
                                  pad_token_id=pad)
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=pad, eos_token_id=[eos, pad], pad_token_id=pad).save_pretrained(out)
    entries = extend_tokenizer(DEFAULT_TOKENIZER_DIR, out, config.vocab_size)
    info = ModelInfo(out, f"arch:{arch}", sum(p.numel() for p in model.parameters()), config.vocab_size, entries,
                     config.num_hidden_layers, dtype, time.perf_counter() - t0)
    del model
    return info


def folder_model(path: Path) -> ModelInfo:
    """A local model folder as it is (its config's sizes; parameters counted from the safetensors headers)."""
    from bapsql.models.dtype import checkpoint_dtype

    t0 = time.perf_counter()
    if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
        raise SystemExit(f"--model: {path} needs config.json and tokenizer.json (a transformers model folder)")
    config = json.loads((path / "config.json").read_text())
    text = config.get("text_config") or config
    params = 0
    for f in sorted(path.glob("*.safetensors")):
        with open(f, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        for name, meta in header.items():
            if name != "__metadata__":
                size = 1
                for d in meta["shape"]:
                    size *= d
                params += size
    from tokenizers import Tokenizer

    entries = Tokenizer.from_file(str(path / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    return ModelInfo(path, "folder", params, int(text.get("vocab_size", 0)), entries,
                     int(text.get("num_hidden_layers", 0)), checkpoint_dtype(path) or "unnamed",
                     time.perf_counter() - t0)
