"""Laying out a report's blocks (`bapsql.analysis.report.report_blocks`) as Markdown and as self-contained HTML.

No text is made here: the blocks carry it. The HTML inlines its CSS and embeds the figures as base64 PNG, so the
single file opens anywhere.
"""

from __future__ import annotations

import base64
import html
from typing import TYPE_CHECKING, Mapping, Sequence

from bapsql.analysis.report import Bullets, Figure, Heading, Paragraph, Table, report_blocks

if TYPE_CHECKING:
    from bapsql.analysis.analyze import Summary


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(s: Summary, figures: Sequence[str] = ()) -> str:
    """Markdown report; figures in ``figures`` (file names next to the report) are linked as images."""
    out: list[str] = []
    for b in report_blocks(s):
        if isinstance(b, Heading):
            out.append("#" * b.level + " " + b.text)
        elif isinstance(b, Paragraph):
            out.append(b.text)
        elif isinstance(b, Bullets):
            out.append("\n".join(f"- {item}" for item in b.items))
        elif isinstance(b, Table):
            lines = ["| " + " | ".join(_md_cell(c) for c in b.columns) + " |",
                     "|" + "|".join("---" for _ in b.columns) + "|"]
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            if b.caption:
                lines.append(f"\n*{b.caption}*")
            out.append("\n".join(lines))
        elif isinstance(b, Figure) and b.name in figures:
            out.append(f"![{b.caption}]({b.name})\n\n*{b.caption}*")
    return "\n\n".join(out) + "\n"


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:2rem auto;max-width:1200px;
padding:0 1.5rem;color:#1d2330;line-height:1.45;font-size:15px}
h1{font-size:1.7rem;border-bottom:2px solid #2b5d9b;padding-bottom:.3rem}h2{font-size:1.3rem;margin-top:2.2rem;
color:#2b5d9b}h3{font-size:1.05rem;margin-top:1.4rem}.wrap{overflow-x:auto;margin:.6rem 0}
table{border-collapse:collapse;font-size:13.5px}th,td{padding:4px 10px;border-bottom:1px solid #dde3ec;
text-align:right;white-space:nowrap}th{background:#eef2f8;border-bottom:2px solid #b9c6da}
td:first-child,th:first-child{text-align:left}tr:nth-child(even) td{background:#f8fafc}
.caption{color:#5a6475;font-size:12.5px;margin:.3rem 0 1rem}figure{margin:1rem 0}
figure img{max-width:100%;border:1px solid #dde3ec}figcaption{color:#5a6475;font-size:12.5px}
ul{padding-left:1.3rem}
"""


def _inline_md(text: str) -> str:
    parts = html.escape(text).split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))


def render_html(s: Summary, figures: Mapping[str, bytes] | None = None) -> str:
    """Self-contained HTML report: inline CSS, figures embedded as base64 PNG (absent figures are left out)."""
    figures = figures or {}
    body: list[str] = []
    for b in report_blocks(s):
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{html.escape(b.text)}</h{b.level}>")
        elif isinstance(b, Paragraph):
            body.append(f"<p>{_inline_md(b.text)}</p>")
        elif isinstance(b, Bullets):
            body.append("<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{html.escape(c)}</th>" for c in b.columns)
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in b.rows)
            cap = f'<div class="caption">{html.escape(b.caption)}</div>' if b.caption else ""
            body.append(f'<div class="wrap"><table><thead><tr>{head}</tr></thead>'
                        f"<tbody>{rows}</tbody></table></div>{cap}")
        elif isinstance(b, Figure) and b.name in figures:
            data = base64.b64encode(figures[b.name]).decode("ascii")
            body.append(f'<figure><img alt="{html.escape(b.caption)}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{html.escape(b.caption)}</figcaption></figure>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<title>bapsql analysis report</title><style>" + _CSS + "</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")
