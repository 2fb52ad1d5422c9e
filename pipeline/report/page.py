"""The self-contained HTML page: layout, tables and the embedded Vega-Lite specs.

The page loads nothing: the vega-embed bundle (Vega, Vega-Lite, vega-embed; from
vl-convert-python) is inlined once, specs sit in one ``application/json`` script
block, and a Content-Security-Policy forbids every network request.  All text
that may come from logs goes through :func:`.escape.html_text`; the only raw HTML
here is built in this package.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import polars as pl

from ..escape import html_text, script_json
from .bundle import vega_bundle


def generated_stamp() -> str:
    """The "generated" time of a page footer, to the minute (UTC).  ``SOURCE_DATE_EPOCH``
    (seconds since 1970, the reproducible-builds convention) fixes it, so that a page
    rebuilt from the same store is byte-identical."""
    fixed = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    try:
        when = datetime.fromtimestamp(int(fixed), timezone.utc) if fixed else datetime.now(timezone.utc)
    except (ValueError, OverflowError, OSError):  # not a whole number of seconds: the clock
        when = datetime.now(timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M UTC")


# The Content-Security-Policy: nothing may be fetched (default-src 'none').  Scripts:
# only the page's two inline scripts run, each allowed by its SHA-256 hash (no
# 'unsafe-inline', so markup that slipped through escaping could not run script);
# no 'unsafe-eval', as vega-embed is told to evaluate Vega expressions with its AST
# interpreter (``ast: true``) instead of compiling them with ``new Function``.
# Styles keep 'unsafe-inline': Vega writes style attributes on the SVG it draws and
# vega-embed adds a <style> element, and CSS cannot run script.  Images and fonts
# only as data: URLs (Vega's PNG export, none fetched).
CSP_TEMPLATE = (
    "default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; img-src data:; "
    "font-src data:; base-uri 'none'; form-action 'none'"
)

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1180px;padding:16px 24px;
color:#1d2330}
h1{font-size:22px;margin:8px 0 2px}h2{font-size:17px;margin:28px 0 6px;border-bottom:1px solid #dde;padding-bottom:3px}
.rid{font-family:ui-monospace,monospace;word-break:break-all}.sub{color:#5a6270;margin:0 0 10px}
.cards{display:flex;flex-wrap:wrap;gap:8px;margin:10px 0}.card{border:1px solid #dde;border-radius:6px;
padding:6px 10px;min-width:120px}.card b{display:block;font-size:18px}.card span{color:#5a6270;font-size:12px}
.pass{background:#e8f6ec}.fail{background:#fdeaea}.error{background:#fff4dd}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}td,th{border:1px solid #dde;padding:3px 7px;
text-align:right;max-width:360px;overflow-wrap:anywhere}th{background:#f4f5f8}td.l,th.l{text-align:left}
.missing{color:#8a6d00;background:#fff8e1;border:1px dashed #e0c060;padding:8px 12px;border-radius:6px}
.grid{display:flex;flex-wrap:wrap;gap:12px}.chart{min-height:60px}pre{white-space:pre-wrap;overflow-wrap:anywhere;
font-size:12px;background:#f6f7f9;padding:8px;max-height:240px;overflow:auto}footer{color:#5a6270;font-size:12px;
margin-top:30px}#render-status{color:#5a6270;font-size:12px}
"""

# Draw every spec, count successes and failures on #render-status (what the browser test reads).
EMBED_JS = """
(function () {
  var specs = JSON.parse(document.getElementById('tracelat-specs').textContent);
  var status = document.getElementById('render-status');
  var names = Object.keys(specs), ok = 0, failed = 0;
  Promise.all(names.map(function (name) {
    var el = document.getElementById('chart-' + name);
    // ast: Vega's expression interpreter, so the CSP needs no 'unsafe-eval'
    return vegaEmbed(el, specs[name], {actions: false, renderer: 'svg', mode: 'vega-lite', ast: true})
      .then(function () { ok += 1; })
      .catch(function (err) {
        failed += 1;
        el.textContent = 'This chart could not be drawn: ' + err;
        console.error(err);
      });
  })).then(function () {
    status.setAttribute('data-ok', ok);
    status.setAttribute('data-failed', failed);
    status.setAttribute('data-done', '1');
    status.textContent = ok + ' of ' + names.length + ' charts drawn' + (failed ? ', ' + failed + ' failed' : '');
  });
})();
"""


def _script_hash(text: str) -> str:
    """A CSP source allowing exactly the inline script ``text``."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


@functools.lru_cache(maxsize=1)
def csp() -> str:
    """The page's Content-Security-Policy (see CSP_TEMPLATE)."""
    return CSP_TEMPLATE.format(hashes=" ".join((_script_hash(vega_bundle()), _script_hash(EMBED_JS))))


@dataclass
class Section:
    """One part of the page: a heading, trusted intro HTML, charts (key -> spec) or a 'missing' note."""

    key: str
    title: str
    intro: str = ""
    charts: dict[str, dict[str, Any]] = field(default_factory=dict)
    body: str = ""
    missing: list[str] = field(default_factory=list)


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.{digits}f}" if abs(v) < 1e6 else f"{v:.4g}"
    return html_text(v, limit=200)


def table(df: pl.DataFrame, left: tuple[str, ...] = ()) -> str:
    """An HTML table of a small frame; every cell escaped (ids may come from logs)."""
    if df.height == 0:
        return '<p class="sub">(no rows)</p>'
    cls = lambda c: ' class="l"' if c in left else ""  # noqa: E731
    head = "".join(f"<th{cls(c)}>{html_text(c)}</th>" for c in df.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td{cls(c)}>{fmt(v)}</td>" for c, v in zip(df.columns, row)) + "</tr>"
        for row in df.iter_rows()
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def kv_table(items: list[tuple[str, Any]]) -> str:
    rows = "".join(f'<tr><th class="l">{html_text(k)}</th><td class="l">{fmt(v)}</td></tr>' for k, v in items)
    return f"<table>{rows}</table>"


def card(label: str, value: str, css: str = "") -> str:
    return f'<div class="card {css}"><span>{html_text(label)}</span><b>{value}</b></div>'


def missing(text: str) -> str:
    return f'<p class="missing">{html_text(text)}</p>'


def _section_html(s: Section) -> str:
    parts = [f'<section id="{s.key}"><h2>{html_text(s.title)}</h2>', s.intro]
    parts += [missing(m) for m in s.missing]
    if s.charts:
        parts.append(
            '<div class="grid">' + "".join(f'<div class="chart" id="chart-{k}"></div>' for k in s.charts) + "</div>"
        )
    parts += [s.body, "</section>"]
    return "".join(parts)


def _embeddable(spec: dict[str, Any]) -> dict[str, Any]:
    # the $schema URL is only a label (vega-embed is told the mode); dropping it keeps the page URL-free
    return {k: v for k, v in spec.items() if k != "$schema"}


def page(title: str, header: str, sections: list[Section], footer: str) -> str:
    """The complete HTML document."""
    specs = {k: _embeddable(v) for s in sections for k, v in s.charts.items()}
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{csp()}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{html_text(title, limit=160)}</title><style>{STYLE}</style>",
            f"<script>{vega_bundle()}</script></head><body>",
            header,
            "".join(_section_html(s) for s in sections),
            f'<p id="render-status" data-done="0" data-ok="0" data-failed="0">{len(specs)} charts to draw '
            "(they need JavaScript)</p>",
            f"<footer>{footer}</footer>",
            f'<script type="application/json" id="tracelat-specs">{script_json(specs, sort_keys=True)}</script>',
            f"<script>{EMBED_JS}</script></body></html>\n",
        ]
    )
