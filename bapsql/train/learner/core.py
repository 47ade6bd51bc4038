"""The learner: a causal LM with a LoRA adapter (peft) that takes SFT and GRPO steps. Plain class, no Ray.

Contract:

- `Learner(cfg)` loads ``cfg.model_path`` (a transformers folder), wraps it with a fresh LoRA adapter (rank 32 on
  the decoder's attention and MLP projections by default, `discover_lora_targets`; B = 0, so the initial policy
  equals the base model) or with the adapter saved at ``cfg.adapter_path``, in ``cfg.dtype`` (``auto``: the
  checkpoint's, `bapsql.models.dtype`), and builds AdamW over the adapter's parameters plus a warmup + constant /
  linear / cosine LR schedule. Only adapter weights train; the base stays frozen.
- One *update* is one optimizer step over an effective batch of `Sample` sequences: the batch is split into
  micro-batches of at most ``micro_batch_tokens`` padded tokens, gradients accumulate, the loss is normalized by the
  number of loss tokens of the whole effective batch (token mean), the gradient norm is clipped to
  ``max_grad_norm``, then AdamW and the scheduler step. `sft_update` minimizes the completion-token NLL;
  `grpo_update` minimizes `bapsql.train.algo.grpo.policy_loss` (advantage per sequence, engine logprobs per token) with
  every dropout of the model switched off (`dropout_disabled`): the recomputed logprobs are those of the policy
  the engine sampled from, not a noisy draw of it.
- Logprobs are those of the sampler's distribution: ``logits / cfg.temperature`` renormalised over the
  ``cfg.top_p`` / ``cfg.top_k`` nucleus, united with the target token (`bapsql.train.algo.logprobs`; the GRPO stage sets
  the sampling temperature and top-p, so learner and engine — vLLM's processed logprobs, the HF engine — score the
  same distribution and the importance weight measures policy change, not the nucleus mass). Every path uses it:
  the policy's logprobs in the loss, ``old`` logprobs of later optimizer steps, and the KL / drift reference (the
  base model, adapter disabled, under the same temperature and nucleus). They are computed by
  `bapsql.train.algo.logprobs.chunked_token_logprobs` from the final hidden states, ``cfg.logprob_chunk_tokens``
  positions at a time (default: sized by the vocabulary; memory O(chunk · vocab), not O(tokens · vocab));
  ``logprob_chunk_tokens: 0``, an output head that is not a plain ``nn.Linear``, logit soft-capping / scaling, or an
  FSDP-wrapped module take the plain full-logits path instead (`bapsql.train.algo.logprobs.nucleus_logprobs` on all the
  logits: same values, O(tokens · vocab) memory).
- `token_logprobs` gives per-token logprobs without gradients (``[T]`` per sequence, entry ``t`` is
  ``log p(ids[t] | ids[:t])``, entry 0 is 0.0); `logprobs_of(prompt, completion)` is the weight-sync probe (``raw``:
  temperature 1, full softmax, as engines score a given completion, `bapsql.rollout.engines.base.Engine`).
- Thread control: ``cfg.threads`` sets `torch.set_num_threads` (1 by default: under CPU contention torch's default
  pool collapses throughput). ``wrap`` (e.g. Ray Train's ``prepare_model`` → DDP) wraps the module used for the
  forward pass; accumulation micro-batches then skip the all-reduce (``no_sync``) until the last one.

- Saving and loading (the adapter, the learner's checkpoint state, the merged folder): the `LearnerState` mixin,
  `bapsql.train.learner.state`.

Shapes: a `Sample` holds parallel lists ``input_ids``, ``loss_mask`` (1 on trained tokens) and, for GRPO,
``engine_logprobs`` (the sampling logprob on mask-1 tokens) — exactly `bapsql.policies.chat.Segment`'s fields.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from bapsql.errors import ConfigError
from bapsql.models.dtype import resolve_dtype
from bapsql.train.algo.grpo import LossConfig, LossStats, policy_loss, sum_stats
from bapsql.train.algo.logprobs import auto_chunk, chunked_token_logprobs, nucleus_logprobs
from bapsql.train.learner.config import LearnerConfig

from bapsql.train.learner.model_parts import discover_lora_targets, dropout_disabled
from bapsql.train.learner.state import LearnerState


@dataclass(frozen=True)
class Sample:
    """One training sequence. ``advantage`` is used by GRPO only; ``engine_logprobs`` may be None for SFT."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    engine_logprobs: tuple[float, ...] | None = None
    advantage: float = 0.0

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(f"{len(self.input_ids)} ids but {len(self.loss_mask)} mask entries")
        if self.engine_logprobs is not None and len(self.engine_logprobs) != len(self.input_ids):
            raise ValueError(f"{len(self.input_ids)} ids but {len(self.engine_logprobs)} engine logprobs")
        if self.loss_mask and self.loss_mask[0]:
            raise ValueError("the first token has no logprob and cannot be trained on (loss_mask[0] must be 0)")


@dataclass(frozen=True)
class UpdateMetrics:
    """What one optimizer step did. ``loss`` is the full-batch loss; ``grad_norm`` the norm before clipping."""

    loss: float
    grad_norm: float
    lr: float
    sequences: int
    tokens: int  # all (unpadded) tokens processed
    loss_tokens: int  # tokens the loss covers
    micro_batches: int
    seconds: float
    stats: LossStats | None = None  # GRPO only

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _resolve_device(spec: str):
    import torch

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def _lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return f


def _keep_hidden(store: dict[str, Any]) -> Callable[..., None]:
    """A forward hook for the decoder that keeps its final (normed) hidden states ``[b, T, H]`` in ``store``."""
    def hook(_module: Any, _args: Any, output: Any) -> None:
        store["last"] = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
    return hook


class Learner(LearnerState):
    """Causal LM + LoRA + AdamW (see the module docstring)."""

    def __init__(self, cfg: LearnerConfig, *, wrap: Callable[[Any], Any] | None = None):
        import torch
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device = _resolve_device(cfg.device)
        path = Path(cfg.model_path)
        if not (path / "config.json").is_file():
            raise ConfigError(f"learner: no model at {path} (need a transformers folder with config.json)")
        dtype = getattr(torch, resolve_dtype(cfg.dtype, path, self.device))  # auto: by device (models.dtype)
        torch.manual_seed(cfg.seed)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one line per checkpoint shard is noise in job logs
        base = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        if cfg.gradient_checkpointing:
            base.gradient_checkpointing_enable()
            base.enable_input_require_grads()
        if cfg.adapter_path:
            self.model = PeftModel.from_pretrained(base, cfg.adapter_path, is_trainable=True)
        else:
            lc = cfg.lora
            targets = lc.target_modules if lc.target_modules is not None else discover_lora_targets(base)
            self.model = get_peft_model(base, LoraConfig(
                r=lc.rank, lora_alpha=lc.alpha, lora_dropout=lc.dropout, target_modules=list(targets),
                bias="none", task_type="CAUSAL_LM"))
        self.model.to(self.device)
        self.forward_model = wrap(self.model) if wrap is not None else self.model
        self._head = self._chunkable_head(base)
        self._hidden: dict[str, Any] = {}  # the decoder's last output, kept by a hook (a closure, not a bound
        if self._head is not None:        # method: copying the model, as merging does, must not copy the learner)
            base.get_decoder().register_forward_hook(_keep_hidden(self._hidden))
        self.pad_id = int(base.config.pad_token_id if base.config.pad_token_id is not None else 0)
        self.params = [p for p in self.forward_model.parameters() if p.requires_grad]
        oc = cfg.optim
        self.optimizer = torch.optim.AdamW(self.params, lr=oc.lr, betas=(oc.beta1, oc.beta2), eps=oc.eps,
                                           weight_decay=oc.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(oc.schedule, oc.warmup_steps, oc.total_steps))
        self.step = 0

    # ---------------------------------------------------------------------------------------------- forward
    def _chunkable_head(self, base: Any) -> Any:
        """The output head when logprobs can be computed chunk-wise from the decoder's final hidden states (see
        the module docstring), else None."""
        import torch

        if self.cfg.logprob_chunk_tokens == 0 or not hasattr(base, "get_decoder"):
            return None
        head = base.get_output_embeddings()
        config = base.config
        if not isinstance(head, torch.nn.Linear) or getattr(config, "final_logit_softcapping", None) \
                or getattr(config, "logit_scale", None) not in (None, 1.0):
            return None
        fsdp = getattr(getattr(torch.distributed, "fsdp", None), "FullyShardedDataParallel", None)
        if fsdp is not None and isinstance(self.forward_model, fsdp):
            return None
        self._chunk = self.cfg.logprob_chunk_tokens or auto_chunk(head.out_features)
        return head

    def _micro_batches(self, samples: Sequence[Sample]) -> list[list[int]]:
        """Indices grouped into micro-batches of at most ``micro_batch_tokens`` padded tokens (order kept)."""
        budget = self.cfg.micro_batch_tokens
        out: list[list[int]] = []
        cur: list[int] = []
        cur_max = 0
        for i, s in enumerate(samples):
            n = len(s.input_ids)
            if cur and max(cur_max, n) * (len(cur) + 1) > budget:
                out.append(cur)
                cur, cur_max = [], 0
            cur.append(i)
            cur_max = max(cur_max, n)
        if cur:
            out.append(cur)
        return out

    def _batch(self, samples: Sequence[Sample]) -> dict[str, Any]:
        """Right-padded tensors ``[b, T]``: ids, attention mask, loss mask, engine logprobs; advantages ``[b]``."""
        import torch

        T = max(len(s.input_ids) for s in samples)
        b = len(samples)
        ids = torch.full((b, T), self.pad_id, dtype=torch.long)
        attn = torch.zeros((b, T), dtype=torch.long)
        mask = torch.zeros((b, T), dtype=torch.float32)
        eng = torch.zeros((b, T), dtype=torch.float32)
        for i, s in enumerate(samples):
            n = len(s.input_ids)
            ids[i, :n] = torch.tensor(s.input_ids, dtype=torch.long)
            attn[i, :n] = 1
            mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
            if s.engine_logprobs is not None:
                eng[i, :n] = torch.tensor(s.engine_logprobs, dtype=torch.float32)
        adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
        d = self.device
        return {"ids": ids.to(d), "attn": attn.to(d), "mask": mask.to(d), "engine": eng.to(d), "adv": adv.to(d)}

    def _logp(self, model: Any, ids: Any, attn: Any, mask: Any = None, raw: bool = False) -> Any:
        """Per-token logprobs ``[b, T]`` in float32 of ``logits / cfg.temperature`` over the ``cfg.top_p`` /
        ``cfg.top_k`` nucleus (``raw``: ``logits``, full softmax): entry t is log p(ids[t] | ids[:t]); entry 0 is 0.

        With ``mask`` ``[b, T]`` only positions where some row has mask 1 are computed (the LM head runs on those
        alone: prompts and observations, most of an agent's tokens, cost no vocabulary projection); the others
        are 0."""
        import torch

        temp = 1.0 if raw else self.cfg.temperature
        nucleus = {"top_p": 1.0, "top_k": 0} if raw else {"top_p": self.cfg.top_p, "top_k": self.cfg.top_k}
        if mask is None:
            targets = torch.arange(1, ids.shape[1], device=ids.device)  # positions predicted, [K]
        else:
            targets = torch.nonzero(mask[:, 1:].any(dim=0)).squeeze(-1) + 1
        out = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
        if targets.numel() == 0:
            return out
        b, k = ids.shape[0], targets.numel()
        if self._head is None:
            logits = model(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=targets - 1).logits
            lp = nucleus_logprobs(logits.float().reshape(b * k, -1) / temp, ids[:, targets].reshape(-1),
                                  **nucleus).view(b, k)
        else:
            model(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=1)
            hidden = self._hidden.pop("last")[:, targets - 1]  # [b, K, H]
            lp = chunked_token_logprobs(hidden.reshape(b * k, -1), self._head.weight, ids[:, targets].reshape(-1),
                                        bias=self._head.bias, temperature=temp, chunk=self._chunk,
                                        **nucleus).view(b, k)
        return out.index_put((torch.arange(b, device=ids.device)[:, None], targets[None, :]), lp)

    def token_logprobs(self, samples: Sequence[Sample], *, reference: bool = False, masked_only: bool = False,
                       raw: bool = False) -> list[np.ndarray]:
        """Per-token logprobs ``[len(ids)]`` of each sample, no grad, under the sampler's distribution
        (``cfg.temperature``, ``cfg.top_p`` / ``cfg.top_k``; ``raw=True``: temperature 1, full softmax).
        ``reference=True`` disables the adapter (the base model: the KL reference when GRPO starts from an
        SFT-merged base); ``masked_only=True`` computes only positions under some sample's loss mask (others are
        0)."""
        import torch

        out: list[np.ndarray | None] = [None] * len(samples)
        ctx = self.model.disable_adapter() if reference else contextlib.nullcontext()
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad(), ctx:
            for idx in self._micro_batches(samples):
                batch = self._batch([samples[i] for i in idx])
                lp = self._logp(self.model, batch["ids"], batch["attn"], batch["mask"] if masked_only else None,
                                raw).cpu().numpy()
                for row, i in enumerate(idx):
                    out[i] = lp[row, :len(samples[i].input_ids)].astype(np.float64)
        self.model.train(was_training)
        return out  # type: ignore[return-value]

    def logprobs_of(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """Logprobs ``[len(completion)]`` of ``completion_ids`` after ``prompt_ids`` at temperature 1 over the full
        vocabulary (the weight-sync probe: engines score a given completion with the raw distribution)."""
        ids = tuple(prompt_ids) + tuple(completion_ids)
        mask = (0,) * len(prompt_ids) + (1,) * len(completion_ids)
        lp = self.token_logprobs([Sample(ids, mask)], masked_only=True, raw=True)[0]
        return [float(x) for x in lp[len(prompt_ids):]]

    # ---------------------------------------------------------------------------------------------- updates
    def _update(self, samples: Sequence[Sample],
                loss_fn: Callable[[dict, Any, float, list[Sample]], tuple[Any, Any]]) -> UpdateMetrics:
        import torch

        if not samples:
            raise ValueError("an update needs at least one sample")
        t0 = time.perf_counter()
        self.model.train()
        total_loss_tokens = float(sum(sum(s.loss_mask) for s in samples))
        normalizer = max(total_loss_tokens, 1.0)
        groups = self._micro_batches(samples)
        loss_sum = 0.0
        extras = []
        self.optimizer.zero_grad(set_to_none=True)
        for k, idx in enumerate(groups):
            chunk = [samples[i] for i in idx]
            batch = self._batch(chunk)
            sync = k == len(groups) - 1 or not hasattr(self.forward_model, "no_sync")
            ctx = contextlib.nullcontext() if sync else self.forward_model.no_sync()
            with ctx:
                logp = self._logp(self.forward_model, batch["ids"], batch["attn"], batch["mask"])
                loss, extra = loss_fn(batch, logp, normalizer, chunk)
                loss.backward()
            loss_sum += float(loss.detach())
            extras.append(extra)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.max_grad_norm))
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        stats = sum_stats(extras) if extras and isinstance(extras[0], LossStats) else None
        return UpdateMetrics(loss=loss_sum, grad_norm=grad_norm, lr=lr, sequences=len(samples),
                             tokens=sum(len(s.input_ids) for s in samples), loss_tokens=int(total_loss_tokens),
                             micro_batches=len(groups), seconds=time.perf_counter() - t0, stats=stats)

    def sft_update(self, samples: Sequence[Sample]) -> UpdateMetrics:
        """One optimizer step on the completion-token NLL of ``samples`` (token mean over the effective batch)."""
        def nll(batch: dict, logp: Any, normalizer: float, _chunk: list[Sample]):
            return -(logp * batch["mask"]).sum() / normalizer, None
        return self._update(samples, nll)

    def grpo_update(self, samples: Sequence[Sample], loss_cfg: LossConfig, *,
                    old_logprobs: Sequence[Sequence[float]] | None = None) -> UpdateMetrics:
        """One optimizer step on the GRPO loss; every sample needs ``engine_logprobs`` and an ``advantage``. No
        dropout is active in its forward passes (`dropout_disabled`).

        ``old_logprobs`` (``[len(ids)]`` per sample): the learner's logprobs under the weights that began this
        update, for the second and later optimizer steps on one batch (`bapsql.train.learner.minibatch`); without them
        the PPO ratio is 1 in value. With ``loss_cfg.kl_coef > 0`` the reference is the base model (adapter
        disabled), scored under the same temperature and nucleus as the policy."""
        import torch

        if any(s.engine_logprobs is None for s in samples):
            raise ValueError("GRPO samples need the engine's sampling logprobs")
        if old_logprobs is not None and [len(o) for o in old_logprobs] != [len(s.input_ids) for s in samples]:
            raise ValueError("old_logprobs must hold one logprob per token of each sample")
        olds = None if old_logprobs is None else {id(s): o for s, o in zip(samples, old_logprobs)}
        refs = None
        if loss_cfg.kl_coef > 0:
            refs = {id(s): lp for s, lp in zip(samples, self.token_logprobs(samples, reference=True,
                                                                             masked_only=True))}

        def padded(values: dict[int, Any] | None, logp: Any, chunk: list[Sample]) -> Any:
            if values is None:
                return None
            out = torch.zeros_like(logp)
            for row, s in enumerate(chunk):
                out[row, :len(s.input_ids)] = torch.as_tensor(np.asarray(values[id(s)]), dtype=logp.dtype)
            return out

        def pg(batch: dict, logp: Any, normalizer: float, chunk: list[Sample]):
            return policy_loss(logp, batch["engine"], batch["adv"], batch["mask"], loss_cfg,
                               ref_logp=padded(refs, logp, chunk), old_logp=padded(olds, logp, chunk),
                               normalizer=normalizer)

        with dropout_disabled(self.model):
            return self._update(samples, pg)
