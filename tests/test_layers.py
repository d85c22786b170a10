"""The package's layers: every import points down.

The modules in ``ORDER`` are listed bottom up, layer by layer; each may import only
modules listed before it. The one upward edge allowed is the type-only annotation of the
public ``TaskContext.supervisor`` (``_context`` -> ``_supervisor``). Imports are read from
the source with ``ast`` (``TYPE_CHECKING`` and function-level imports included), so a new
module must be placed here, and an import that points up fails this test.
"""

from __future__ import annotations

import ast

import pytest

from helpers import ROOT

PACKAGE = ROOT / "trio_taskvisor"

ORDER = [
    # values: plain values, validators, pure maths
    "_outcome",
    "_exceptions",
    "_policies",
    "_slotstore",
    "_limits",
    "_config",
    "_frozen",
    "_spec",
    "_events",
    "_waiter",
    "_redis_scripts",
    "_waitfor",
    # state: what the loops share, and the pure slot machines
    "_inbox",
    "_record",
    "_context",
    "_bus",
    "_slots",
    "_clusterslots",
    "_pools",
    "_logging",
    # loops
    "_actor",
    "_registry",
    "_keeper",
    "_redis_client",
    "_waits",
    "_controller",
    "_shutdown",
    # facade: the composition root
    "_supervisor",
    # public
    "testing",
    "pytest_plugin",
    "redis",
    "contrib",
    "contrib.otel",
    "contrib.prometheus",
    "",  # the package itself: trio_taskvisor/__init__.py
    "_cli",
    "_cli.demo",
    "_cli.slots",
    "_cli.tour",
    "__main__",
]
ALLOWED_UPWARD = {("_context", "_supervisor")}


def module_name(path: object) -> str:
    relative = path.relative_to(PACKAGE).with_suffix("")  # type: ignore[attr-defined]
    parts = list(relative.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: object) -> set[str]:
    """The package modules that ``path`` imports (relative imports, any depth)."""
    name = module_name(path)
    is_package = path.name == "__init__.py"  # type: ignore[attr-defined]
    here = name.split(".") if name else []
    if not is_package:
        here = here[:-1]
    known = set(ORDER)
    found: set[str] = set()
    tree = ast.parse(path.read_text())  # type: ignore[attr-defined]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
            target = ".".join([*base, *([node.module] if node.module else [])])
            names = [f"{target}.{a.name}".lstrip(".") for a in node.names]
            # ``from . import _x`` imports the module _x; ``from ._x import y``, _x.
            candidates = (
                names
                if node.module is None and any(n in known for n in names)
                else [target, *names]
            )
            found.update(c for c in candidates if c in known and c != name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("trio_taskvisor"):
                    target = alias.name.removeprefix("trio_taskvisor").lstrip(".")
                    if target in known and target != name:
                        found.add(target)
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    """A new module is placed in ORDER (so its imports are checked)."""
    assert sorted(module_name(path) for path in MODULES) == sorted(ORDER)


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_imports_point_down(path: object) -> None:
    """Each module imports only modules below it."""
    name = module_name(path)
    rank = ORDER.index(name)
    upward = sorted(
        target
        for target in imports_of(path)
        if ORDER.index(target) >= rank and (name, target) not in ALLOWED_UPWARD
    )
    assert upward == [], f"{name or 'trio_taskvisor'} imports {upward}, which are above it"


CLIENT_LIBRARIES = ("coredis", "anyio")


def imported_top_level(path: object) -> set[str]:
    """The top-level names of every absolute import in ``path`` (any depth)."""
    tree = ast.parse(path.read_text())  # type: ignore[attr-defined]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.partition(".")[0])
    return found


def test_only_the_redis_adapter_imports_the_client_library() -> None:
    """coredis and anyio are imported by ``_redis_client`` alone."""
    importers = sorted(
        module_name(path) for path in MODULES if imported_top_level(path) & set(CLIENT_LIBRARIES)
    )
    assert importers == ["_redis_client"]


def test_the_keeper_imports_without_the_redis_extra() -> None:
    """The lease keeper's logic (and the cluster slot machine) import with coredis and
    anyio unimportable: only the adapter needs the ``redis`` extra."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['coredis'] = None\n"
        "sys.modules['anyio'] = None\n"
        "import trio_taskvisor._keeper, trio_taskvisor._clusterslots\n"
        "try:\n"
        "    import trio_taskvisor._redis_client\n"
        "except ImportError:\n"
        "    print('adapter needs coredis')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == "adapter needs coredis\n"
