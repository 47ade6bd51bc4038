"""Learning curves of a GRPO run as one PNG (per update): mean reward, success rate, filter pass rate, the 0–G
success histogram of drawn groups, and policy drift from the SFT model.

`learning_curves_png(history)` takes the per-update metric dicts of ``grpo/history.jsonl`` (`GRPOTrainer` writes them;
keys ``reward/mean``, ``success/all``, ``success/<level>``, ``filter/kept_share``, ``filter/successes_<k>``,
``drift/kl_k3``) and, optionally, the records of ``grpo/validation.jsonl`` (drawn from update 0 in the success
panel), and returns PNG bytes; a metric missing from every update is drawn as an empty panel with a note.
`pretrain_curve_png(curve)` draws the pretraining loss / held-out completion NLL against step.
Requires matplotlib (the ``analysis`` extra); imported inside.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Sequence


def read_history(path: str | Path) -> list[dict]:
    """The update records of a ``history.jsonl`` (the last record of each update wins, in update order)."""
    by_update: dict[int, dict] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            by_update[int(rec.get("update", len(by_update) + 1))] = rec
    return [by_update[k] for k in sorted(by_update)]


def _series(history: Sequence[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for rec in history:
        if rec.get(key) is not None:
            xs.append(float(rec["update"]))
            ys.append(float(rec[key]))
    return xs, ys


def learning_curves_png(history: Sequence[dict], *, title: str = "GRPO learning curves",
                        validation: Sequence[dict] = ()) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(22, 4))
    ax = axes[0]
    ax.plot(*_series(history, "reward/mean"), marker="o", label="all drawn")
    ax.plot(*_series(history, "reward/kept_mean"), marker=".", label="kept groups")
    ax.set_title("mean reward")
    ax.legend(fontsize=8)
    ax = axes[1]
    ax.plot(*_series(history, "success/all"), marker="o", label="all", color="k")
    levels = sorted({k.split("/", 1)[1] for rec in history for k in rec if k.startswith("success/")} - {"all"})
    for lv in levels:
        ax.plot(*_series(history, f"success/{lv}"), marker=".", label=lv, alpha=0.7)
    if validation:
        ax.plot([float(v["update"]) for v in validation], [float(v["mean"]) for v in validation], marker="s",
                color="tab:red", label="validation (greedy)")
    ax.set_title("success rate (rollouts; validation from update 0)")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax = axes[2]
    ax.plot(*_series(history, "filter/kept_share"), marker="o")
    ax.set_title("filter pass rate (kept / drawn groups)")
    ax.set_ylim(-0.02, 1.02)
    ax = axes[3]
    ks = sorted(int(k.rsplit("_", 1)[1]) for k in (history[0] if history else {}) if k.startswith("filter/successes_"))
    if ks:
        import numpy as np

        grid = np.array([[float(rec.get(f"filter/successes_{k}", 0.0)) for rec in history] for k in ks])
        im = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis",
                       extent=(0.5, len(history) + 0.5, ks[0] - 0.5, ks[-1] + 0.5))
        fig.colorbar(im, ax=ax, label="groups")
    ax.set_title("successes per group (0-G), per update")
    ax.set_xlabel("update")
    ax = axes[4]
    xs, ys = _series(history, "drift/kl_k3")
    if xs:
        ax.plot(xs, ys, marker="o")
    else:
        ax.text(0.5, 0.5, "not logged (grpo.log_drift: false)", ha="center", transform=ax.transAxes)
    ax.set_title("policy drift from SFT (KL k3, sampled tokens)")
    for a in axes:
        a.set_xlabel("update")
        a.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def pretrain_curve_png(curve: Sequence[dict], *, title: str = "pretraining") -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p["step"] for p in curve], [p["loss"] for p in curve], marker=".", label="batch completion loss")
    held = [(p["step"], p["heldout_nll"]) for p in curve if p.get("heldout_nll") is not None]
    if held:
        ax.plot(*zip(*held), marker="o", label="held-out completion NLL")
    ax.set_yscale("log")
    exact = [(p["step"], p["heldout_exact"]) for p in curve if p.get("heldout_exact") is not None]
    if exact:
        twin = ax.twinx()
        twin.plot(*zip(*exact), color="tab:green", marker="s", label="held-out exact completions")
        twin.set_ylim(-0.02, 1.02)
        twin.set_ylabel("share of episodes (teacher-forced)")
        twin.legend(loc="upper center", fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("NLL per completion token")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()
