"""The engines' token codec (bapsql/rollout/engines/codec.py): which ids end a completion, for each template family."""

from __future__ import annotations

import json
import shutil

import pytest

from bapsql.rollout.engines.codec import ModelCodec, template_end_of_turn
from bapsql.tokens import DEFAULT_TOKENIZER_DIR
from tests.models.chat_families import END_OF_TURN, FAMILIES, make_family_dir


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_ends_a_completion_at_its_templates_end_of_turn(tmp_path, family):
    folder = make_family_dir(tmp_path, family)
    codec = ModelCodec.from_dir(folder)
    end = codec.encode(END_OF_TURN[family])
    assert len(end) == 1 and end[0] in codec.eos_ids and template_end_of_turn(folder) == tuple(end)


def test_the_end_of_turn_ends_a_completion_when_the_configs_name_another_eos(tmp_path):
    """Meta-Llama-3-Instruct as first released: eos ``<|end_of_text|>`` in both configs, while the template closes
    every turn with ``<|eot_id|>``. The engine must stop there, not run on to max_tokens."""
    folder = make_family_dir(tmp_path, "llama3")
    codec = ModelCodec.from_dir(folder)
    end_of_text, eot = codec.encode("<|end_of_text|>")[0], codec.encode("<|eot_id|>")[0]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": end_of_text}))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|end_of_text|>"}))
    assert ModelCodec.from_dir(folder).eos_ids == frozenset({end_of_text, eot})


def test_without_a_usable_template_only_the_configs_eos_counts(tmp_path):
    """No chat template, or one that cannot be framed (it fails where prompts are rendered): the configs' eos."""
    bare, broken = tmp_path / "bare", tmp_path / "broken"
    bare.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEFAULT_TOKENIZER_DIR / name, bare / name)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    (bare / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|endoftext|>"}))
    shutil.copytree(bare, broken)
    (broken / "chat_template.jinja").write_text("{{ raise_exception('this template renders nothing') }}")
    codec = ModelCodec.from_dir(bare)
    assert template_end_of_turn(bare) == () and codec.eos_ids == frozenset(codec.encode("<|endoftext|>"))
    assert template_end_of_turn(broken) == () and ModelCodec.from_dir(broken).eos_ids == codec.eos_ids
