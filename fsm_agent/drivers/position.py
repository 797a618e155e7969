"""Read-through attributes: a run handle shows its position's counters under the same names (``run.turns``)."""

from __future__ import annotations

import operator
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class ReadThrough(Generic[T]):
    """A read-only attribute of a run handle that reads the same name on the handle's ``position`` (a ``Run``).

    Declared name by name on the handle (``turns = ReadThrough[int]()``)
    rather than by a ``__getattr__``, which would slow down every attribute
    read of the driver's own hot loop and leave the type checker blind.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._get = operator.attrgetter(f"position.{name}")

    @overload
    def __get__(self, handle: None, owner: type) -> ReadThrough[T]: ...

    @overload
    def __get__(self, handle: Any, owner: type | None = None) -> T: ...

    def __get__(self, handle: Any | None, owner: type | None = None) -> T | ReadThrough[T]:
        if handle is None:
            return self
        return self._get(handle)  # type: ignore[no-any-return]  # the Run attribute of the declared type
