"""The report page: one self-contained HTML file (inline CSS, plots as data: URIs, no network).

A short inline script writes "plots: k/n rendered" once every image has decoded, so a headless
browser check can tell a page that rendered from one that merely loaded.
"""

from __future__ import annotations

import base64
import html
import os

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; background: #fff; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 13px; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; } th:first-child, td:first-child { text-align: left; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 12.5px; max-width: 900px; }
.note { color: #8a5a00; background: #fff6e0; padding: 6px 10px; border-radius: 4px; }
#status { color: #777; font-size: 12px; }
"""

SCRIPT = """
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.getElementById("status").textContent = "plots: " + ok + "/" + imgs.length + " rendered";
});
"""


def esc(x) -> str:
    return html.escape(str(x))


def table(head: list[str], rows: list[list]) -> str:
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>")
    return "\n".join(out) + "</table>"


def figure(path: str, caption: str) -> str:
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode()
    name = os.path.basename(path)
    return (f'<figure><img alt="{esc(name)}" src="data:image/png;base64,{data}">'
            f"<figcaption><b>{esc(name)}</b>: {esc(caption)}</figcaption></figure>")


def render(title: str, sections: list[tuple[str, str]]) -> str:
    """sections: (heading, inner HTML already escaped)."""
    body = "\n".join(f"<h2>{esc(h)}</h2>\n{inner}" for h, inner in sections)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{CSS}</style></head><body>\n<h1>{esc(title)}</h1>\n<p id=\"status\">plots: loading</p>\n"
            f"{body}\n<script>{SCRIPT}</script>\n</body></html>\n")
