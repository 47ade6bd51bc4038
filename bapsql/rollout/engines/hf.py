"""The transformers reference engine: batched sampling with a KV cache, per-request seeds, peft LoRA adapters.

Contract (see `bapsql.rollout.engines.base`): prompts are left-padded into one batch ``[B, P]`` (position ids count
only real tokens), decoded step by step with the model's KV cache; each row samples with its own
`torch.Generator` seeded from its request's ``seed`` (or from the engine's seeded generator), so a seeded request
gives the same completion whatever batch it is in. Greedy (``temperature == 0``) takes the argmax, which is what
vLLM does, so both engines produce the same greedy completions up to floating-point near-ties. Logprobs are those
of the distribution each token was sampled from (vLLM's ``processed_logprobs``): ``log_softmax(logits / T)``
renormalised over the top-p nucleus; greedy requests report the raw ``log_softmax(logits)``. ``logprobs_of``
(teacher forcing) reports raw logprobs.

Adapters are peft LoRA folders. ``load_adapter`` loads a new version under a fresh internal name and then deletes
the old one, so a failed load leaves the previous version serving; ``served_adapter`` reports the version serving
and the digest of the files it was loaded from. Requires torch, transformers and peft (the
``engines`` extra); imported when the engine is built.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Sequence

from bapsql.errors import EngineError
from bapsql.models.dtype import resolve_dtype
from bapsql.rollout.engines.base import (
    RoundBatching,
    model_folder,
    AdapterRef,
    EngineConfig,
    Generation,
    SamplingParams,
    adapter_digest,
    check_batch,
    cpu_share,
    cut_at_stop,
)
from bapsql.rollout.engines.codec import ModelCodec, quiet_transformers


class HFEngine(RoundBatching):
    """Reference engine on Hugging Face transformers (CPU or one CUDA device)."""

    name = "hf"

    def __init__(self, config: EngineConfig):
        import torch
        from transformers import AutoModelForCausalLM

        path = model_folder(config, "hf", "HFEngine")
        torch.set_num_threads(config.num_threads or cpu_share())
        if config.device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            device = config.device
        dtype = getattr(torch, resolve_dtype(config.dtype, path, device))  # auto: by device (bapsql.models.dtype)
        try:
            with quiet_transformers():
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise EngineError(f"hf engine: cannot load {path}: {exc}") from exc
        self.config = config
        self._torch = torch
        self._device = torch.device(device)
        self._base = model.to(self._device).eval()
        self._peft = None  # a peft.PeftModel wrapping _base once an adapter is loaded
        self._codec = ModelCodec.from_dir(config.tokenizer_dir or path)
        self._adapters: dict[str, AdapterRef] = {}
        self._internal: dict[str, str] = {}  # adapter name -> peft adapter name of its loaded version
        self._loads = 0
        self._rng = torch.Generator().manual_seed(config.seed)
        self._closed = False

    # -- protocol ---------------------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams], *,
                 adapter: AdapterRef | None = None) -> list[Generation]:
        """Sample one completion per prompt (batched in chunks of ``max_num_seqs``)."""
        self._check_open()
        check_batch(prompts, params, self.config.max_model_len)
        out: list[Generation] = []
        with self._adapter_context(adapter):
            step = self.config.max_num_seqs
            for lo in range(0, len(prompts), step):
                out.extend(self._generate_batch(prompts[lo:lo + step], params[lo:lo + step]))
        return out

    def load_adapter(self, path: str, name: str, version: int) -> AdapterRef:
        """Load peft adapter folder ``path`` as the current version of ``name`` (replacing an older one)."""
        from peft import PeftModel

        self._check_open()
        if not (Path(path) / "adapter_config.json").is_file():
            raise EngineError(f"load_adapter: {path} is not a peft adapter folder (no adapter_config.json)")
        digest = adapter_digest(path)  # what this engine reads, reported by served_adapter
        self._loads += 1
        internal = f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}__{self._loads}"
        try:
            if self._peft is None:
                self._peft = PeftModel.from_pretrained(self._base, path, adapter_name=internal, is_trainable=False)
            else:
                self._peft.load_adapter(path, adapter_name=internal, is_trainable=False)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise EngineError(f"load_adapter: cannot load {path} as {name!r}: {exc}") from exc
        self._peft.eval()
        old = self._internal.get(name)
        self._internal[name] = internal
        if old is not None:
            self._peft.set_adapter(internal)  # never delete the active adapter
            self._peft.delete_adapter(old)
        lora_id = self._adapters[name].lora_id if name in self._adapters else len(self._adapters) + 1
        ref = AdapterRef(name=name, version=version, path=str(path), lora_id=lora_id, digest=digest)
        self._adapters[name] = ref
        return ref

    def served_adapter(self, adapter: AdapterRef | None) -> AdapterRef | None:
        """The version of ``adapter``'s name this engine samples with, as loaded (None: the base weights)."""
        self._check_open()
        return None if adapter is None else self._adapters.get(adapter.name)

    def logprobs_of(self, prompt_ids: Sequence[int], completion_ids: Sequence[int], *,
                    adapter: AdapterRef | None = None) -> list[float]:
        """Raw log-probabilities of ``completion_ids`` after ``prompt_ids`` (teacher forcing, one forward pass)."""
        torch = self._torch
        self._check_open()
        if not prompt_ids or not completion_ids:
            raise EngineError("logprobs_of: prompt and completion must both be non-empty")
        ids = list(prompt_ids) + list(completion_ids)
        with self._adapter_context(adapter), torch.inference_mode():
            logits = self._model()(input_ids=torch.tensor([ids], device=self._device)).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt_ids) - 1:len(ids) - 1], dim=-1)
        target = torch.tensor(list(completion_ids), device=self._device)
        return logp.gather(1, target[:, None])[:, 0].tolist()

    def close(self) -> None:
        """Drop the model (idempotent)."""
        if not self._closed:
            self._closed = True
            self._peft = None
            self._base = None

    # -- internals ----------------------------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("hf engine: used after close()")

    def _model(self):
        return self._peft if self._peft is not None else self._base

    def _adapter_context(self, adapter: AdapterRef | None):
        if adapter is None:
            return self._peft.disable_adapter() if self._peft is not None else contextlib.nullcontext()
        current = self._adapters.get(adapter.name)
        if current is None:
            raise EngineError(f"adapter {adapter.name!r} is not loaded; call load_adapter first")
        if current.version != adapter.version:
            raise EngineError(f"adapter {adapter.name!r} version {adapter.version} was replaced by version "
                              f"{current.version}; use the AdapterRef load_adapter returned last")
        self._peft.set_adapter(self._internal[adapter.name])
        return contextlib.nullcontext()

    def _pick(self, logits, sp: SamplingParams, gen) -> tuple[int, float]:
        """One token from ``logits`` [V] under ``sp`` (greedy, temperature, nucleus) and its logprob under the
        distribution it was sampled from (see the module docstring)."""
        torch = self._torch
        if sp.greedy:
            tok = int(torch.argmax(logits))
            return tok, float(torch.log_softmax(logits, dim=-1)[tok])
        logp = torch.log_softmax(logits / sp.temperature, dim=-1)
        probs = logp.exp()
        if sp.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = (torch.cumsum(sorted_p, dim=-1) - sorted_p) < sp.top_p
            sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
            tok = int(order[torch.multinomial(sorted_p, 1, generator=gen)])
            return tok, float(logp[tok] - torch.log(sorted_p.sum()))
        tok = int(torch.multinomial(probs, 1, generator=gen))
        return tok, float(logp[tok])

    def _generate_batch(self, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]) -> list[Generation]:
        torch = self._torch
        dev = self._device
        b, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((b, width), self._codec.pad_id, dtype=torch.long)
        mask = torch.zeros((b, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        gens = []
        for sp in params:
            seed = sp.seed if sp.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._rng))
            gens.append(torch.Generator(device=dev).manual_seed(seed))
        toks: list[list[int]] = [[] for _ in range(b)]
        lps: list[list[float]] = [[] for _ in range(b)]
        reasons: list[str | None] = [None] * b
        texts: list[str | None] = [None] * b
        model = self._model()
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
            for _ in range(max(sp.max_tokens for sp in params)):
                logits = out.logits[:, -1, :].float()
                nxt = []
                for i, sp in enumerate(params):
                    if reasons[i] is not None:
                        nxt.append(self._codec.pad_id)
                        continue
                    tok, lp = self._pick(logits[i], sp, gens[i])
                    toks[i].append(tok)
                    lps[i].append(lp)
                    nxt.append(tok)
                    if tok in self._codec.eos_ids:
                        reasons[i], texts[i] = "stop", self._codec.decode(toks[i][:-1])  # as vLLM: no eos text
                    elif sp.stop:
                        text, hit = cut_at_stop(self._codec.decode(toks[i]), sp.stop)
                        if hit:
                            reasons[i], texts[i] = "stop", text
                    if reasons[i] is None and len(toks[i]) >= sp.max_tokens:
                        reasons[i] = "length"
                if all(r is not None for r in reasons):
                    break
                mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=dev)], dim=1)
                pos = pos[:, -1:] + 1
                out = model(input_ids=torch.tensor(nxt, device=dev)[:, None], attention_mask=mask, position_ids=pos,
                            past_key_values=out.past_key_values, use_cache=True)
        return [
            Generation(prompt_ids=tuple(prompts[i]), completion_ids=tuple(toks[i]),
                       text=texts[i] if texts[i] is not None else self._codec.decode(toks[i]),
                       logprobs=tuple(lps[i]) if params[i].logprobs else None, finish_reason=reasons[i])
            for i in range(b)
        ]
