"""The reports' one section model and its two renderers: Markdown (report.md) and HTML (report.html).

A report section is built once, as data (:class:`Section` holding text, tables, lists, figures and
collapsible detail), and rendered to both formats here; no section writes Markdown or HTML itself.
The HTML renderer escapes every piece of text it is given, in one place, and styles every page with one
stylesheet (:data:`CSS`): the classification report and the detection report are the same kind of page.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from typing import Union


@dataclass(frozen=True)
class Text:
    """A paragraph."""

    text: str


HEADLINE_LABEL_WIDTH = 15


@dataclass(frozen=True)
class Headline:
    """The headline, the same in every task: what it compares (``title``) and one row per finding, (label, words).

    A row whose label is None carries its own lead ("INT8 vs FP16 on orin: …"); a row labelled "" continues the
    one above. The report's first table, and the aligned lines ``edgefold run`` prints (:meth:`lines`).
    """

    title: str
    rows: list[tuple[str | None, str]]

    def lines(self) -> str:
        """The headline as aligned text: the title, then each row indented under it."""
        return "\n".join([self.title, *(f"  {words}" if label is None else
                                        f"  {label:<{HEADLINE_LABEL_WIDTH}}{words}" for label, words in self.rows)])


def page_title(model: str, run: str) -> str:
    """Every task's report page is titled alike."""
    return f"EdgeFold report: {model} / {run}"


@dataclass(frozen=True)
class Bullets:
    """A list; each item an optional bold lead and its text. ``numbered`` for footnotes."""

    items: list[tuple[str, str]]
    numbered: bool = False
    css: str = ""


@dataclass(frozen=True)
class Table:
    """A table of text cells, the first row the header. ``column_css`` names a CSS class per column."""

    rows: list[list[str]]
    column_css: tuple[str, ...] = ()
    css: str = ""


@dataclass(frozen=True)
class Figure:
    """A plot: embedded in the HTML as a PNG; in the Markdown only when it was written beside it (``file``)."""

    key: str
    png_base64: str
    caption: str
    file: str | None = None


@dataclass(frozen=True)
class Details:
    """Detail behind a summary line: collapsed in the HTML, a sub-heading in the Markdown."""

    summary: str
    blocks: list["Block"]


@dataclass
class Section:
    """A heading and its blocks; sub-sections are sections at ``level`` 3."""

    title: str
    blocks: list["Block"] = field(default_factory=list)
    level: int = 2


Block = Union[Text, Headline, Bullets, Table, Figure, Details, Section]


# ----------------------------------------------------------------- Markdown
def _md_cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def _md_text(text: str, cell: bool = False) -> str:
    """Words as Markdown shows them verbatim: no tag a renderer would swallow (``<stdin>``), a table cell's pipes
    escaped (GFM's ``\\|``), one line."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace("\n", " ")
    return text.replace("|", "\\|") if cell else text


def _md_block(block: Block) -> list[str]:
    if isinstance(block, Text):
        return [block.text, ""]
    if isinstance(block, Headline):
        return ([f"**{_md_text(block.title)}**", "", "| | |", "|---|---|"]
                + [f"| {_md_text(label or '', True)} | {_md_text(words, True)} |" for label, words in block.rows]
                + [""])
    if isinstance(block, Bullets):
        return [(f"[{number}] " if block.numbered else "- ") + (f"**{lead}**" if lead else "") + text
                + ("  " if block.numbered else "") for number, (lead, text) in enumerate(block.items, 1)] + [""]
    if isinstance(block, Table):
        head, *body = block.rows
        return (["| " + " | ".join(map(_md_cell, head)) + " |", "|" + "---|" * len(head)]
                + ["| " + " | ".join(map(_md_cell, row)) + " |" for row in body] + [""])
    if isinstance(block, Figure):
        return [f"![{block.caption}]({block.file})", ""] if block.file else []
    if isinstance(block, Details):
        return [f"**{block.summary}**", ""] + [line for inner in block.blocks for line in _md_block(inner)]
    if isinstance(block, Section):
        return to_markdown_lines(block)
    raise TypeError(f"not a report block: {block!r}")


def to_markdown_lines(section: Section) -> list[str]:
    """One section as Markdown lines (a blank line after each block)."""
    return ["#" * section.level + " " + section.title, ""] + [line for block in section.blocks
                                                              for line in _md_block(block)]


def to_markdown(title: str, sections: list[Section]) -> str:
    """The whole Markdown document."""
    lines = [f"# {title}", ""] + [line for section in sections for line in to_markdown_lines(section)]
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------- HTML
# The page's width is capped and every table scrolls inside its own box (html_table), so a wide table never runs
# off a laptop's screen; the ratio columns are highlighted where a table names them.
CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1280px;color:#222;
padding:0 1em}table{border-collapse:collapse;font-size:13px;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 6px;
text-align:right;white-space:nowrap}th{background:#f2f2f2;white-space:normal}td:first-child,td:nth-child(2),
td:last-child{text-align:left}td:last-child{white-space:normal;min-width:7em}th.ratio,td.ratio{background:#eef5ff;
font-weight:600}
figure{margin:0;flex:1 1 520px}figcaption{font-size:13px;color:#555}img{max-width:100%}summary{cursor:pointer}
.grid{display:flex;flex-wrap:wrap;gap:1.5em}.scroll{overflow-x:auto}.notes{font-size:13px;color:#555}
table.headline{font-size:14px;width:100%}table.headline caption{text-align:left;font-weight:600;padding:4px 0}
table.headline th{text-align:left;vertical-align:top;white-space:nowrap;width:9em}
table.headline td{text-align:left;white-space:normal;overflow-wrap:anywhere}
"""


def figure_png(figure) -> str:
    """A matplotlib figure as base64 PNG (what :class:`Figure` embeds), the figure closed."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()

def _attr(css: str) -> str:
    return f' class="{html.escape(css)}"' if css else ""


def html_table(table: Table) -> str:
    """A table in a horizontally scrolling box (every cell escaped)."""
    esc = html.escape
    css = list(table.column_css) + [""] * (len(table.rows[0]) - len(table.column_css))
    head = "".join(f"<th{_attr(c)}>{esc(cell)}</th>" for cell, c in zip(table.rows[0], css))
    body = "".join("<tr>" + "".join(f"<td{_attr(c)}>{esc(cell)}</td>" for cell, c in zip(row, css)) + "</tr>"
                   for row in table.rows[1:])
    return f'<div class="scroll"><table{_attr(table.css)}><tr>{head}</tr>{body}</table></div>'


def _html_block(block: Block) -> str:
    esc = html.escape
    if isinstance(block, Text):
        return f"<p>{esc(block.text)}</p>"
    if isinstance(block, Headline):  # its cells wrap: a long finding never widens the page
        return (f'<table class="headline"><caption>{esc(block.title)}</caption>'
                + "".join(f'<tr><th scope="row">{esc(label or "")}</th><td>{esc(words)}</td></tr>'
                          for label, words in block.rows) + "</table>")
    if isinstance(block, Bullets):
        tag = "ol" if block.numbered else "ul"
        return (f"<{tag}{_attr(block.css)}>" + "".join(f"<li>{f'<b>{esc(lead)}</b>' if lead else ''}{esc(text)}</li>"
                                                       for lead, text in block.items) + f"</{tag}>")
    if isinstance(block, Table):
        return html_table(block)
    if isinstance(block, Figure):
        return (f'<figure><img alt="{esc(block.key)}" src="data:image/png;base64,{block.png_base64}">'
                f"<figcaption>{esc(block.caption)}</figcaption></figure>")
    if isinstance(block, Details):
        return f"<details><summary>{esc(block.summary)}</summary>" + "".join(map(_html_block, block.blocks)) + "</details>"
    if isinstance(block, Section):
        return to_html_fragment(block)
    raise TypeError(f"not a report block: {block!r}")


def to_html_fragment(section: Section) -> str:
    """One section as HTML; its figures side by side in a wrapping grid."""
    parts, figures = [f"<h{section.level}>{html.escape(section.title)}</h{section.level}>"], []
    for block in section.blocks:
        if isinstance(block, Figure):
            figures.append(_html_block(block))
            continue
        if figures:
            parts.append('<div class="grid">' + "".join(figures) + "</div>")
            figures = []
        parts.append(_html_block(block))
    if figures:
        parts.append('<div class="grid">' + "".join(figures) + "</div>")
    return "\n".join(parts)


def to_html(title: str, sections: list[Section], css: str = CSS) -> str:
    """The whole self-contained HTML page."""
    esc = html.escape
    body = "\n".join(to_html_fragment(section) for section in sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{esc(title)}</title>'
            f"<style>{css}</style></head><body>\n<h1>{esc(title)}</h1>\n{body}\n</body></html>\n")
