"""Learning-curve figures (bapsql/train/recipe/curves.py): PNG bytes from per-update records; the last record per update
wins when a history has duplicates."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("matplotlib")

from bapsql.train.recipe.curves import learning_curves_png, pretrain_curve_png, read_history  # noqa: E402


def _rec(u, **extra):
    return {"update": u, "reward/mean": 0.1 * u, "reward/kept_mean": 0.2, "success/all": 0.05 * u, "success/XS": 0.1,
            "filter/kept_share": 0.5, **{f"filter/successes_{k}": float(k == u % 9) for k in range(9)}, **extra}


@pytest.mark.slow  # draws every figure
def test_history_keeps_the_last_record_of_each_update_and_draws_png(tmp_path):
    path = tmp_path / "history.jsonl"
    recs = [_rec(1), _rec(2), _rec(2, **{"drift/kl_k3": 0.01}), _rec(3, **{"drift/kl_k3": 0.02})]
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    hist = read_history(path)
    assert [r["update"] for r in hist] == [1, 2, 3] and hist[1]["drift/kl_k3"] == 0.01
    png = learning_curves_png(hist)
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    with_val = learning_curves_png(hist, validation=[{"update": 0, "mean": 0.4}, {"update": 2, "mean": 0.5}])
    assert with_val.startswith(b"\x89PNG") and with_val != png  # the validation series is drawn
    assert pretrain_curve_png([{"step": 0, "loss": 9.0, "heldout_nll": 8.9, "heldout_exact": 0.0},
                               {"step": 10, "loss": 1.0, "heldout_nll": 1.1, "heldout_exact": 0.25}]
                              ).startswith(b"\x89PNG")
