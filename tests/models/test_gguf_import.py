"""`import_gguf` on a real (tiny, hand-written) Llama GGUF: same logits and token ids as the model it was written
from, a chat template, eos ids from the GGUF, an atomic write; and its errors."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")

from bapsql.errors import ModelError  # noqa: E402
from bapsql.models.gguf_import import import_gguf  # noqa: E402


@pytest.fixture(scope="module")
def imported(tiny_gguf, tmp_path_factory):
    lines: list[str] = []
    result = import_gguf(tiny_gguf.path, tmp_path_factory.mktemp("imp") / "model", progress=lines.append)
    return result, lines


def test_the_imported_folder_computes_what_the_gguf_was_written_from(tiny_gguf, imported):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result, lines = imported
    out = result.out_dir
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(result.files)
    assert (result.architecture, result.model_type, result.vocab_size) == ("llama", "llama", len(tiny_gguf.tokens))
    assert result.num_parameters == sum(p.numel() for p in tiny_gguf.model.parameters())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["tie_word_embeddings"] is True and "quantization_config" not in cfg
    assert cfg["num_hidden_layers"] == 2 and cfg["num_key_value_heads"] == 2
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    text = "SELECT name FROM singer WHERE age > 30<|im_end|>\nHello world"
    ids = tiny_gguf.tokenizer.encode(text, add_special_tokens=False).ids
    assert tok(text, add_special_tokens=False)["input_ids"] == ids  # same BPE, control tokens kept whole
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(model(x).logits, tiny_gguf.model(x).logits)  # q/k un-permuted exactly, F32 exact
        greedy = model.generate(x, max_new_tokens=4, do_sample=False, min_new_tokens=4)
    assert greedy.shape == (1, len(ids) + 4)
    assert [line.split()[0] for line in lines] == ["read", "loaded", "dequantized", "wrote"]


def test_generation_config_eos_ids_come_from_the_gguf_and_the_engine_stops_on_them(tiny_gguf, imported):
    from bapsql.rollout.engines.codec import ModelCodec

    result, _ = imported
    gen = json.loads((result.out_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tiny_gguf.eos_id, tiny_gguf.eot_id]  # eos, then end-of-turn
    assert result.eos_token_ids == (tiny_gguf.eos_id, tiny_gguf.eot_id)
    assert ModelCodec.from_dir(result.out_dir).eos_ids == frozenset({tiny_gguf.eos_id, tiny_gguf.eot_id})


def test_the_chat_template_of_the_gguf_renders_chatml(imported):
    from bapsql.models.chat_template import ChatTemplate

    result, _ = imported
    assert result.chat_template
    text = ChatTemplate.from_dir(result.out_dir).render([{"role": "user", "content": "hi"}],
                                                        add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_the_hf_engine_generates_from_the_imported_folder(imported):
    from bapsql.rollout.engines.base import EngineConfig, SamplingParams
    from bapsql.rollout.engines.codec import ModelCodec
    from bapsql.rollout.engines.factory import make_engine

    out = imported[0].out_dir
    ids = ModelCodec.from_dir(out).encode("How many singers?")
    engine = make_engine(EngineConfig(kind="hf", model=str(out), max_model_len=64, num_threads=1))
    try:
        gen = engine.generate([ids], [SamplingParams(max_tokens=3, temperature=0.0)])[0]
    finally:
        engine.close()
    assert 1 <= len(gen.completion_ids) <= 3 and len(gen.logprobs) == len(gen.completion_ids)


def test_an_existing_folder_is_refused_without_force_and_replaced_with_it(tiny_gguf, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ModelError, match="force"):
        import_gguf(tiny_gguf.path, out)
    assert (out / "keep.txt").read_text() == "mine"
    result = import_gguf(tiny_gguf.path, out, force=True, extra_files={"note.json": "{}"})
    assert not (out / "keep.txt").exists() and (out / "note.json").read_text() == "{}"
    assert "config.json" in result.files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temp or old folder left beside it


def test_a_crash_mid_import_leaves_neither_the_folder_nor_a_partial_one(tiny_gguf, tmp_path, monkeypatch):
    import transformers

    def boom(*args, **kwargs):
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    with pytest.raises(RuntimeError, match="killed"):
        import_gguf(tiny_gguf.path, tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_a_missing_file_and_a_file_that_is_not_gguf_are_named(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        import_gguf(tmp_path / "none.gguf", tmp_path / "out")
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 a zip, not a gguf")
    with pytest.raises(ModelError, match="not a GGUF file"):
        import_gguf(fake, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_unsupported_architecture_is_named(tmp_path):
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "odd.gguf"
    w = GGUFWriter(str(path), "frobnicator9")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="'frobnicator9' is not supported.*llama"):
        import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_missing_gguf_package_says_how_to_install_it(tiny_gguf, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ModelError, match=r"pip install gguf.*scripts/install\.sh"):
        import_gguf(tiny_gguf.path, tmp_path / "out")


def test_a_bad_dtype_is_refused(tiny_gguf, tmp_path):
    with pytest.raises(ModelError, match="dtype"):
        import_gguf(tiny_gguf.path, tmp_path / "out", dtype="int8")
