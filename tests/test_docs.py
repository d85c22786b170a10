"""The documentation is executable: README.md and docs/*.md run as written.

Every fenced ``python`` block of a file runs in order in one namespace, so a block can
use what earlier blocks of the same file defined. A block with top-level ``await``,
``async with`` or ``async for`` is compiled as a coroutine (``PyCF_ALLOW_TOP_LEVEL_AWAIT``,
its assignments land in the shared namespace) and run by ``trio.run`` on
``MockClock(autojump_threshold=0)``, so its sleeps, backoffs and grace windows take no
real time. Blocks that call ``trio.run`` themselves get the same clock.

After its blocks ran, the ``async def test_*`` functions a file defined are run too.
If they ask for no fixture but ``autojump_clock``, each runs here on its own autojump
clock. If they use other fixtures (the plugin's ``supervisor``, ``event_recorder``,
markers), the file's blocks are written out as one test module and run by pytest in a
subprocess, with ``trio_mode = true`` and this project's strictness, and every test in
it must pass; such a file must not use top-level ``await``.

Blocks that import an optional dependency which is not installed (``prometheus_client``,
``opentelemetry``) skip their file.

A block opts out of running with ``<!-- skip-test: reason -->`` on the line before its
fence; it is still compiled, so its syntax is checked. Tracebacks point at the Markdown
file and line. ``docs/api.md`` is generated: its blocks are signatures, not programs;
the tests at the end check that it is up to date and complete instead.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import inspect
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import trio_taskvisor

from helpers import ROOT

DOCS = ROOT / "docs"
API_REFERENCE = DOCS / "api.md"  # generated; its signature blocks are not runnable
DOC_FILES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
RUNNABLE_FILES = [f for f in DOC_FILES if f != API_REFERENCE]

OPTIONAL_MODULES = {"prometheus_client", "opentelemetry"}
AUTOJUMP_ONLY = {"autojump_clock"}

pytest_plugins = ["pytester"]

_FENCE_OPEN = re.compile(r"^```(\S*)\s*$")
_SKIP = re.compile(r"^<!--\s*skip-test(?::\s*(?P<reason>.*?))?\s*-->\s*$")
_trio_run = trio.run  # the real one: blocks see a patched trio.run


@attrs.frozen
class Block:
    path: Path
    line: int  # 1-based line of the first code line
    code: str
    skip: str | None  # the reason, when marked skip-test

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def extract_blocks(path: Path) -> list[Block]:
    """The fenced ``python`` blocks of ``path``, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE_OPEN.match(lines[i])
        if match is None:
            i += 1
            continue
        language = match.group(1)
        start = i + 1
        end = start
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if end == len(lines):
            raise AssertionError(f"{path.relative_to(ROOT)}:{i + 1}: unclosed code fence")
        if language == "python":
            skip_match = _SKIP.match(lines[i - 1]) if i > 0 else None
            skip = None
            if skip_match is not None:
                skip = skip_match.group("reason") or "marked skip-test"
            blocks.append(Block(path, start + 1, "\n".join(lines[start:end]) + "\n", skip))
        i = end + 1
    return blocks


def _compile(block: Block) -> Any:
    # Leading newlines make tracebacks and SyntaxErrors name the Markdown line.
    source = "\n" * (block.line - 1) + block.code
    return compile(
        source,
        str(block.path),
        "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
        dont_inherit=True,
    )


def _autojump_run(
    real_run: Callable[..., Any],
) -> Callable[..., Any]:
    def run(async_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("clock", trio.testing.MockClock(autojump_threshold=0))
        return real_run(async_fn, *args, **kwargs)

    return run


def run_blocks(blocks: list[Block], namespace: dict[str, Any]) -> None:
    """Run ``blocks`` in order in ``namespace``."""
    for block in blocks:
        code = _compile(block)
        if block.skip is not None:
            continue
        if code.co_flags & inspect.CO_COROUTINE:

            async def main(code: Any = code) -> None:
                await eval(code, namespace)

            _trio_run(main, clock=trio.testing.MockClock(autojump_threshold=0))
        else:
            exec(code, namespace)


def declared_tests(blocks: list[Block]) -> dict[str, set[str]]:
    """The top-level ``async def test_*`` functions of ``blocks``: {name: parameters}."""
    tests: dict[str, set[str]] = {}
    for block in blocks:
        if block.skip is not None:
            continue
        tree = compile(
            block.code,
            str(block.path),
            "exec",
            flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
            dont_inherit=True,
        )
        for node in tree.body:
            if isinstance(node, ast.AsyncFunctionDef) and node.name.startswith("test_"):
                args = node.args
                tests[node.name] = {a.arg for a in [*args.posonlyargs, *args.args]}
    return tests


def _run_directly(namespace: dict[str, Any], tests: dict[str, set[str]]) -> None:
    """Run fixture-free doc tests (``autojump_clock`` at most), each on its own clock."""
    for name, params in tests.items():
        clock = trio.testing.MockClock(autojump_threshold=0)
        kwargs = {"autojump_clock": clock} if params else {}
        _trio_run(lambda fn=namespace[name], kwargs=kwargs: fn(**kwargs), clock=clock)


def _run_with_pytest(
    blocks: list[Block], tests: dict[str, set[str]], pytester: pytest.Pytester
) -> None:
    """Run the blocks as one pytest module, with the plugin; every test must pass."""
    for block in blocks:
        code = _compile(block)  # syntax check of every block, skipped ones included
        assert not code.co_flags & inspect.CO_COROUTINE, (
            f"{block.where}: a page of pytest tests cannot use top-level await"
        )
    # Each block at its own line, so line numbers in failures are those of the page.
    source = ""
    for block in blocks:
        if block.skip is None:
            source += "\n" * (block.line - 1 - source.count("\n")) + block.code
    module = "test_" + re.sub(r"\W", "_", blocks[0].path.stem)
    pytester.makepyfile(**{module: source})
    pytester.makeini(
        "[pytest]\ntrio_mode = true\nfilterwarnings = error\naddopts = --strict-markers\n"
    )
    args = ["-p", "no:cacheprovider"]
    entry_points = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    if "trio_taskvisor.pytest_plugin" not in entry_points:
        args += ["-p", "trio_taskvisor.pytest_plugin"]  # a source checkout, not installed
    result = pytester.runpytest_subprocess(*args)
    outcomes = result.parseoutcomes()
    report = "\n".join(result.outlines)
    assert set(outcomes) == {"passed"}, report
    assert outcomes["passed"] >= len(tests), report


@pytest.mark.parametrize("path", RUNNABLE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(
    path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Every python block of the file runs, in order, in one namespace; so do its tests."""
    blocks = extract_blocks(path)
    tests = declared_tests(blocks)
    if any(params - AUTOJUMP_ONLY for params in tests.values()):
        pythonpath = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(pythonpath))
        # Requested only here: pytester changes the directory and restores sys.modules.
        _run_with_pytest(blocks, tests, request.getfixturevalue("pytester"))
        return
    monkeypatch.setattr(trio, "run", _autojump_run(_trio_run))
    namespace: dict[str, Any] = {"__name__": "__main__"}
    try:
        run_blocks(blocks, namespace)
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in OPTIONAL_MODULES:
            raise
        pytest.skip(f"{path.relative_to(ROOT)} needs {exc.name}, which is not installed")
    _run_directly(namespace, tests)


@pytest.mark.parametrize("path", RUNNABLE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_fence_is_collected(path: Path) -> None:
    """No ``python`` block escapes the runner (indented fences, ``py`` spelling)."""
    text = path.read_text(encoding="utf-8")
    fences = re.findall(r"^[ \t]*```(?:python|py|python3)\b", text, flags=re.MULTILINE)
    assert len(fences) == len(extract_blocks(path))


def test_skips_are_rare_and_explained() -> None:
    """A skipped block says why; at most a handful exist."""
    skipped = [b for f in RUNNABLE_FILES for b in extract_blocks(f) if b.skip is not None]
    for block in skipped:
        assert block.skip != "marked skip-test", f"{block.where}: give a reason"
    assert len(skipped) <= 8, [b.where for b in skipped]


def test_readme_links_every_doc_page() -> None:
    """Every page in docs/ is reachable from the README."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for page in sorted(DOCS.glob("*.md")):
        assert f"(docs/{page.name})" in readme, f"README.md does not link docs/{page.name}"


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    """Links to files and headings inside the repository point at something real."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        assert linked.exists(), f"{path.relative_to(ROOT)}: broken link {target}"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{path.relative_to(ROOT)}: broken anchor {target}"


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    headings = re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def _gen_api() -> Any:
    spec = importlib.util.spec_from_file_location("gen_api", DOCS / "gen_api.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_reference_is_up_to_date() -> None:
    """docs/api.md is what docs/gen_api.py generates now (rerun it after API changes)."""
    expected = _gen_api().generate()
    current = (DOCS / "api.md").read_text(encoding="utf-8")
    assert current == expected, "docs/api.md is stale: run python docs/gen_api.py"


def test_api_reference_covers_all() -> None:
    """Every name in trio_taskvisor.__all__ has its own entry in docs/api.md."""
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^### (\S+)$", text, flags=re.MULTILINE))
    missing = sorted(set(trio_taskvisor.__all__) - headings)
    assert not missing, f"docs/api.md has no entry for {missing}"
