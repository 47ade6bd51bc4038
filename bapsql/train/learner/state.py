"""The learner's saved state (a mixin of `bapsql.train.learner.core.Learner`): its adapter, its optimizer / scheduler /
step / RNG for checkpoints, and the merged model folder the next stage starts from.

Every tensor a checkpoint holds is moved to the CPU before it leaves the learner, and loaded back with
``map_location`` onto the learner's device: on a cluster the learner runs in an actor on a GPU node and writes its
own state to shared storage, so a CPU-only driver never deserialises a GPU tensor. The mixin uses the learner's
``model`` (the peft model), ``optimizer``, ``scheduler``, ``step``, ``device`` and ``cfg.model_path``.

`snapshot` / `rollback` keep and restore an in-memory copy of that state (CPU copies, held by the learner itself —
in its actor on a cluster — so nothing crosses to the driver): a batch whose optimizer steps failed part-way is
undone rather than trained twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bapsql.errors import ConfigError
from bapsql.train.learner.model_parts import is_weight_file


def _to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor inside (dicts, lists, tuples) moved to the CPU."""
    if hasattr(obj, "detach") and hasattr(obj, "cpu"):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


class LearnerState:
    """Save / load methods of the learner (see the module docstring)."""

    model: Any
    optimizer: Any
    scheduler: Any
    step: int
    device: Any
    cfg: Any

    def save_adapter(self, out_dir: str | Path) -> Path:
        """Write the adapter (``adapter_config.json`` + ``adapter_model.safetensors``) to ``out_dir``."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out, safe_serialization=True)
        return out

    def adapter_state(self) -> dict[str, Any]:
        """The adapter's tensors (cloned to CPU)."""
        from peft import get_peft_model_state_dict

        return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(self.model).items()}

    def load_adapter_state(self, state: dict[str, Any]) -> None:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.model, state)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ConfigError(f"adapter state does not fit this model: unexpected keys {unexpected[:3]}...")

    def training_state(self) -> dict[str, Any]:
        """Optimizer, scheduler and step (what a checkpoint needs besides the adapter), every tensor on the CPU: a
        CPU-only process (a cluster's driver) can hold and deserialise it."""
        return _to_cpu({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                        "step": self.step})

    def load_training_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])  # casts the moments to each parameter's device
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        # the learning rate of this learner's schedule at the restored step, not the saved one: a run resumed with a
        # longer horizon (GRPO's updates grew) would otherwise keep the rate its shorter cosine had reached, 0 at its
        # end, for the next step (the lambdas are built from this learner's config and are not saved)
        sched = self.scheduler
        for group, base, lam in zip(self.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
            group["lr"] = base * lam(sched.last_epoch)
        sched._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def snapshot(self) -> int:
        """Keep a copy of this learner's trainable state (adapter tensors, optimizer, scheduler, step; copied to the
        CPU) in the learner itself, replacing the previous one; returns the step it holds. Pipelined GRPO takes one
        before each batch's optimizer steps, so a failure part-way through can `rollback` instead of training the
        batch twice on retry."""
        import copy

        self._snapshot = {"adapter": self.adapter_state(),
                          "training": copy.deepcopy(_to_cpu({"optimizer": self.optimizer.state_dict(),
                                                             "scheduler": self.scheduler.state_dict(),
                                                             "step": self.step}))}
        return self.step

    def rollback(self) -> int:
        """Restore the state `snapshot` kept (every gradient dropped) and return its step; `ConfigError` when no
        snapshot was taken."""
        import copy

        snap = getattr(self, "_snapshot", None)
        if snap is None:
            raise ConfigError("rollback: no snapshot was taken (call snapshot() before the optimizer steps)")
        self.optimizer.zero_grad(set_to_none=True)
        self.load_adapter_state(snap["adapter"])  # copied into the parameters
        # a copy: on the CPU the optimizer would otherwise adopt the snapshot's tensors and step them in place
        self.load_training_state(copy.deepcopy(snap["training"]))
        return self.step

    def save_state(self, out_dir: str | Path) -> Path:
        """Write this learner's own part of a checkpoint into ``out_dir`` (DESIGN §5): ``adapter/``, ``trainer.pt``
        (optimizer, scheduler, step; tensors moved to the CPU) and ``rng.pt`` (the RNG states of this process).
        On a cluster the learner runs in an actor on a GPU node and writes to shared storage itself, so no GPU
        tensor ever travels to the driver."""
        import torch

        from bapsql.train.learner.checkpoint import capture_rng

        out = Path(out_dir)
        self.save_adapter(out / "adapter")
        torch.save(self.training_state(), out / "trainer.pt")
        torch.save(capture_rng(), out / "rng.pt")
        return out

    def load_adapter(self, adapter_dir: str | Path) -> None:
        """Load the adapter tensors `save_adapter` wrote into ``adapter_dir`` onto this learner's device; the
        optimizer, scheduler and step stay as they are (GRPO's ``keep: best`` loads a validated update this way)."""
        from safetensors.torch import load_file

        f = Path(adapter_dir) / "adapter_model.safetensors"
        if not f.is_file():
            raise ConfigError(f"{adapter_dir}: no adapter_model.safetensors (not a folder save_adapter wrote)")
        self.load_adapter_state(load_file(str(f), device=str(self.device)))

    def load_state(self, path: str | Path, *, rng: bool = True) -> None:
        """Restore what `save_state` wrote (adapter tensors, optimizer, scheduler, step and, with ``rng``, this
        process's RNG states); tensors are loaded onto this learner's device (``map_location``), whatever device
        wrote them."""
        import torch

        from bapsql.train.learner.checkpoint import restore_rng

        p = Path(path)
        if not (p / "adapter" / "adapter_model.safetensors").is_file():
            raise ConfigError(f"{p}: checkpoint has no adapter/adapter_model.safetensors")
        self.load_adapter(p / "adapter")
        self.load_training_state(torch.load(p / "trainer.pt", map_location=self.device, weights_only=False))
        if rng:
            restore_rng(torch.load(p / "rng.pt", map_location="cpu", weights_only=False))

    def merge_and_save(self, out_dir: str | Path) -> Path:
        """Save base + adapter merged into a plain transformers folder (the next stage's base model), with every
        non-weight file of the base folder (tokenizer, chat template, vocab / merges, processor and generation
        configs, ...) copied alongside unless the save wrote it — but not the registry's fetch marker, which vouches
        for the base's weights, not these. The learner itself is unchanged."""
        import copy
        import shutil

        from bapsql.models.fetch import MARKER

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        merged = copy.deepcopy(self.model).merge_and_unload()
        merged.save_pretrained(out, safe_serialization=True)
        written = {p.name for p in out.iterdir()}
        src = Path(self.cfg.model_path)
        for f in src.iterdir():
            if f.name in written or f.name.startswith(".") or f.name == MARKER or is_weight_file(f.name):
                continue
            if f.is_file():
                shutil.copyfile(f, out / f.name)
            elif f.is_dir():
                shutil.copytree(f, out / f.name, dirs_exist_ok=True,
                                ignore=lambda _d, names: [n for n in names if is_weight_file(n)])
        return out
