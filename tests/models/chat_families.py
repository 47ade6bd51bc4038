"""Four chat-template families as small model folders in tmp_path (no model download): the packaged byte-level BPE
tokenizer with each family's special tokens added, its chat template, tokenizer_config.json and generation_config.json.

- ``smollm2``: SmolLM2-Instruct's exact ChatML template (HuggingFaceTB/SmolLM2-135M-Instruct, Apache-2.0): no tool
  support, a ``tool`` message renders as ``<|im_start|>tool\\n...<|im_end|>\\n``, a default system message when none.
- ``qwen3``: Qwen3's template as released (Qwen/Qwen3-0.6B .. 32B, Apache-2.0; ``templates/qwen3.jinja``): tool
  results as user ``<tool_response>`` turns, an empty think block in the generation prompt under
  ``enable_thinking: false`` and on the last assistant turn only (past turns lose it in a fresh rendering);
  ``<think>`` / ``</think>`` added (not special), as in Qwen3's tokenizer.
- ``qwen3_5``: Qwen3.5's template (``templates/qwen3_5.jinja``): the same headers, end of turn and tool-response
  turns, contents trimmed, every assistant turn after the last user query keeps its think block, and it refuses to
  render a conversation with no user query (``raise_exception('No user query found in messages.')``) or a system
  message that is not first.
- ``llama3``: Meta-Llama-3-Instruct's template: ``<|begin_of_text|>`` once, ``<|start_header_id|>role<|end_header_id|>
  \\n\\n`` + trimmed content + ``<|eot_id|>``; eos ids ``<|end_of_text|>`` and ``<|eot_id|>``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bapsql.tokens import DEFAULT_TOKENIZER_DIR

TEMPLATES = Path(__file__).parent / "templates"
QWEN3_TEMPLATE = (TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8")
QWEN3_5_TEMPLATE = (TEMPLATES / "qwen3_5.jinja").read_text(encoding="utf-8")

SMOLLM2_TEMPLATE = (  # chat_template.jinja of HuggingFaceTB/SmolLM2-135M-Instruct, verbatim (368 bytes)
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n"
    "' + message['content'] + '<|im_end|>' + '\n"
    "'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n"
    "' }}{% endif %}")

LLAMA3_TEMPLATE = (  # Meta-Llama-3-8B-Instruct's chat_template
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

FAMILIES: dict[str, dict[str, Any]] = {
    "smollm2": {"template": SMOLLM2_TEMPLATE, "special": [], "tokens": [],
                "config": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
                           "unk_token": "<|endoftext|>"},
                "eos": ["<|im_end|>"], "kwargs": {}},
    "qwen3": {"template": QWEN3_TEMPLATE, "special": [], "tokens": ["<think>", "</think>"],
              "config": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
              "eos": ["<|im_end|>", "<|endoftext|>"], "kwargs": {"enable_thinking": False}},
    "qwen3_5": {"template": QWEN3_5_TEMPLATE, "special": [], "tokens": ["<think>", "</think>"],
                "config": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
                "eos": ["<|im_end|>", "<|endoftext|>"], "kwargs": {"enable_thinking": False},
                "needs_user_query": True},
    "llama3": {"template": LLAMA3_TEMPLATE,
               "special": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                           "<|eot_id|>"], "tokens": [],
               "config": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "pad_token": "<|end_of_text|>"},
               "eos": ["<|end_of_text|>", "<|eot_id|>"], "kwargs": {}},
}
# which families render a conversation with no user message (a system prompt alone)
RENDERS_SYSTEM_ALONE = {f: not spec.get("needs_user_query", False) for f, spec in FAMILIES.items()}
END_OF_TURN = {"smollm2": "<|im_end|>", "qwen3": "<|im_end|>", "qwen3_5": "<|im_end|>", "llama3": "<|eot_id|>"}


def make_family_dir(root: Path, family: str) -> Path:
    """A model folder of ``family`` under ``root`` (tokenizer + chat template + configs); returns the folder."""
    from tokenizers import AddedToken, Tokenizer

    spec = FAMILIES[family]
    folder = Path(root) / family
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(DEFAULT_TOKENIZER_DIR / "tokenizer.json"))
    if spec["special"]:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec["special"]])
    if spec["tokens"]:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec["tokens"]])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "chat_template.jinja").write_text(spec["template"], encoding="utf-8")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, **spec["config"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    eos = [tok.token_to_id(t) for t in spec["eos"]]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos if len(eos) > 1 else eos[0]}),
                                                   encoding="utf-8")
    return folder
