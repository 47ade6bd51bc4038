"""Build the packaged tokenizer of the tiny policy model (``bapsql/resources/tokenizer/``).

Contract: `build_tokenizer(out_dir, vocab_size=8192, corpus_scale=1.0, seed=0)` trains, locally and without any
download, a byte-level BPE with Qwen2's normalizer, pre-tokenizer regex (digits split one by one) and decoder on a
corpus that `bapsql.models.tokenizer_corpus.corpus_lines` generates (SQL over made-up schemas, English questions
with numbers, dates and names, JSON tool calls and observations, ledger and estimate texts), then writes a folder
that `transformers` and vLLM load as a Qwen2-style tokenizer:

- ``tokenizer.json``: the BPE vocabulary (``vocab_size - 7`` learned entries) followed by the seven Qwen2 special
  tokens (`SPECIAL_TOKENS`; the tool tags are added tokens that decoding keeps, as in Qwen2.5),
- ``tokenizer_config.json``: ``Qwen2Tokenizer`` class, eos ``<|im_end|>``, pad ``<|endoftext|>``, and a Qwen2.5-style
  ``chat_template`` (`CHAT_TEMPLATE`) with tools, assistant ``tool_calls`` and ``tool`` messages,
- ``special_tokens_map.json``.

The build is deterministic: the same arguments give byte-identical files. Rebuild with
``python -m bapsql.models.tokenizer_build --out DIR``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bapsql.errors import ConfigError
from bapsql.models.tokenizer_corpus import DEFAULT_SYSTEM, corpus_lines

# (content, special): special tokens are dropped by ``skip_special_tokens`` decoding; the tool tags are not (Qwen2.5).
SPECIAL_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
)
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
MODEL_MAX_LENGTH = 32768
# Qwen2's pre-tokenizer: contractions, letters with one leading non-letter, single digits, punctuation runs, newlines.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# A Qwen2.5-style chat template (the layout vLLM's and transformers' Qwen tooling expect).
CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- '" + DEFAULT_SYSTEM + "' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == 'assistant' %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {%- if tool_call.arguments is string %}\n"
    "                {{- tool_call.arguments }}\n"
    "            {%- else %}\n"
    "                {{- tool_call.arguments | tojson }}\n"
    "            {%- endif %}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == 'tool' %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


@dataclass(frozen=True)
class TokenizerBuild:
    """What `build_tokenizer` wrote: the folder, the final vocabulary size (specials included) and the files."""

    out_dir: Path
    vocab_size: int
    corpus_lines: int
    files: tuple[str, ...]


def _tokenizer_config() -> dict:
    added = {}
    for i, (content, special) in enumerate(SPECIAL_TOKENS):
        added[content] = {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": special}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,  # keyed by id below, once ids are known
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],  # as Qwen2.5: the tool tags are not special
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": PAD_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def build_tokenizer(out_dir: str | Path, *, vocab_size: int = 8192, corpus_scale: float = 1.0,
                    seed: int = 0) -> TokenizerBuild:
    """Train the byte-level BPE and write ``tokenizer.json``, ``tokenizer_config.json`` and
    ``special_tokens_map.json`` into ``out_dir`` (created if needed). ``vocab_size`` counts the special tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ConfigError(f"vocab_size must exceed the 256 byte symbols plus {len(SPECIAL_TOKENS)} specials")
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = BpeTrainer(vocab_size=vocab_size - len(SPECIAL_TOKENS), min_frequency=2, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    lines = list(corpus_lines(corpus_scale, seed))
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    # Specials go after the learned vocabulary, as in Qwen2 (ids vocab..vocab+6).
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, s in SPECIAL_TOKENS if s])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, s in SPECIAL_TOKENS if not s])

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=False) + "\n", encoding="utf-8")
    config = _tokenizer_config()
    config["added_tokens_decoder"] = {str(tok.token_to_id(t)): spec
                                      for t, spec in config["added_tokens_decoder"].items()}
    _write_json(out / "tokenizer_config.json", config)
    _write_json(out / "special_tokens_map.json", {
        "additional_special_tokens": config["additional_special_tokens"],
        "eos_token": _token_entry(EOS_TOKEN),
        "pad_token": _token_entry(PAD_TOKEN),
    })
    files = ("special_tokens_map.json", "tokenizer.json", "tokenizer_config.json")
    return TokenizerBuild(out_dir=out, vocab_size=tok.get_vocab_size(with_added_tokens=True),
                          corpus_lines=len(lines), files=files)


def _token_entry(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """``python -m bapsql.models.tokenizer_build --out DIR [--vocab-size N] [--scale F] [--seed S]``."""
    import click

    @click.command(context_settings={"help_option_names": ["-h", "--help"]})
    @click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
                  help="Folder to write tokenizer.json, tokenizer_config.json and special_tokens_map.json into.")
    @click.option("--vocab-size", default=8192, show_default=True, type=click.IntRange(min=264),
                  help="Total vocabulary size, the 7 special tokens included.")
    @click.option("--scale", default=1.0, show_default=True, type=click.FloatRange(min=0.0001),
                  help="Corpus size relative to the default 60,000 generated lines.")
    @click.option("--seed", default=0, show_default=True, type=int, help="Seed of the corpus generator.")
    def command(out: Path, vocab_size: int, scale: float, seed: int) -> None:
        """Train the packaged byte-level BPE tokenizer (deterministic, no downloads) and write it to OUT."""
        result = build_tokenizer(out, vocab_size=vocab_size, corpus_scale=scale, seed=seed)
        click.echo(f"wrote {', '.join(result.files)} to {result.out_dir} "
                   f"(vocab {result.vocab_size}, corpus {result.corpus_lines} lines)")

    command.main(args=argv, prog_name="python -m bapsql.models.tokenizer_build")


if __name__ == "__main__":
    main()
