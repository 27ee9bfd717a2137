"""Markdown results (tables, ledgers, analyses) as self-contained HTML pages for the Snakemake report.

The report shows HTML and images in place but offers CSV and Markdown only as downloads, so every
Markdown result is also written as one HTML page (no external resources: the report is opened from
disk, offline) and that page is what the report lists.
"""

from __future__ import annotations

import html
from pathlib import Path

import markdown

EXTENSIONS = ["tables", "fenced_code", "sane_lists"]
STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em; color: #1f2937;
       line-height: 1.45; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #d1d5db; padding: 0.25em 0.55em; text-align: left; vertical-align: top; }
th { background: #f3f4f6; }
tr:nth-child(even) td { background: #fafafa; }
code { background: #f3f4f6; padding: 0 0.2em; border-radius: 3px; font-size: 0.9em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.4em; }
"""


def markdown_html(text: str, title: str) -> str:
    """A complete HTML page of Markdown `text` (GitHub-style pipe tables) with an inline style sheet."""
    body = markdown.markdown(text, extensions=EXTENSIONS, output_format="html")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n"
    )


def write_markdown_html(md_path: str | Path, html_path: str | Path, title: str | None = None) -> Path:
    """Render the Markdown file `md_path` to `html_path` (title: the file's stem); returns the path."""
    md_path, html_path = Path(md_path), Path(html_path)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    html_path.write_text(markdown_html(md_path.read_text(), title or md_path.stem))
    return html_path
