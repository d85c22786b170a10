"""Generate ``docs/api.md``, the API reference, from the package's docstrings.

Usage, from the repository root::

    python docs/gen_api.py           # rewrite docs/api.md
    python docs/gen_api.py --check   # exit 1 if docs/api.md is out of date

Every name in ``trio_taskvisor.__all__`` must be placed in exactly one of ``SECTIONS``:
the script fails otherwise, so a new export cannot go undocumented. Signatures come
from ``inspect`` (attrs classes: from their fields), prose from docstrings. Docstrings
of constants, enum members and class attributes (a string literal right after the
assignment) are read from the source with ``ast``, without importing anything else.
``ATTRIBUTES`` supplies one line for attributes that have no docstring to read
(exception fields, ``__slots__``, config fields); a docstring in the source wins.

``tests/test_docs.py`` checks that the committed file equals this script's output.
"""

from __future__ import annotations

import argparse
import ast
import enum
import importlib
import inspect
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "api.md"
WIDTH = 88  # signatures longer than this get one parameter per line

# (title, module, names, intro); the names are attributes of the module.
SECTIONS: list[tuple[str, str, list[str], str]] = [
    (
        "Running a supervisor",
        "trio_taskvisor",
        ["open_supervisor", "run", "Supervisor", "SupervisorConfig", "SupervisorStatistics"],
        "See the [tutorial](tutorial.md) and the [concepts](concepts.md).",
    ),
    (
        "Defining work",
        "trio_taskvisor",
        ["TaskSpec", "TaskDefaults", "INHERIT", "RestartPolicy", "BackoffPolicy", "Jitter"],
        "",
    ),
    ("Inside an attempt", "trio_taskvisor", ["current_context", "TaskContext"], ""),
    (
        "Identity and outcomes",
        "trio_taskvisor",
        [
            "TaskId",
            "TaskWaiter",
            "TaskOutcome",
            "OutcomeKind",
            "RejectionKind",
            "TaskInfo",
            "TaskState",
        ],
        "",
    ),
    (
        "Events",
        "trio_taskvisor",
        ["TaskEvent", "EventKind", "BackoffSource", "Subscriber", "LoggingSubscriber"],
        "Events are best-effort; see [outcomes vs events](concepts.md#outcomes-vs-events).",
    ),
    (
        "The controller",
        "trio_taskvisor",
        [
            "ControllerConfig",
            "ControllerSpec",
            "AdmissionPolicy",
            "PreparedSubmission",
            "ControllerSnapshot",
            "SlotView",
            "SlotStatus",
        ],
        "Installed with `SupervisorConfig(controller=ControllerConfig())`; see "
        "[slots and policies](concepts.md#slots-and-policies) and "
        "[budgets](concepts.md#budgets).",
    ),
    (
        "Errors",
        "trio_taskvisor",
        [
            "ConfigError",
            "TaskNameInUseError",
            "ResourceLimitError",
            "NoControllerError",
            "DeadlockError",
            "GraceExceededError",
            "OutcomeError",
            "FatalError",
            "TaskFailure",
            "TaskCancelled",
            "SupervisorClosedError",
        ],
        "",
    ),
    (
        "trio_taskvisor.testing",
        "trio_taskvisor.testing",
        ["EventRecorder"],
        "Helpers for tests of code that uses trio_taskvisor; see "
        "[testing with pytest-trio](howto-testing.md).",
    ),
]

# Attributes with no docstring to read: "Class.attribute": "one line of Markdown".
ATTRIBUTES: dict[str, str] = {
    "SupervisorConfig.grace": "Stop window after a stop request, for one task and for shutdown.",
    "SupervisorConfig.subscriber_shutdown_timeout": (
        "One shared deadline to drain subscriber queues at shutdown."
    ),
    "SupervisorConfig.max_concurrent": (
        "Global limit of running attempts (a FIFO `trio.CapacityLimiter`); `None`: no limit."
    ),
    "SupervisorConfig.max_registered_tasks": (
        "Registered, stopping and force-aborted-but-running tasks; `None`: no limit."
    ),
    "SupervisorConfig.command_capacity": "Size of the registry's bounded command channel.",
    "SupervisorConfig.bus_capacity": "Size of the bounded event bus channel.",
    "SupervisorConfig.task_defaults": "Values for `TaskSpec` options left as `INHERIT`.",
    "SupervisorConfig.controller": "A `ControllerConfig` installs the keyed controller.",
    "SupervisorConfig.random": "The jitter source; seed it for reproducible backoff.",
    "ControllerConfig.queue_capacity": "Size of the controller's bounded command channel.",
    "ControllerConfig.max_slot_queue": (
        "Queued entries per slot (the owner excluded); past it `QUEUE_FULL`."
    ),
    "ControllerConfig.max_total_pending": (
        "Queued entries across all slots; past it `RESOURCE_LIMIT`."
    ),
    "ControllerConfig.max_slots": "Tracked slots; a new slot past it gets `RESOURCE_LIMIT`.",
    "ControllerConfig.max_waiters": (
        "Held wait-mode submissions plus JOIN followers; past it `RESOURCE_LIMIT`."
    ),
    "SlotView.status": "The owner's stage; `None` if the slot has no owner.",
    "SlotView.owner_id": "The `TaskId` of the owner, or `None`.",
    "SlotView.queue_depth": "Queued entries, owner excluded, a replacement head included.",
    "SlotView.waiting": "Wait-mode submissions held for capacity.",
    "SlotView.status_for": "Seconds since the last status change.",
    "ControllerSnapshot.running_count": "Slots whose status is `RUNNING`.",
    "ControllerSnapshot.total_queued": "Queued entries across all slots (held work excluded).",
    "TaskWaiter.id": "The task's `TaskId`.",
    "TaskWaiter.name": "The task's name.",
    "TaskContext.supervisor": "The `Supervisor` running this attempt.",
    "PreparedSubmission.id": "The `TaskId` allocated for this submission.",
    "LoggingSubscriber.logger": "The `logging.Logger` records go to.",
    "LoggingSubscriber.name": 'The subscriber name, `"LoggingSubscriber"`.',
    "TaskNameInUseError.name": "The name that is in use.",
    "ResourceLimitError.resource": 'The limit that was reached, e.g. `"max_registered_tasks"`.',
    "ResourceLimitError.limit": "Its configured size.",
    "GraceExceededError.grace": "The grace window, in seconds.",
    "GraceExceededError.stuck": "Names of the tasks that had to be forced, sorted.",
    "OutcomeError.outcome": "The `TaskOutcome` that was not a success.",
    "FatalError.reason": "The reason given.",
    "FatalError.exit_code": "The exit code given, or `None`.",
    "TaskFailure.reason": "The reason given.",
    "TaskFailure.exit_code": "The exit code given, or `None`.",
    "TaskCancelled.reason": "The reason given, or `None`.",
    "EventRecorder.events": "Every event received, in delivery order.",
    "EventRecorder.name": "The subscriber name (for `subscriber_dropped` and events).",
    "EventRecorder.queue_capacity": "The capacity of its lane's queue.",
}

# Classes users receive but do not construct: no constructor signature.
NOT_CONSTRUCTED = {"Supervisor", "TaskContext", "TaskWaiter", "PreparedSubmission", "Subscriber"}

# How annotation texts read in the reference.
_ANNOTATION_ALIASES = [
    (re.compile(r"\b_Inherit\b"), "INHERIT"),
    (re.compile(r"\bTaskFn\b"), "Callable[..., Awaitable[Any]]"),
    (re.compile(r"\bbuiltins\."), ""),
]


class _Text:
    """An object whose repr is the given text, so ``inspect`` prints it verbatim."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


# -- signatures -------------------------------------------------------------------------


def _annotation_text(annotation: object) -> str:
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    for pattern, replacement in _ANNOTATION_ALIASES:
        text = pattern.sub(replacement, text)
    return text


def _default_text(value: object) -> str:
    if isinstance(value, enum.Enum) and type(value).__name__ != "_Inherit":
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, attrs.Factory):  # type: ignore[arg-type]
        factory = value.factory  # type: ignore[attr-defined]
        module = getattr(factory, "__module__", "")
        qualname = getattr(factory, "__qualname__", repr(factory))
        if module and module != "builtins" and not module.startswith("trio_taskvisor"):
            qualname = f"{module}.{qualname}"
        return f"{qualname}()"
    return repr(value)


def _param_texts(params: list[inspect.Parameter]) -> list[str]:
    """Parameter texts, with the ``/`` and ``*`` markers ``inspect`` would print."""
    texts: list[str] = []
    seen_positional_only = False
    seen_star = False
    for param in params:
        kind = param.kind
        if seen_positional_only and kind is not inspect.Parameter.POSITIONAL_ONLY:
            texts.append("/")
            seen_positional_only = False
        if kind is inspect.Parameter.POSITIONAL_ONLY:
            seen_positional_only = True
        if kind is inspect.Parameter.KEYWORD_ONLY and not seen_star:
            texts.append("*")
        if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.KEYWORD_ONLY):
            seen_star = True
        text = param.name
        if kind is inspect.Parameter.VAR_POSITIONAL:
            text = "*" + text
        elif kind is inspect.Parameter.VAR_KEYWORD:
            text = "**" + text
        if param.annotation is not inspect.Parameter.empty:
            text += f": {_annotation_text(param.annotation)}"
            if param.default is not inspect.Parameter.empty:
                text += f" = {_default_text(param.default)}"
        elif param.default is not inspect.Parameter.empty:
            text += f"={_default_text(param.default)}"
        texts.append(text)
    if seen_positional_only:
        texts.append("/")
    return texts


def _format(head: str, params: list[str], returns: str | None, indent: str = "") -> str:
    tail = f" -> {returns}" if returns else ""
    one_line = f"{indent}{head}({', '.join(params)}){tail}"
    if len(one_line) <= WIDTH or not params:
        return one_line
    lines = [f"{indent}{head}("]
    lines += [f"{indent}    {p}," for p in params]
    lines.append(f"{indent}){tail}")
    return "\n".join(lines)


def _callable_params(obj: Callable[..., Any], *, drop_first: bool) -> tuple[list[str], str | None]:
    sig = inspect.signature(obj)
    params = list(sig.parameters.values())
    if drop_first and params and params[0].name in ("self", "cls"):
        params = params[1:]
    returns: str | None = None
    if sig.return_annotation is not inspect.Signature.empty:
        returns = _annotation_text(sig.return_annotation)
    wrapped = getattr(obj, "__wrapped__", None)
    if returns is not None and wrapped is not None and inspect.isasyncgenfunction(wrapped):
        # An @asynccontextmanager: show what callers get, not the generator.
        returns = re.sub(r"^AsyncGenerator\[(.*)\]$", r"AsyncContextManager[\1]", returns)
    return _param_texts(params), returns


def _attrs_params(cls: type) -> list[str]:
    params: list[inspect.Parameter] = []
    for field in attrs.fields(cls):
        if not field.init:
            continue
        kind = (
            inspect.Parameter.KEYWORD_ONLY
            if field.kw_only
            else inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        default = inspect.Parameter.empty if field.default is attrs.NOTHING else field.default
        annotation = inspect.Parameter.empty if field.type is None else field.type
        params.append(
            inspect.Parameter(
                field.alias or field.name, kind, default=default, annotation=annotation
            )
        )
    return _param_texts(params)


# -- docstrings ---------------------------------------------------------------------------


def _rst_to_md(text: str) -> str:
    """Turn the reST-isms of the docstrings into Markdown: double backticks, ``::`` blocks."""
    text = re.sub(r"``(.+?)``", r"`\1`", text)
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        if not line.endswith("::"):
            out.append(line)
            continue
        intro = line[:-3] if line.endswith(" ::") else line[:-1]
        if intro.strip():
            out.append(intro)
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
            block.append(lines[i])
            i += 1
        body = textwrap.dedent("\n".join(block)).strip("\n")
        out += ["", "```text", *body.splitlines(), "```", ""]
    return "\n".join(out).strip()


def _doc(obj: object) -> str:
    return _rst_to_md(inspect.getdoc(obj) or "")


def _source_attribute_docs(source: str) -> dict[str, str]:
    """Docstrings of assignments in ``source``: {"NAME" or "Class.NAME": doc}."""
    docs: dict[str, str] = {}

    def scan(body: list[ast.stmt], prefix: str) -> None:
        for stmt, nxt in zip(body, [*body[1:], None], strict=True):
            if isinstance(stmt, ast.ClassDef):
                scan(stmt.body, f"{prefix}{stmt.name}.")
                continue
            target: ast.expr | None = None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
            elif isinstance(stmt, ast.AnnAssign):
                target = stmt.target
            if (
                isinstance(target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[prefix + target.id] = _rst_to_md(inspect.cleandoc(nxt.value.value))

    scan(ast.parse(source).body, "")
    return docs


def _package_attribute_docs() -> dict[str, str]:
    """``ATTRIBUTES``, overridden by assignment docstrings of every package module."""
    docs = dict(ATTRIBUTES)
    package = importlib.import_module("trio_taskvisor")
    package_dir = Path(package.__file__ or "").parent  # the code being documented
    for path in sorted(package_dir.glob("*.py")):
        docs.update(_source_attribute_docs(path.read_text(encoding="utf-8")))
    return docs


# -- rendering ----------------------------------------------------------------------------


def _code(text: str) -> list[str]:
    return ["```python", text, "```", ""]


def _prose(text: str) -> list[str]:
    return [text, ""] if text else []


def _base_names(cls: type) -> list[str]:
    names = []
    for base in cls.__bases__:
        if base is object or base.__name__ == "Protocol":
            continue
        module = base.__module__
        if module == "builtins" or module.startswith("trio_taskvisor"):
            names.append(base.__name__)
        elif module == "enum":
            names.append(f"enum.{base.__name__}")
        else:
            names.append(f"{module.split('.')[0]}.{base.__name__}")
    return names


def _class_header(name: str, cls: type) -> str:
    bases = _base_names(cls)
    params: list[str] | None = None
    if name not in NOT_CONSTRUCTED and not issubclass(cls, enum.Enum):
        if attrs.has(cls):
            params = _attrs_params(cls)
        else:
            try:
                params, _ = _callable_params(cls, drop_first=False)
            except ValueError:  # a builtin base without a signature: TaskId(int)
                params = None
    if bases:
        header = f"class {name}({', '.join(bases)})"
        if params is not None and "__init__" in vars(cls):
            header += ":\n" + _format("def __init__", ["self", *params], None, indent="    ")
        return header
    if params is None:
        return f"class {name}"
    return _format(f"class {name}", params, None)


def _render_class(name: str, cls: type, attr_docs: dict[str, str]) -> list[str]:
    out = _code(_class_header(name, cls)) + _prose(_doc(cls))
    if issubclass(cls, enum.Enum):
        for member in cls:
            doc = attr_docs.get(f"{cls.__name__}.{member.name}")
            line = f"* `{member.name}` (`{member.value!r}`)"
            out.append(f"{line}: {doc}" if doc else line)
        return [*out, ""]
    listed: set[str] = set()
    if attrs.has(cls):
        for field in attrs.fields(cls):
            listed.add(field.name)
            doc = attr_docs.get(f"{name}.{field.name}")
            line = f"* `{field.name}: {_annotation_text(field.type)}`"
            out.append(f"{line}: {doc}" if doc else line)
        out.append("")
    members = {k: v for k, v in vars(cls).items() if not k.startswith("_")}
    extra: list[tuple[str, str]] = []
    for key, doc in attr_docs.items():
        owner, _, attribute = key.partition(".")
        if owner != name or not attribute or attribute in listed:
            continue
        if attribute in members and not _is_plain_attribute(members[attribute]):
            continue  # a method or property: rendered with its own docstring below
        extra.append((attribute, doc))
    for attribute, doc in extra:
        listed.add(attribute)
        out.append(f"* `{attribute}`: {doc}")
    if extra:
        out.append("")
    for member_name, value in members.items():
        if member_name not in listed:
            out += _render_member(name, member_name, value)
    return out


def _is_plain_attribute(value: object) -> bool:
    return not (
        inspect.isfunction(value) or isinstance(value, property | classmethod | staticmethod)
    )


def _render_member(owner: str, name: str, value: object) -> list[str]:
    title = [f"#### `{owner}.{name}`", ""]
    if isinstance(value, property):
        returns = None
        if value.fget is not None:
            annotation = inspect.signature(value.fget).return_annotation
            if annotation is not inspect.Signature.empty:
                returns = _annotation_text(annotation)
        text = f"{name}: {returns}" if returns else name
        return title + _code(f"@property\n{text}") + _prose(_doc(value))
    if isinstance(value, classmethod | staticmethod):
        func = value.__func__
        params, returns = _callable_params(func, drop_first=isinstance(value, classmethod))
        decorator = "@classmethod" if isinstance(value, classmethod) else "@staticmethod"
        return (
            title
            + _code(f"{decorator}\n" + _format(f"def {name}", params, returns))
            + _prose(_doc(func))
        )
    if inspect.isfunction(value):
        params, returns = _callable_params(value, drop_first=True)
        keyword = "async def" if inspect.iscoroutinefunction(value) else "def"
        wrapped = getattr(value, "__wrapped__", None)
        decorator = ""
        if wrapped is not None and inspect.isgeneratorfunction(wrapped):
            decorator = "@contextmanager\n"
            returns = re.sub(r"^Generator\[(.*)\]$", r"ContextManager[\1]", returns or "")
        return (
            title
            + _code(decorator + _format(f"{keyword} {name}", params, returns))
            + _prose(_doc(value))
        )
    return []  # class constants with a docstring are listed by _render_class


def _render_function(name: str, fn: Callable[..., Any]) -> list[str]:
    params, returns = _callable_params(fn, drop_first=False)
    keyword = "async def" if inspect.iscoroutinefunction(fn) else "def"
    return _code(_format(f"{keyword} {name}", params, returns)) + _prose(_doc(fn))


def _anchor(title: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def generate() -> str:
    """Return the text of ``docs/api.md``."""
    package = importlib.import_module("trio_taskvisor")
    placed = [n for _, module, names, _ in SECTIONS if module == "trio_taskvisor" for n in names]
    missing = sorted(set(package.__all__) - set(placed))
    unknown = sorted(set(placed) - set(package.__all__))
    repeated = sorted({n for n in placed if placed.count(n) > 1})
    if missing or unknown or repeated:
        raise SystemExit(
            "gen_api.py: SECTIONS is out of step with trio_taskvisor.__all__: "
            f"missing {missing}, unknown {unknown}, repeated {repeated}"
        )
    attr_docs = _package_attribute_docs()
    out = [
        "# API reference",
        "",
        "<!-- Generated by docs/gen_api.py from the docstrings; do not edit by hand. -->",
        "",
        "Everything below is importable from `trio_taskvisor` (or from the module a section",
        "names); everything else is private. Durations are seconds (`float`) on trio's clock.",
        "Every `async` function and method is a checkpoint.",
        "",
    ]
    for title, _, names, _ in SECTIONS:
        links = ", ".join(f"[`{n}`](#{_anchor(n)})" for n in names)
        out.append(f"* [{title}](#{_anchor(title)}): {links}")
    out.append("")
    for title, module_name, names, intro in SECTIONS:
        module = importlib.import_module(module_name)
        out += [f"## {title}", "", *_prose(intro)]
        for name in names:
            obj = getattr(module, name)
            out += [f"### {name}", ""]
            if inspect.isclass(obj):
                out += _render_class(name, obj, attr_docs)
            elif inspect.isfunction(obj):
                out += _render_function(name, obj)
            else:
                out += _code(f"{name}: Final") + _prose(attr_docs.get(name, ""))
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description="Generate docs/api.md from the docstrings.")
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale")
    args = parser.parse_args()
    text = generate()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print("docs/api.md is out of date: run python docs/gen_api.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
