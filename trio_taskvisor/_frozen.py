"""``trusted_constructor``: build attrs frozen slots values without their checked ``__init__``.

attrs' frozen ``__init__`` sets every field through ``object.__setattr__`` and runs the
converters and validators: about 1.3 us for a 20-field event. Values that the library
builds itself on hot paths (events: benchmark row 2; specs whose options are all
``INHERIT``: rows 4a and 5) already have checked fields, so they are built by a twin
class with the same ``__slots__`` and a plain ``__init__`` (ordinary slot stores), which
then becomes an instance of the real class by ``__class__`` assignment: CPython allows it
between classes of one memory layout. The result is indistinguishable from one built by
the real ``__init__``: same class, same frozen behaviour, same ``==`` and ``hash``.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, TypeVar, cast

import attrs

T = TypeVar("T")


def trusted_constructor(cls: type[T]) -> Callable[..., T]:
    """A constructor of the attrs slots class ``cls`` taking its fields in order.

    Fields are assigned as given: no converter, no validator, defaults only where the
    class has a plain (non-factory) default. For trusted input only.
    """
    fields = attrs.fields(cast("type[attrs.AttrsInstance]", cls))
    params: list[str] = []
    defaults: dict[str, object] = {}
    for field in fields:
        if field.default is attrs.NOTHING:
            params.append(field.name)
        else:
            assert not isinstance(field.default, attrs.Factory)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
            defaults[f"_d_{field.name}"] = field.default
            params.append(f"{field.name}=_d_{field.name}")
    body = "".join(f"    self.{field.name} = {field.name}\n" for field in fields)
    source = f"def __init__(self, {', '.join(params)}):\n{body}    self.__class__ = _cls\n"
    namespace: dict[str, Any] = {"_cls": cls, **defaults}
    exec(source, namespace)
    # The same bases (``Generic[T]`` included) and slots: the same memory layout. CPython
    # refuses the assignment when a ``__weakref__`` slot follows the fields, so the class
    # must be built with ``weakref_slot=False``.
    slots = cls.__slots__  # type: ignore[attr-defined]
    assert "__weakref__" not in slots, f"{cls.__name__} needs weakref_slot=False"
    bases = getattr(cls, "__orig_bases__", cls.__bases__)
    twin = types.new_class(
        f"_Trusted{cls.__name__}",
        bases,
        exec_body=lambda ns: ns.update(__slots__=slots, __init__=namespace["__init__"]),
    )
    return twin
