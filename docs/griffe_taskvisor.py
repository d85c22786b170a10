"""A griffe extension for the API reference: attrs signatures and reST-isms as Markdown.

mkdocstrings (python handler) reads the package's source with griffe and renders its
docstrings as Markdown. Two things it does not do by itself, done here when the
package is loaded (``mkdocs.yml`` lists this file under the handler's ``extensions``):

* **attrs classes get their ``__init__``.** attrs writes it at import time, so static
  analysis sees none. For a class decorated with ``attrs.frozen`` / ``define`` /
  ``mutable`` (or ``attr.s``), one is built from the annotated fields, in order, base
  classes' fields first: ``attrs.field(init=False)`` and ``ClassVar`` are left out, a
  leading underscore is dropped from the parameter name (as attrs does), ``alias=``,
  ``kw_only=`` (on the field or the decorator), ``default=`` and ``factory=`` are
  honoured. A field's docstring (a string literal right after it) describes it.
* **The docstrings' reST-isms become Markdown**: a paragraph ending in ``::`` and the
  indented block after it become a fenced ``text`` block; simple tables (rows between
  ``====  ====`` borders, a row with an empty first cell continuing the one above)
  become Markdown tables; definition lists (a line followed by lines indented under it,
  as in ``pytest_plugin``'s docstring) become Markdown definition lists; a title
  underlined with ``---`` or ``===`` becomes a bold line (headings inside a docstring
  would clutter the page's table of contents). Double backticks are already Markdown.

* **Internals stay out of the reference**: ``__slots__``, ``__attrs_post_init__`` and
  the dunder methods without a docstring of their own (``__repr__``, ``__str__``) are
  left out; an attrs field shows its default (``url: str``, not
  ``url: str = attrs.field(converter=_check_url)``); a private constant used as a
  default shows its value (``max: float = 30.0``, not ``= _DEFAULT_MAX``); a private
  type in an annotation's union is dropped (``restart: RestartPolicy = INHERIT``: the
  default names the sentinel). ``tests/test_docs_site.py`` checks the built pages for
  private names.

So the docstrings stay plain, readable reST-flavoured text in the source, and the site
renders them. Nothing here imports the package.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

_ATTRS_DECORATORS = {
    "attrs.frozen",
    "attrs.define",
    "attrs.mutable",
    "attr.s",
    "attr.attrs",
    "attr.frozen",
    "attr.define",
    "attr.mutable",
}
_BORDER = re.compile(r"^ *=+( +=+)+ *$")
_UNDERLINE = re.compile(r"^(-{3,}|={3,}|~{3,})$")


class TaskvisorDocs(griffe.Extension):
    """Synthesize attrs ``__init__`` methods and translate docstrings to Markdown."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        _walk(pkg, set())
        # A second pass: the first reads the attrs field calls of base classes.
        _hide_internals(pkg, set())


def _walk(obj: griffe.Object, seen: set[str]) -> None:
    if obj.path in seen:
        return
    seen.add(obj.path)
    if obj.docstring is not None:
        obj.docstring.value = rst_to_markdown(obj.docstring.value)
    if isinstance(obj, griffe.Class):
        _add_attrs_init(obj)
    if isinstance(obj, griffe.Function):
        _context_manager_returns(obj)
    if isinstance(obj, griffe.Attribute) and _echoes_a_parameter(obj):
        obj.value = None  # ``self.name = name`` in __init__: "name = name" says nothing
    for member in obj.members.values():
        if not member.is_alias:
            _walk(member, seen)  # type: ignore[arg-type]


# -- signatures -------------------------------------------------------------------------


def _context_manager_returns(func: griffe.Function) -> None:
    # An @asynccontextmanager function: show what callers get, not the generator.
    paths = {str(getattr(d.value, "canonical_path", d.value)) for d in func.decorators}
    if not paths & {"contextlib.asynccontextmanager", "contextlib.contextmanager"}:
        return
    returns = str(func.returns or "")
    match = re.fullmatch(
        r"(?:typing\.|collections\.abc\.)?(Async)?(?:Generator|Iterator)\[(.*?)(?:, .*)?\]", returns
    )
    if match is None:
        return
    manager = "AbstractAsyncContextManager" if match.group(1) else "AbstractContextManager"
    func.returns = f"{manager}[{match.group(2)}]"
    func.labels.discard("async")


def _echoes_a_parameter(attr: griffe.Attribute) -> bool:
    labels = attr.labels
    return (
        "instance-attribute" in labels
        and "class-attribute" not in labels
        and isinstance(attr.value, griffe.ExprName)
    )


# -- internals ----------------------------------------------------------------------------

# Members that are machinery, never API, whatever their docstring.
_MACHINERY = {
    "__slots__",
    "__attrs_post_init__",
    "__attrs_attrs__",
    "__match_args__",
    "__weakref__",
    "__dict__",
    "__annotations__",
    "__module__",
}
_FIELD_CALLS = {"attrs.field", "attr.ib", "attr.field"}
_PRIVATE = re.compile(r"(?<![\w.])_[A-Za-z]\w*")


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _hide_internals(obj: griffe.Object, seen: set[str]) -> None:
    if obj.path in seen:
        return
    seen.add(obj.path)
    if isinstance(obj, griffe.Class):
        for name, member in list(obj.members.items()):
            if name == "__init__":  # merged into the class's own signature
                continue
            undocumented = member.is_alias or not member.docstring
            if name in _MACHINERY or (_is_dunder(name) and undocumented):
                obj.del_member(name)
    if isinstance(obj, griffe.Attribute):
        obj.value = _public_value(_field_default(obj.value), obj)
        obj.annotation = _public_annotation(obj.annotation)
    if isinstance(obj, griffe.Function):
        for parameter in obj.parameters:
            parameter.annotation = _public_annotation(parameter.annotation)
            if parameter.default is not None:
                default = _public_value(parameter.default, obj)
                parameter.default = default if default is not None else "..."
        obj.returns = _public_annotation(obj.returns)
    for member in obj.members.values():
        if not member.is_alias:
            _hide_internals(member, seen)  # type: ignore[arg-type]


def _field_default(value: object) -> object:
    # ``x: int = attrs.field(default=3, validator=_check)`` shows as ``x: int = 3``.
    if not (isinstance(value, griffe.ExprCall) and value.function.canonical_path in _FIELD_CALLS):
        return value
    field = _call_kwargs(value)
    if "factory" in field:
        return f"{field['factory']}()"
    return field.get("default")


def _public_value(value: object, scope: griffe.Object) -> object:
    """Return ``value`` without private names: a private constant's value, or None."""
    if value is None or not _PRIVATE.search(str(value)):
        return value
    if isinstance(value, griffe.ExprName):
        try:
            target = scope.modules_collection[value.canonical_path]
        except (KeyError, ValueError):
            return None
        if isinstance(target, griffe.Attribute) and not _PRIVATE.search(str(target.value)):
            return target.value
    return None


def _public_annotation(annotation: object) -> object:
    """Drop the private names of a union (``RestartPolicy | _Inherit``)."""
    if annotation is None or not _PRIVATE.search(str(annotation)):
        return annotation
    if isinstance(annotation, griffe.ExprBinOp) and annotation.operator == "|":
        parts = [
            part
            for part in (_public_annotation(annotation.left), _public_annotation(annotation.right))
            if part is not None
        ]
        if len(parts) == 2:
            return griffe.ExprBinOp(parts[0], "|", parts[1])
        return parts[0] if parts else None
    if isinstance(annotation, griffe.ExprName) and _PRIVATE.fullmatch(annotation.name):
        return None
    if isinstance(annotation, griffe.ExprSubscript):
        annotation.slice = _public_annotation(annotation.slice) or annotation.slice
    return annotation


# -- attrs --------------------------------------------------------------------------------


def _attrs_decorator(cls: griffe.Class) -> griffe.Decorator | None:
    for decorator in cls.decorators:
        value = decorator.value
        if isinstance(value, griffe.ExprCall):
            value = value.function
        path = value.canonical_path if isinstance(value, griffe.Expr) else str(value)
        if path in _ATTRS_DECORATORS:
            return decorator
    return None


def _call_kwargs(expr: object) -> dict[str, Any]:
    if not isinstance(expr, griffe.ExprCall):
        return {}
    return {
        argument.name: argument.value
        for argument in expr.arguments
        if isinstance(argument, griffe.ExprKeyword)
    }


def _is_true(value: object) -> bool:
    return str(value) == "True"


def _attrs_parameters(cls: griffe.Class) -> list[griffe.Parameter] | None:
    decorator = _attrs_decorator(cls)
    if decorator is None:
        return None
    class_kw_only = _is_true(_call_kwargs(decorator.value).get("kw_only"))
    parameters: list[griffe.Parameter] = []
    for base in reversed(cls.resolved_bases):
        if isinstance(base, griffe.Class) and (inherited := _attrs_parameters(base)):
            names = {p.name for p in parameters}
            parameters += [p for p in inherited if p.name not in names]
    for member in cls.members.values():
        if member.is_alias or not isinstance(member, griffe.Attribute):
            continue
        # griffe labels a ClassVar "class-attribute" only, an annotated field both.
        if member.annotation is None or "instance-attribute" not in member.labels:
            continue
        value: object = member.value
        field = {}
        if isinstance(value, griffe.ExprCall) and value.function.canonical_path in {
            "attrs.field",
            "attr.ib",
            "attr.field",
        }:
            field = _call_kwargs(value)
            value = field.get("default")
            if "factory" in field:
                value = f"{field['factory']}()"
        if "init" in field and not _is_true(field["init"]):
            continue
        name = str(field.get("alias", "")).strip("'\"") or member.name.lstrip("_")
        kw_only = class_kw_only or _is_true(field.get("kw_only"))
        kind = (
            griffe.ParameterKind.keyword_only
            if kw_only
            else griffe.ParameterKind.positional_or_keyword
        )
        parameters = [p for p in parameters if p.name != name]
        parameters.append(
            griffe.Parameter(
                name,
                annotation=member.annotation,
                kind=kind,
                default=None if value is None else value,
                docstring=member.docstring,
            )
        )
    return parameters


def _add_attrs_init(cls: griffe.Class) -> None:
    if "__init__" in cls.members:
        return
    parameters = _attrs_parameters(cls)
    if parameters is None:
        return
    init = griffe.Function(
        "__init__",
        lineno=cls.lineno,
        endlineno=cls.lineno,
        parameters=griffe.Parameters(
            griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword),
            *parameters,
        ),
        returns="None",
    )
    cls.set_member("__init__", init)
    fields = {p.name for p in parameters}
    for member in cls.members.values():  # attrs fields are instance attributes
        if not member.is_alias and member.name.lstrip("_") in fields:
            member.labels.discard("class-attribute")
            member.labels.add("instance-attribute")


# -- reST-isms ----------------------------------------------------------------------------


def rst_to_markdown(text: str) -> str:
    """Translate the reST constructs the package's docstrings use into Markdown."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):  # already Markdown: copy the fence as it is
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), i)
            out += lines[i : end + 1]
            i = end + 1
            continue
        if line.rstrip().endswith("::"):
            i = _literal_block(lines, i, out)
            continue
        if _BORDER.match(line):
            i = _table(lines, i, out)
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() and _UNDERLINE.match(nxt.strip()) and len(nxt.strip()) >= len(line.strip()):
            out += [f"**{line.strip()}**", ""]
            i += 2
            continue
        if _is_definition(lines, i):
            i = _definition(lines, i, out)
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def _literal_block(lines: list[str], i: int, out: list[str]) -> int:
    intro = lines[i].rstrip()
    intro = "" if intro.strip() == "::" else intro[:-3] if intro.endswith(" ::") else intro[:-1]
    if intro.strip():
        out.append(intro)
    indent = len(lines[i]) - len(lines[i].lstrip())
    j = i + 1
    block: list[str] = []
    while j < len(lines):
        candidate = lines[j]
        if candidate.strip() and len(candidate) - len(candidate.lstrip()) <= indent:
            break
        block.append(candidate)
        j += 1
    body = textwrap.dedent("\n".join(block)).strip("\n")
    prefix = " " * indent
    fence = [f"{prefix}```text", *(prefix + b if b else b for b in body.splitlines())]
    out += ["", *fence, f"{prefix}```", ""]
    return j


def _columns(border: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"=+", border)]


def _table(lines: list[str], i: int, out: list[str]) -> int:
    spans = _columns(lines[i])
    rows: list[list[str]] = []
    borders = 1
    header_rows = 0
    j = i + 1
    while j < len(lines):
        line = lines[j]
        if _BORDER.match(line):
            borders += 1
            j += 1
            if borders == 2:
                header_rows = len(rows)
            if borders == 3 or not (j < len(lines) and lines[j].strip()):
                break
            continue
        if not line.strip():
            break
        cells = []
        for k, (start, end) in enumerate(spans):
            stop = spans[k + 1][0] if k + 1 < len(spans) else max(len(line), end)
            cells.append(line[start:stop].strip())
        if rows and not cells[0]:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
        else:
            rows.append(cells)
        j += 1
    if borders < 3:  # two borders: a table without a header row
        header_rows = 0
    header = rows[0] if header_rows else [""] * len(spans)
    body = rows[1:] if header_rows else rows
    out.append("| " + " | ".join(header) + " |")
    out.append("|" + "---|" * len(spans))
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in body]
    out.append("")
    return j


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _is_definition(lines: list[str], i: int) -> bool:
    # A term: a non-blank line after a blank one (or a title), whose next line is
    # indented deeper, and which is not a list item or the end of a sentence.
    line = lines[i]
    if not line.strip() or i + 1 >= len(lines):
        return False
    nxt = lines[i + 1]
    if not nxt.strip() or _indent(nxt) <= _indent(line):
        return False
    if line.lstrip().startswith(("* ", "- ", "|")) or line.rstrip().endswith((".", ",", ":")):
        return False
    before = lines[i - 1] if i else ""
    return not before.strip() or bool(_UNDERLINE.match(before.strip())) or _indent(before) > 0


def _definition(lines: list[str], i: int, out: list[str]) -> int:
    term_indent = _indent(lines[i])
    out += ["", lines[i]]
    j = i + 1
    body: list[str] = []
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > term_indent):
        body.append(lines[j])
        j += 1
    while body and not body[-1].strip():
        body.pop()
    dedented = rst_to_markdown(textwrap.dedent("\n".join(body))).splitlines()
    prefix = " " * term_indent
    for k, text in enumerate(dedented):
        lead = ":   " if k == 0 else "    "
        out.append(f"{prefix}{lead}{text}" if text else "")
    out.append("")
    return j
