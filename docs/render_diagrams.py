"""Render the site's diagrams, ``docs/diagrams/*.mmd``, to the SVG files the pages show.

The pages show each diagram as a plain image (``![...](diagrams/name.svg)``), so the
site draws them with no JavaScript and no network: behind a firewall, in an air-gapped
mirror, or opened from disk. The Mermaid sources sit beside the SVGs; after changing a
source, render it again and commit both::

    python docs/render_diagrams.py          # renders every stale diagram
    python docs/render_diagrams.py --all    # renders them all
    python docs/render_diagrams.py --check  # lists stale diagrams, renders nothing

Rendering needs Mermaid's command line tool and a Chromium (not needed by ``--check``,
nor to build the site). Installed once, outside the repository::

    apt-get install chromium
    PUPPETEER_SKIP_DOWNLOAD=1 npm install --prefix ~/.cache/mmdc \\
        @mermaid-js/mermaid-cli@11.17.0 puppeteer@24
    export MMDC=~/.cache/mmdc/node_modules/.bin/mmdc

``MMDC`` names the ``mmdc`` program (default: ``mmdc`` on ``PATH``), ``CHROMIUM`` the
browser (default: ``chromium`` on ``PATH``). Each SVG starts with a comment holding the
SHA-256 of the source it was rendered from; ``tests/test_docs_site.py`` checks that
every source has an SVG rendered from its current text.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DIAGRAMS = Path(__file__).resolve().parent / "diagrams"
_STAMP = re.compile(
    r"^<!-- rendered by docs/render_diagrams\.py from (\S+), sha256 ([0-9a-f]{64}) -->"
)
_VIEWBOX = re.compile(r'viewBox="[-\d.]+ [-\d.]+ ([\d.]+) ([\d.]+)"')


def source_digest(source: Path) -> str:
    """Return the SHA-256 of a diagram's source, as its SVG's stamp records it."""
    return hashlib.sha256(source.read_bytes()).hexdigest()


def stale(directory: Path = DIAGRAMS) -> list[str]:
    """Return the names of the sources whose SVG is missing or was rendered from other text."""
    out = []
    for source in sorted(directory.glob("*.mmd")):
        svg = source.with_suffix(".svg")
        match = _STAMP.match(svg.read_text(encoding="utf-8")) if svg.exists() else None
        if match is None or match.group(2) != source_digest(source):
            out.append(source.name)
    return out


def _stamp(svg: str, source: Path) -> str:
    # An <img> sizes an SVG by its width and height: give it the drawing's own size
    # (the page's CSS scales a wide one down), not mmdc's width="100%", which would
    # blow a small diagram up to the column's width.
    match = _VIEWBOX.search(svg)
    if match is None:
        raise SystemExit(f"{source.name}: no viewBox in mmdc's output")
    width, height = (round(float(v)) for v in match.groups())
    svg = re.sub(
        r'<svg id="my-svg" width="100%"', f'<svg id="my-svg" width="{width}" height="{height}"', svg
    )
    svg = re.sub(r' style="max-width: [\d.]+px; ', ' style="', svg, count=1)
    svg = svg.replace("#my-svg", f"#{source.stem}").replace('"my-svg', f'"{source.stem}')
    header = (
        f"<!-- rendered by docs/render_diagrams.py from {source.name},"
        f" sha256 {source_digest(source)} -->\n"
    )
    return header + svg.rstrip("\n") + "\n"


# Labels as SVG text, not HTML in a <foreignObject>: a foreignObject is as wide as the
# label measured in the renderer's fonts, and clips it where the reader's fallback font
# is wider (DejaVu Sans, the usual Linux fallback for "trebuchet ms": "attempt sta",
# "queued: ta"). SVG text is never clipped.
MERMAID_CONFIG = {"htmlLabels": False, "flowchart": {"htmlLabels": False}}


def render(source: Path, mmdc: str, chromium: str) -> None:
    """Render one source to the SVG beside it."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "puppeteer.json"
        config.write_text(
            json.dumps({"executablePath": chromium, "args": ["--no-sandbox", "--disable-gpu"]})
        )
        mermaid = Path(tmp) / "mermaid.json"
        mermaid.write_text(json.dumps(MERMAID_CONFIG))
        out = Path(tmp) / "out.svg"
        command = [mmdc, "--quiet", "-p", str(config), "-c", str(mermaid), "-b", "white"]
        command += ["-i", str(source)]
        subprocess.run([*command, "-o", str(out)], check=True, timeout=120)
        svg = out.read_text(encoding="utf-8")
    source.with_suffix(".svg").write_text(_stamp(svg, source), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="list stale diagrams; render none")
    group.add_argument("--all", action="store_true", help="render every diagram")
    args = parser.parse_args()
    todo = [s.name for s in sorted(DIAGRAMS.glob("*.mmd"))] if args.all else stale()
    if args.check:
        for name in todo:
            print(f"stale: docs/diagrams/{name}")
        return 1 if todo else 0
    mmdc = shutil.which(os.environ.get("MMDC", "mmdc"))
    chromium = shutil.which(os.environ.get("CHROMIUM", "chromium"))
    if todo and (mmdc is None or chromium is None):
        print("needs mmdc and chromium: see this script's docstring", file=sys.stderr)
        return 2
    for name in todo:
        assert mmdc is not None
        assert chromium is not None
        print(f"rendering docs/diagrams/{name}")
        render(DIAGRAMS / name, mmdc, chromium)
    return 0


if __name__ == "__main__":
    sys.exit(main())
