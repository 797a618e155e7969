"""Read-through attributes: a run handle shows its position's counters under the same names (``run.turns``).

An agent shows its settings record's fields the same way (``agent.limits``);
a run handle's ids are made when first read (``MadeWhenRead``).
"""

from __future__ import annotations

import operator
import threading
import uuid
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class ReadThrough(Generic[T]):
    """A read-only attribute that reads the same name on the object's ``holder``: a run handle's ``position``.

    Declared name by name on the handle (``turns = ReadThrough[int]()``)
    rather than by a ``__getattr__``, which would slow down every attribute
    read of the driver's own hot loop and leave the type checker blind; an
    agent's read its ``settings`` (``limits = ReadThrough[Limits]("settings")``).
    ``record`` names the part of the holder the name lives in, when it is not
    the holder itself (a run's counters live in ``position.counts``).
    """

    def __init__(self, holder: str = "position", record: str = "") -> None:
        self._holder = f"{holder}.{record}" if record else holder

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name
        self._get = operator.attrgetter(f"{self._holder}.{name}")

    @overload
    def __get__(self, handle: None, owner: type) -> ReadThrough[T]: ...

    @overload
    def __get__(self, handle: Any, owner: type | None = None) -> T: ...

    def __get__(self, handle: Any | None, owner: type | None = None) -> T | ReadThrough[T]:
        if handle is None:
            return self
        return self._get(handle)  # type: ignore[no-any-return]  # the Run attribute of the declared type

    def __set__(self, handle: Any, value: object) -> None:
        msg = f"{self._name} is read-only: it is read from {self._holder}.{self._name}"
        raise AttributeError(msg)


class MadeWhenRead:
    """A run handle's id (``run_id``, ``start_id``): the one it was given, else a fresh random one made when first read.

    Most runs nobody stores or watches never need theirs, so none is made
    for them.  The handle keeps it in ``_<name>`` (its class says None).
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}"

    @overload
    def __get__(self, handle: None, owner: type) -> MadeWhenRead: ...

    @overload
    def __get__(self, handle: Any, owner: type | None = None) -> str: ...

    def __get__(self, handle: Any | None, owner: type | None = None) -> str | MadeWhenRead:
        if handle is None:
            return self
        made: str | None = getattr(handle, self._slot)
        if made is None:
            # A run's sync tools read it on worker threads at once (run_context()): one id is made, under a lock.
            with _MAKING:
                made = getattr(handle, self._slot)
                if made is None:
                    made = uuid.uuid4().hex
                    setattr(handle, self._slot, made)
        return made


_MAKING = threading.Lock()
