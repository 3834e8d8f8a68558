"""Writing figures to disk: per-figure files, and one self-contained HTML page."""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from mecheval.io import atomic_write_bytes, atomic_write_text
from mecheval.report.registry import available_figures
from mecheval.report.render import FigureResult


def figure_bytes(result: FigureResult, fmt: str, dpi: int = 150) -> bytes:
    """The figure encoded as ``fmt``, encoded once per (format, dpi)."""
    key = (fmt, dpi)
    if key not in result.encoded:
        buffer = io.BytesIO()
        result.figure.savefig(buffer, format=fmt, dpi=dpi)
        result.encoded[key] = buffer.getvalue()
        # The first encoding laid the figure out (constrained layout: about 40 % of a
        # figure's drawing time); the others keep that layout instead of computing it again.
        result.figure.set_layout_engine("none")
    return result.encoded[key]


def write_figure(
    result: FigureResult, out_dir: str | Path, formats: Sequence[str] = ("png", "pdf")
) -> list[Path]:
    """Write ``<name>.md`` and ``<name>.<fmt>`` for each format, each atomically (temporary
    file and rename in ``out_dir``), so a reader never sees half a figure."""
    out_dir = Path(out_dir)
    paths = [atomic_write_text(out_dir / f"{result.name}.md", result.markdown)]
    for fmt in formats:
        paths.append(
            atomic_write_bytes(out_dir / f"{result.name}.{fmt}", figure_bytes(result, fmt))
        )
    return paths


_TABLE_SEP = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")


def _inline(text: str) -> str:
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def _cells(line: str) -> list[str]:
    inner = line.strip()[1:-1]
    # A cell may contain an escaped pipe ("\|"); split only on the others.
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def markdown_to_html(text: str) -> str:
    """The small markdown subset the figures write: headings, bold, code, bullet lists,
    pipe tables and paragraphs."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")), 6)
            out.append(f"<h{level}>{_inline(line[level:].strip())}</h{level}>")
            i += 1
        elif line.startswith("|") and i + 1 < len(lines) and _TABLE_SEP.match(lines[i + 1]):
            head = "".join(f"<th>{_inline(c)}</th>" for c in _cells(line))
            body = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                body.append(
                    "<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in _cells(lines[i])) + "</tr>"
                )
                i += 1
            out.append(
                f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
            )
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append(f"<ul>{''.join(items)}</ul>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not lines[i].startswith(("#", "|", "- ")):
                para.append(_inline(lines[i]))
                i += 1
            out.append(f"<p>{' '.join(para)}</p>")
    return "\n".join(out)


_STYLE = """
body { font-family: sans-serif; max-width: 1400px; margin: 2em auto; padding: 0 1em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
img { max-width: 100%; }
section { border-top: 2px solid #444; margin-top: 2em; }
details { margin-bottom: 1em; }
.caption { font-style: italic; max-width: 60em; }
"""


def render_html(
    results: Sequence[FigureResult],
    skipped: dict[str, str] | None = None,
    title: str = "mecheval report",
    notes: Sequence[str] = (),
) -> str:
    """The page of these figures (and the reasons others were not made), then ``notes``:
    further markdown sections, e.g. what a command printed after its figures."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if results:
        links = "".join(
            f'<li><a href="#{html.escape(r.name)}">{html.escape(r.name)}</a></li>' for r in results
        )
        parts.append(f"<h2>Contents</h2><ul>{links}</ul>")
    for result in results:
        png = base64.b64encode(figure_bytes(result, "png")).decode("ascii")
        parts += [
            f'<section id="{html.escape(result.name)}">',
            f"<h2>{html.escape(result.name)}</h2>",
            f'<img alt="{html.escape(result.name)}" src="data:image/png;base64,{png}">',
            f'<p class="caption">{html.escape(result.caption)}</p>' if result.caption else "",
            f"<details open><summary>tables</summary>{markdown_to_html(result.markdown)}</details>",
            "</section>",
        ]
    if skipped:
        items = "".join(
            f"<li><code>{html.escape(n)}</code>: {html.escape(why)}</li>"
            for n, why in skipped.items()
        )
        parts.append(f"<section><h2>Figures without data</h2><ul>{items}</ul></section>")
    parts += [f"<section>{markdown_to_html(note)}</section>" for note in notes]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_html(
    df: pd.DataFrame,
    out_path: str | Path,
    figures: Sequence[str] | None = None,
    title: str = "mecheval report",
) -> Path:
    """One self-contained HTML page (PNGs inlined as base64, no external links) with every
    applicable figure (or those named) and its tables; figures without data are listed with
    the reason."""
    results, skipped = available_figures(df, figures)
    return save_html(results, skipped, out_path, title)


def save_html(
    results: Sequence[FigureResult],
    skipped: dict[str, str],
    out_path: str | Path,
    title: str = "mecheval report",
    notes: Sequence[str] = (),
) -> Path:
    """:func:`render_html` of figures already made, written atomically: a command that has
    printed its figures saves the very same ones (making them again could differ)."""
    return atomic_write_text(out_path, render_html(results, skipped, title, notes))
