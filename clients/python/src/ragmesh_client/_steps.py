"""How one method serves both clients: it is written once (``_operations.py``) as a generator
of the steps it takes (a ``Call`` to make, a ``Sleep``, an item to ``Emit``, a server ``Stream``
to pass on) that gets each step's outcome back, and each face only runs the steps: ``Client``
blocking, ``AsyncClient`` awaiting (``client.py``, ``aio.py``).

``operation`` and ``iterator`` turn such a generator into a method of each face, with the
signature and docstring it was written with and the face's return type: ``R`` or an awaitable
``R``, ``Iterator[Y]`` or ``AsyncIterator[Y]``. A face says which it is by deriving from
``Blocking`` or ``Awaiting``; type checkers see the precise types of both.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from ragmesh_client._calls import Call

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
Y = TypeVar("Y")


@dataclass(frozen=True)
class Sleep:
    """Pause for ``seconds``."""

    seconds: float


@dataclass(frozen=True)
class Emit(Generic[Y]):
    """Give ``item`` to the caller of an iterator."""

    item: Y


@dataclass(frozen=True)
class Stream(Generic[Y]):
    """Make a server-streaming call and give the caller each message ``call.read`` makes of it
    (messages it reads as None are skipped)."""

    call: Call[Y | None]


Step = Call[Any] | Sleep
# A method that returns an R: its steps, then R. Each Call's reply (as its ``read`` makes it) is
# sent back into the generator; a failed step raises its exception there.
Steps = Generator[Step, Any, R]
# A method that returns an iterator of Y.
Items = Generator[Step | Emit[Y] | Stream[Y], Any, None]


def run(call: Call[T]) -> Generator[Step, Any, T]:
    """``result = yield from run(call)``: the call's result, typed."""
    result: T = yield call
    return result


class Stepper(Generic[R]):
    """Walks a method's steps for a face: ``next`` gives the next step (None at the end, then
    ``result`` holds what the method returned); the face runs it and hands its outcome back with
    ``reply`` or ``fail``."""

    def __init__(self, steps: Generator[Any, Any, R]) -> None:
        self._steps = steps
        self._reply: Any = None
        self._error: Exception | None = None
        self.result: R

    def next(self) -> Any:
        try:
            if self._error is not None:
                error, self._error = self._error, None
                return self._steps.throw(error)
            reply, self._reply = self._reply, None
            return self._steps.send(reply)
        except StopIteration as done:
            self.result = done.value
            return None

    def reply(self, value: Any) -> None:
        self._reply = value

    def fail(self, error: Exception) -> None:
        self._error = error

    def close(self) -> None:
        self._steps.close()


class Blocking:
    """Base of a face whose methods block (``Client``): it has ``_complete(steps) -> R`` and
    ``_iterate(items) -> Iterator[Y]``."""


class Awaiting:
    """Base of a face whose methods are awaited (``AsyncClient``): ``async _complete(steps)`` and
    ``_iterate(items) -> AsyncIterator[Y]``."""


def _face_of(owner: type) -> type | None:
    """The face class (the one deriving directly from Blocking or Awaiting) of ``owner``; None
    for the class the methods are written in."""
    for cls in owner.__mro__:
        if Blocking in cls.__bases__ or Awaiting in cls.__bases__:
            return cls
    return None


_RETURN = re.compile(r"^(Steps|Items)\[(.+)\]$")


class _Method:
    """What ``operation`` and ``iterator`` share: one function per face class, made once."""

    returns = ""  # Steps or Items

    def __init__(self, steps: Callable[..., Any]) -> None:
        self.steps = steps
        self._functions: dict[type, Callable[..., Any]] = {}
        self.__doc__ = steps.__doc__
        match = _RETURN.match(str(steps.__annotations__.get("return", "")))
        if match is None or match.group(1) != self.returns:
            # (The module writing the methods uses ``from __future__ import annotations``.)
            raise TypeError(f"{steps.__qualname__} must be annotated -> {self.returns}[...]")
        self._result = match.group(2)

    def _make(self, awaiting: bool) -> Callable[..., Any]:
        raise NotImplementedError

    def _returns(self, awaiting: bool) -> tuple[str, Any]:
        """The face's return annotation, as its signature shows it and as a type hint."""
        raise NotImplementedError

    def _function(self, face: type) -> Callable[..., Any]:
        function = self._functions.get(face)
        if function is None:
            awaiting = issubclass(face, Awaiting)
            function = self._make(awaiting)
            functools.update_wrapper(function, self.steps)
            function.__qualname__ = f"{face.__qualname__}.{self.steps.__name__}"
            function.__module__ = face.__module__
            shown, hint = self._returns(awaiting)
            # Hints resolve in the module the method is written in (``__wrapped__``).
            function.__annotations__ = {**self.steps.__annotations__, "return": hint}
            signature = inspect.signature(self.steps)
            first, *rest = signature.parameters.values()
            function.__signature__ = signature.replace(  # type: ignore[attr-defined]
                parameters=[first.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD), *rest],
                return_annotation=shown,
            )
            self._functions[face] = function
        return function

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        face = _face_of(owner if owner is not None else type(obj))
        if face is None:
            return self
        function = self._function(face)
        return function if obj is None else types.MethodType(function, obj)


class operation(_Method, Generic[P, R]):
    """A method that returns an ``R``, written as ``Steps[R]``."""

    returns = "Steps"

    def __init__(self, steps: Callable[Concatenate[Any, P], Steps[R]]) -> None:
        super().__init__(steps)

    def _make(self, awaiting: bool) -> Callable[..., Any]:
        steps = self.steps
        if awaiting:

            async def awaited(face: Any, /, *args: Any, **kwargs: Any) -> Any:
                return await face._complete(steps(face, *args, **kwargs))

            return awaited

        def blocking(face: Any, /, *args: Any, **kwargs: Any) -> Any:
            return face._complete(steps(face, *args, **kwargs))

        return blocking

    def _returns(self, awaiting: bool) -> tuple[str, Any]:
        return self._result, self._result

    @overload
    def __get__(self, obj: Blocking, owner: type | None = None) -> Callable[P, R]: ...
    @overload
    def __get__(self, obj: Awaiting, owner: type | None = None) -> Callable[P, Coroutine[Any, Any, R]]: ...
    @overload
    def __get__(self, obj: None, owner: type) -> Callable[..., Any]: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return super().__get__(obj, owner)


class iterator(_Method, Generic[P, Y]):
    """A method that returns an iterator of ``Y``, written as ``Items[Y]``: lazy, like a
    generator (nothing runs before the first item is asked for)."""

    returns = "Items"

    def __init__(self, steps: Callable[Concatenate[Any, P], Items[Y]]) -> None:
        super().__init__(steps)

    def _make(self, awaiting: bool) -> Callable[..., Any]:
        steps = self.steps
        if awaiting:

            async def async_items(face: Any, /, *args: Any, **kwargs: Any) -> Any:
                items = face._iterate(steps(face, *args, **kwargs))
                try:
                    async for item in items:
                        yield item
                finally:
                    await items.aclose()

            return async_items

        def blocking_items(face: Any, /, *args: Any, **kwargs: Any) -> Any:
            yield from face._iterate(steps(face, *args, **kwargs))

        return blocking_items

    def _returns(self, awaiting: bool) -> tuple[str, Any]:
        kind = AsyncIterator if awaiting else Iterator
        return f"{kind.__name__}[{self._result}]", kind[self._result]

    @overload
    def __get__(self, obj: Blocking, owner: type | None = None) -> Callable[P, Iterator[Y]]: ...
    @overload
    def __get__(self, obj: Awaiting, owner: type | None = None) -> Callable[P, AsyncIterator[Y]]: ...
    @overload
    def __get__(self, obj: None, owner: type) -> Callable[..., Any]: ...
    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return super().__get__(obj, owner)
