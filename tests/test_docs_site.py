"""The documentation site's machinery: the griffe extension and the built pages.

``docs/griffe_taskvisor.py`` turns the docstrings' reST-isms into Markdown and gives
attrs classes the ``__init__`` attrs writes at import time; the tests here check both on
small sources, and then build the real site (``mkdocs build --strict``, as CI does) and
look at a few pages: a signature built from attrs fields, an included example, the
diagrams (SVG images rendered by ``docs/render_diagrams.py``, and nothing loaded from
another host). They need the ``docs`` extra and skip without it. The last ones open
every page in a headless Chromium (``tests/chromium.py``, the network off) at window
widths from 768 to 1920 px (tablets, small laptops, desktops) and at phones' sizes and
measure what a reader sees: no code block scrolls sideways from 768 px up; on a phone
long code lines scroll inside their block, by choice, and nothing else is wider than the
screen.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chromium import Browser, chromium, find_chromium

ROOT = Path(__file__).resolve().parent.parent


def _extension() -> Any:
    spec = importlib.util.spec_from_file_location(
        "griffe_taskvisor", ROOT / "docs" / "griffe_taskvisor.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ext() -> Any:
    pytest.importorskip("griffe", reason="needs the docs extra")
    return _extension()


def test_literal_block_becomes_a_fence(ext: Any) -> None:
    """``Usage::`` and the indented block after it: a fenced text block."""
    text = "Usage::\n\n    python -m x\n    python -m y\n\nAfter."
    assert ext.rst_to_markdown(text) == (
        "Usage:\n\n```text\npython -m x\npython -m y\n```\n\nAfter."
    )


def test_simple_table_becomes_a_markdown_table(ext: Any) -> None:
    """Rows between ``===`` borders; a row with an empty first cell continues the last."""
    text = textwrap.dedent(
        """\
        =====  ==========
        name   meaning
        =====  ==========
        ``a``  the first,
               continued
        ``b``  the second
        =====  ==========
        """
    )
    assert ext.rst_to_markdown(text).splitlines() == [
        "| name | meaning |",
        "|---|---|",
        "| ``a`` | the first, continued |",
        "| ``b`` | the second |",
    ]


def test_definition_list_and_title(ext: Any) -> None:
    """A term with an indented definition: a Markdown definition; an underlined title."""
    text = "Fixtures\n--------\n``supervisor``\n    An open supervisor,\n    per test."
    assert ext.rst_to_markdown(text).splitlines() == [
        "**Fixtures**",
        "",
        "",
        "``supervisor``",
        ":   An open supervisor,",
        "    per test.",
    ]


def test_markdown_is_left_alone(ext: Any) -> None:
    """Lists, paragraphs and fenced blocks pass through unchanged."""
    text = "Summary.\n\n* one\n  two\n\n```python\nx = 1  ::\n```"
    assert ext.rst_to_markdown(text) == text


def test_attrs_classes_get_their_init(ext: Any, tmp_path: Path) -> None:
    """The ``__init__`` is built from the fields, with their docstrings."""
    import griffe

    package = tmp_path / "sample"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            '''\
            from typing import ClassVar

            import attrs


            @attrs.frozen
            class Base:
                """A base."""

                grace: float = 60.0
                """Seconds to wait."""


            @attrs.define(kw_only=True)
            class Config(Base):
                """A config."""

                LIMIT: ClassVar[int] = 3
                names: list[str] = attrs.field(factory=list)
                """The names."""
                _hidden: int = attrs.field(default=0, alias="shown")
                cache: dict[str, int] = attrs.field(init=False, factory=dict)
            '''
        ),
        encoding="utf-8",
    )
    loaded = griffe.load(
        "sample",
        search_paths=[str(tmp_path)],
        extensions=griffe.load_extensions(ext.TaskvisorDocs),
    )
    config = loaded["Config"]
    init = config.members["__init__"]
    params = {p.name: p for p in init.parameters}
    assert list(params) == ["self", "grace", "names", "shown"]
    assert str(params["grace"].default) == "60.0"
    assert str(params["names"].default) == "list()"
    assert params["names"].kind is griffe.ParameterKind.keyword_only
    assert params["grace"].docstring.value == "Seconds to wait."
    assert config.members["names"].docstring.value == "The names."
    assert "instance-attribute" in config.members["names"].labels
    assert "class-attribute" in config.members["LIMIT"].labels


def test_internals_stay_out_of_the_reference(ext: Any, tmp_path: Path) -> None:
    """Slots, attrs hooks and undocumented dunders go; private names leave signatures."""
    import griffe

    package = tmp_path / "internals"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            '''\
            import enum

            import attrs

            _LIMIT = 30.0


            class _Inherit(enum.Enum):
                INHERIT = "INHERIT"


            INHERIT = _Inherit.INHERIT


            def _check(value):
                return value


            @attrs.frozen
            class Config:
                """A config."""

                url: str = attrs.field(converter=_check)
                """The URL."""
                limit: float = attrs.field(default=_LIMIT, validator=lambda _i, _a, v: None)
                """The limit."""
                mode: int | _Inherit = INHERIT
                """The mode."""

                def __attrs_post_init__(self):
                    pass

                def __repr__(self):
                    return "Config()"

                def __str__(self):
                    """Show the URL without its password."""
                    return "..."


            class Waiter:
                """A waiter."""

                __slots__ = ("_x",)

                def __eq__(self, other):
                    return False
            '''
        ),
        encoding="utf-8",
    )
    loaded = griffe.load(
        "internals",
        search_paths=[str(tmp_path)],
        extensions=griffe.load_extensions(ext.TaskvisorDocs),
    )
    config = loaded["Config"]
    assert sorted(config.members) == ["__init__", "__str__", "limit", "mode", "url"]
    assert list(loaded["Waiter"].members) == []
    assert config.members["url"].value is None
    assert str(config.members["limit"].value) == "30.0"
    assert str(config.members["mode"].annotation) == "int"
    init = {p.name: p for p in config.members["__init__"].parameters}
    assert str(init["limit"].default) == "30.0"
    assert str(init["mode"].annotation) == "int"
    assert str(init["mode"].default) == "INHERIT"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs", reason="needs the docs extra")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def _text(page: Path) -> str:
    html = page.read_text(encoding="utf-8")
    return re.sub(r"<[^>]+>", "", html).replace("&amp;", "&").replace("&#39;", "'")


def test_site_renders_attrs_signatures(site: Path) -> None:
    """``SupervisorConfig``'s signature comes from its fields, with their defaults."""
    text = _text(site / "reference" / "supervisor" / "index.html")
    assert re.search(r"SupervisorConfig\(\s*grace: float = 60\.0,", text)
    assert "open_supervisor(" in text
    assert "AbstractAsyncContextManager[Supervisor, bool]" in text


def test_site_includes_the_examples(site: Path) -> None:
    """The examples page shows each program's code, not the include line."""
    text = _text(site / "examples" / "index.html")
    assert "--8&lt;--" not in text
    assert "--8<--" not in text
    for example in sorted((ROOT / "examples").glob("*.py")):
        assert f"examples/{example.name}" in text


def _render_diagrams() -> Any:
    spec = importlib.util.spec_from_file_location(
        "render_diagrams", ROOT / "docs" / "render_diagrams.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_diagrams_are_rendered_from_their_sources() -> None:
    """Each ``docs/diagrams/*.mmd`` has an SVG rendered from its current text."""
    render = _render_diagrams()
    sources = sorted((ROOT / "docs" / "diagrams").glob("*.mmd"))
    assert len(sources) == 5
    assert render.stale() == [], "run: python docs/render_diagrams.py (see its docstring)"


def test_diagram_labels_are_svg_text() -> None:
    """No label is HTML in a ``<foreignObject>``: its box is as wide as the renderer's
    fonts measured it, so a wider fallback font (DejaVu Sans) would clip the label."""
    for svg in sorted((ROOT / "docs" / "diagrams").glob("*.svg")):
        assert "<foreignObject" not in svg.read_text(encoding="utf-8"), svg


def test_diagram_sources_are_not_mermaid_fences() -> None:
    """No page has a Mermaid fence: the theme would load Mermaid from a CDN to draw it."""
    for page in sorted((ROOT / "docs").rglob("*.md")):
        assert "```mermaid" not in page.read_text(encoding="utf-8"), page


def test_the_docs_index_links_every_page_and_tells_how_the_diagrams_draw() -> None:
    """The home page's list links every page of the site's menu (it had left out "Run a
    service"), and what it says of the diagrams is how they draw: SVG images rendered by
    ``docs/render_diagrams.py``, not Mermaid loaded from unpkg (as it said after they
    became images)."""
    menu = (ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:\n")[1]
    menu = menu.split("\n\n")[0]
    pages = re.findall(r"^ {2,6}- (?:[^\n]*: )?(\S+\.md)$", menu, re.MULTILINE)
    pages = [page for page in pages if not page.startswith("reference/") and page != "index.md"]
    assert "howto-service.md" in pages
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert [page for page in pages if f"]({page})" not in index] == []
    assert "unpkg" not in index
    assert "docs/render_diagrams.py" in index


def test_diagrams_draw_with_nothing_from_outside(site: Path) -> None:
    """The diagrams are SVG images in the site itself, and the SVGs fetch nothing."""
    expected = {
        "concepts": ["task-states", "shutdown-timeline", "slot-states", "slot-line"],
        "howto-replicas": ["cluster-hand-over"],
    }
    for page, names in expected.items():
        html = (site / page / "index.html").read_text(encoding="utf-8")
        assert re.findall(r'<img alt="[^"]+" src="\.\./diagrams/([\w-]+)\.svg"', html) == names
    for svg in sorted((site / "diagrams").glob("*.svg")):
        text = svg.read_text(encoding="utf-8")
        assert text.count("<svg") >= 1
        assert not re.search(r"@import|url\(\s*['\"]?https?:|(?:xlink:)?href=\"https?:", text), svg
    assert len(list((site / "diagrams").glob("*.svg"))) == 5


def test_site_loads_no_script_or_style_from_outside(site: Path) -> None:
    """No page loads a script, a stylesheet or a font from another host.

    With no network (behind a firewall, an air-gapped mirror) the site looks the same:
    no Mermaid block for the theme to fetch Mermaid's JavaScript for, no font CDN.
    """
    external = re.compile(
        r"<script[^>]*\ssrc=\"(?:https?:)?//|<link[^>]*\shref=\"(?:https?:)?//", re.IGNORECASE
    )
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert not external.search(html), (page, external.search(html))
        assert 'class="mermaid"' not in html, page


def test_every_public_field_is_described(ext: Any) -> None:
    """Each field, attribute and enum member of a public class has a docstring.

    A docstring of a field is a string literal right after it; the reference shows it
    under the field, and the attrs ``__init__`` the extension builds carries it too.
    """
    import griffe

    package = griffe.load(
        "trio_taskvisor",
        search_paths=[str(ROOT)],
        extensions=griffe.load_extensions(ext.TaskvisorDocs),
    )
    modules = ["", "testing", "contrib.prometheus", "contrib.otel", "redis"]
    undescribed: list[str] = []
    for name in modules:
        if name and name not in package.members and name.split(".")[0] not in package.members:
            continue
        module = package[name] if name else package
        for export in module.exports or []:
            obj = module[export]
            cls = obj.final_target if obj.is_alias else obj
            if not cls.is_class:
                continue
            for member_name, member in cls.members.items():
                target = member.final_target if member.is_alias else member
                if not member_name.startswith("_") and target.is_attribute and not target.docstring:
                    undescribed.append(f"{export}.{member_name}")
    assert not undescribed, f"{len(undescribed)} undescribed: {' '.join(undescribed)}"


def _reference_pages(site: Path) -> list[Path]:
    pages = sorted((site / "reference").glob("*/index.html"))
    assert len(pages) == 10
    return pages


def test_reference_shows_no_internals(site: Path) -> None:
    """The API reference shows API only.

    No ``__slots__``, attrs hooks or undocumented dunders, no private name (a converter,
    a validator, a private constant or type in a signature, a private module), and no
    citation of a document the repository does not ship.
    """
    private = re.compile(r"(?<![\w.*])_[A-Za-z]\w*")
    for page in _reference_pages(site):
        html = page.read_text(encoding="utf-8")
        text = _text(page).replace("&quot;", '"').replace("&gt;", ">").replace("&lt;", "<")
        assert not re.findall(r'id="[\w.]*\.__\w+__"', html), page
        for internal in ["__slots__", "__attrs_post_init__", "attrs.field(", "converter="]:
            assert internal not in text, (page, internal)
        assert private.findall(text) == [], page
        assert not re.search(r"DESIGN|\bsection \d+", text), page


def test_reference_signatures_wrap(site: Path) -> None:
    """Signatures are formatted to 80 columns, one parameter a line when they are long.

    A line longer than that holds a string literal nothing can break.
    """
    wrapped = 0
    for page in _reference_pages(site):
        html = page.read_text(encoding="utf-8")
        for block in re.findall(
            r'<div class="doc-signature highlight"><pre>(.*?)</pre>', html, re.S
        ):
            lines = re.sub(r"<[^>]+>", "", block).replace("&quot;", '"').splitlines()
            wrapped += len(lines) > 2
            for line in lines:
                assert len(line) <= 80 or line.count('"') >= 2, (page, line)
    assert wrapped > 20


def test_docs_extra_has_a_signature_formatter() -> None:
    """mkdocstrings wraps signatures only with Black or Ruff installed: the extra has Ruff."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    docs = project["optional-dependencies"]["docs"]
    assert any(re.match(r"(ruff|black)\b", requirement) for requirement in docs), docs


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = find_chromium()
    if executable is None:
        pytest.fail(
            "chromium is not installed: these tests open the site (apt-get install chromium)"
        )
    with chromium(executable) as tab:
        yield tab


def _pages(site: Path) -> list[tuple[str, str]]:
    pages = sorted(site.rglob("index.html"))
    assert len(pages) == len(list((ROOT / "docs").rglob("*.md")))
    return [(str(page.parent.relative_to(site)), page.as_uri()) for page in pages]


# The code blocks whose code is wider than their box: the theme's block is a <pre>
# whose <code> scrolls; [the block's first line, the code's width, the box's width].
_SCROLLING_CODE = """[...document.querySelectorAll('pre')].flatMap((pre) => {
  const box = pre.querySelector(':scope > code') || pre;
  const first = pre.textContent.split('\\n').find((line) => line.trim()) || '';
  return [box, pre].some((e) => e.scrollWidth > e.clientWidth)
    ? [[first, box.scrollWidth, box.clientWidth]] : [];
})"""


# The widths a tablet's or a small laptop's window may have: tablets upright (768, 800,
# 810, 820 and 834 px), each side of 850 px (below it code blocks run to the screen's
# edges, as the theme lays them out on a phone) and of the theme's 960 px breakpoint
# (the table of contents could have a column from there; it has one from 1020 px), and
# windows between that and 1020 px.
TABLET_WIDTHS = [768, 800, 810, 820, 834, 849, 850, 900, 959, 960, 980, 1000, 1015, 1019]

# The widths a desktop or tablet reader's window may have: from 1020 px, where the table
# of contents gets its own column beside room for 100 columns of code, past an iPad's
# 1024, 1080 and 1194 px; every 5 px across the theme's 1220 px breakpoint (the
# navigation gets a column too, and the sidebars narrow until about 1340 px); then common
# screens up to 1920 px.
DESKTOP_WIDTHS = [1020, 1024, 1080, 1100, 1180, 1194, 1219, *range(1220, 1295, 5)]
DESKTOP_WIDTHS += [1300, 1340, 1366, 1400, 1439, 1440, 1536, 1600, 1920]

WIDTHS = TABLET_WIDTHS + DESKTOP_WIDTHS

# The names in a sidebar that do not fit it: [the name, its width, the room it has].
_CUT_NAMES = """[...document.querySelectorAll('.md-sidebar .md-nav__link .md-ellipsis')]
  .filter((e) => e.offsetParent && e.scrollWidth > e.clientWidth)
  .map((e) => [e.textContent.trim(), e.scrollWidth, e.clientWidth])"""


@pytest.fixture(scope="module")
def windows(site: Path, browser: Browser) -> dict[int, dict[str, list[Any]]]:
    """Every page at each of ``WIDTHS`` (800 px high): its code blocks that scroll
    sideways and its sidebar names that do not fit, by width.

    Each page is opened once and the screen resized through the widths, as a reader
    resizes a window: the page lays out again for each (the same numbers as opening it
    anew, a page at a time, which takes four times as long).
    """
    found: dict[int, dict[str, list[Any]]] = {width: {"code": [], "names": []} for width in WIDTHS}
    blocks = 0
    for name, url in _pages(site):
        browser.open(url, WIDTHS[0], 800)
        blocks += browser.evaluate("document.querySelectorAll('pre > code').length")
        for width in WIDTHS:
            browser.resize(width, 800)
            assert browser.evaluate("window.innerWidth") == width
            found[width]["code"] += [(name, *b) for b in browser.evaluate(_SCROLLING_CODE)]
            found[width]["names"] += [(name, *n) for n in browser.evaluate(_CUT_NAMES)]
    assert blocks > 400
    return found


def test_no_code_block_scrolls_sideways_from_768_px(
    windows: dict[int, dict[str, list[Any]]],
) -> None:
    """From 768 to 1920 px wide every code block shows its lines whole.

    The code here is written up to 100 columns (ruff's line-length), and the theme's
    column held about 80 of them: 90 blocks on 17 pages scrolled sideways at 1280 px,
    the text diagrams of the nursery tree cut at the right edge. ``docs/stylesheets/
    code-width.css`` makes room for 100; a longer line must be wrapped. With sidebars
    of a fixed width, lines of 96 to 100 columns still scrolled from 1220 px (where the
    sidebars narrow) to 1275 px, and on an iPad's 1024 px 31 blocks did; from 960 to
    1015 px (beside the table of contents) up to 30 blocks did, and on a tablet upright
    (768 to 834 px) up to 40. The page is measured in the browser (with a classic scroll
    bar, 15 px, as on Linux and Windows), in the system's monospace font, as a reader
    sees it.
    """
    scrolling = {width: found["code"] for width, found in windows.items() if found["code"]}
    assert scrolling == {}


def test_sidebar_names_are_not_cut(windows: dict[int, dict[str, list[Any]]]) -> None:
    """Every name in the navigation and the table of contents shows whole, at each width.

    The reference's table of contents lists long names (``subscriber_shutdown_timeout``)
    that the theme cut with an ellipsis; they wrap instead, in sidebars that are 185 px
    wide at 1220 px.
    """
    cut = {width: found["names"] for width, found in windows.items() if found["names"]}
    assert cut == {}


def test_nothing_is_cut_off_on_a_phone(site: Path, browser: Browser) -> None:
    """On a phone (360 to 414 px wide) no page is wider than the screen.

    A long code line scrolls inside its block there, by choice (see the end of
    ``docs/stylesheets/code-width.css``): a 360 px phone shows 42 columns of code, and
    wrapped Python reads as dedented code and tears the text diagrams. The text, the
    tables and the diagrams stay within the page.
    """
    wide: list[tuple[str, int, int]] = []
    for name, url in _pages(site):
        browser.open(url, 390, 844, mobile=True)
        for width, height in [(390, 844), (360, 740), (375, 667), (414, 896)]:
            browser.resize(width, height, mobile=True)
            page_width = browser.evaluate("document.documentElement.scrollWidth")
            if page_width > width:
                wide.append((name, width, page_width))
    assert wide == []
