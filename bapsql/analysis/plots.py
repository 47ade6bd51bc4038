"""The report's figures as PNG bytes (matplotlib, Agg canvas, no global pyplot state).

- `frontier_png`: Budgeted Success over the budget levels, one line per method, with 95% database-cluster bootstrap
  intervals as vertical bars (paper Figure 2, left).
- `quality_tokens_png`: quality–token trajectories, mean total tokens per episode (x) against Budgeted Success (y),
  one line per method through its levels, each point labelled with its level (paper Figure 2, right).

Inputs are plain mappings keyed by ``(method, level)`` so the module depends on nothing else in the package.
matplotlib is imported inside the functions (it is the ``analysis`` extra).
"""

from __future__ import annotations

import io
import math
from typing import Mapping, Sequence

_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">")
_STYLES = ("-", "--", "-.", ":")


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _style(i: int) -> dict:
    from matplotlib import colormaps

    colors = colormaps["tab10"].colors
    return {
        "color": colors[i % len(colors)],
        "marker": _MARKERS[i % len(_MARKERS)],
        "linestyle": _STYLES[(i // len(colors)) % len(_STYLES)],
    }


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def frontier_png(
    methods: Sequence[str],
    levels: Sequence[str],
    success: Mapping[tuple[str, str], float],
    intervals: Mapping[tuple[str, str], tuple[float, float]],
) -> bytes:
    """Budgeted Success (%) by level per method with interval bars; methods are slightly offset to stay legible."""
    fig = _figure(9.0, 5.2)
    ax = fig.add_subplot()
    width = 0.28
    for i, method in enumerate(methods):
        offset = (i - (len(methods) - 1) / 2) * (width / max(1, len(methods) - 1)) if len(methods) > 1 else 0.0
        xs, ys, lo, hi = [], [], [], []
        for j, level in enumerate(levels):
            y = success.get((method, level))
            if not _finite(y):
                continue
            ci = intervals.get((method, level), (math.nan, math.nan))
            xs.append(j + offset)
            ys.append(y)
            lo.append(y - ci[0] if _finite(ci[0]) else 0.0)
            hi.append(ci[1] - y if _finite(ci[1]) else 0.0)
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], capsize=3, linewidth=1.6, markersize=6, label=method, **_style(i))
    ax.set_xticks(range(len(levels)), list(levels))
    ax.set_xlabel("budget level")
    ax.set_ylabel("Budgeted Success (%)")
    ax.set_title("Budgeted Success over the budget ladder (bars: 95% database-cluster bootstrap)", loc="left")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=9)
    return _png(fig)


def quality_tokens_png(
    methods: Sequence[str],
    levels: Sequence[str],
    success: Mapping[tuple[str, str], float],
    tokens: Mapping[tuple[str, str], float],
) -> bytes:
    """Mean total tokens per episode (x) vs Budgeted Success (y), one trajectory per method through its levels."""
    fig = _figure(9.0, 5.2)
    ax = fig.add_subplot()
    for i, method in enumerate(methods):
        pts = [
            (tokens[(method, lv)], success[(method, lv)], lv)
            for lv in levels
            if _finite(tokens.get((method, lv))) and _finite(success.get((method, lv)))
        ]
        if not pts:
            continue
        style = _style(i)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], linewidth=1.6, markersize=6, label=method, **style)
        for x, y, lv in pts:
            ax.annotate(lv, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=style["color"])
    ax.set_xlabel("mean total tokens per episode")
    ax.set_ylabel("Budgeted Success (%)")
    ax.set_title("Quality–token trajectories (points labelled by budget level)", loc="left")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize=9)
    return _png(fig)
