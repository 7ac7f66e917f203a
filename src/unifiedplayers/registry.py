"""One registry for every extension point (methods, reward sources, trainer backends, rollout engines, perturbation
rules, benchmarks, the GRPO maths). :meth:`Registry.register` is the way in, usable as a decorator::

    METHODS = Registry("method")

    @METHODS.register("my_method")
    class MyMethod(Method): ...

    TRAINER_BACKENDS.register("deepspeed_zero2", "unifiedplayers.trainer.deepspeed_backend:DeepSpeedZero2Trainer")

- A name is registered once: a second, different object under it is refused, naming where the first is defined
  (the same definition registered again, by a re-import of its module, replaces the entry).
- A ``"module:attr"`` string is imported on first :meth:`Registry.get`, so a heavy dependency is imported only when
  a run names it. A miss raises :class:`UnknownName` naming the known entries.
- ``registry[name] = obj`` is ``register``; :meth:`Registry.replaced` swaps an entry for a ``with`` block (a test's
  stand-in).
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

_RAISE = object()


class UnknownName(KeyError, ValueError):
    """A name that is not registered (a ``KeyError`` for lookups, a ``ValueError`` for config checks)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DuplicateName(ValueError):
    """A second, different object registered under a name already taken."""


def import_object(path: str) -> Any:
    """The object named by ``"module:attr"`` or ``"module.attr"`` (imports the module)."""
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _where(frame: Any) -> str:
    return f"{_short(frame.f_code.co_filename)}:{frame.f_lineno}"


def _short(filename: str) -> str:
    parts = Path(filename).parts
    for anchor in ("src", "site-packages"):  # unifiedplayers/methods/base.py rather than the absolute path
        if anchor in parts:
            return str(Path(*parts[len(parts) - parts[::-1].index(anchor):]))
    return filename


def definition(obj: Any) -> Optional[str]:
    """Where ``obj`` (a function or a class, or an entry that wraps one in ``__wrapped__``) is defined:
    ``module.qualname (file:line)``; None for plain data."""
    obj = getattr(obj, "__wrapped__", obj)
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(qualname, str)):
        return None
    code = getattr(obj, "__code__", None)
    if code is not None:
        return f"{module}.{qualname} ({_short(code.co_filename)}:{code.co_firstlineno})"
    file = getattr(sys.modules.get(module), "__file__", None)  # a class: its module's file
    return f"{module}.{qualname} ({_short(file)})" if file else f"{module}.{qualname}"


class Registry(MutableMapping):
    """Named objects of one ``kind`` (see the module docstring). ``key``: the config key that names an entry
    (``trainer.backend``), used in the message of a miss; default, the kind."""

    def __init__(self, kind: str, key: Optional[str] = None) -> None:
        self.kind = kind
        self.key = key or kind
        self._entries: dict[str, Any] = {}
        self._origins: dict[str, tuple[str, Any]] = {}  # name -> (where it is defined, the registering namespace)

    # ------------------------------------------------------------------ the way in
    def register(self, name: str, obj: Any = None, *, stacklevel: int = 1) -> Any:
        """Register ``obj`` (or a ``"module:attr"`` string) under ``name``; without ``obj``, a decorator.
        ``stacklevel``: how many frames above the caller the registration is made (a helper such as
        ``register_method`` passes 2), for the place an error names when ``obj`` is plain data."""
        if obj is None:
            def deco(o: Any) -> Any:
                self._add(name, o, sys._getframe(1))
                return o

            return deco
        self._add(name, obj, sys._getframe(stacklevel))
        return obj

    def _add(self, name: str, obj: Any, frame: Any) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind} needs a non-empty name, not {name!r}")
        origin = f"loader {obj!r} ({_where(frame)})" if isinstance(obj, str) else (definition(obj) or _where(frame))
        if name in self._entries:
            old = self._entries[name]
            old_origin, old_module = self._origins[name]
            lazy_target = isinstance(old, str) and not isinstance(obj, str) and _names(obj, old)
            # The same definition run again by a new import of its module (a module's namespace is new each time).
            reimport = origin == old_origin and frame.f_globals is not old_module
            if not (obj is old or lazy_target or reimport):
                raise DuplicateName(
                    f"{self.kind} {name!r} is already registered, by {old_origin}; {origin} cannot "
                    f"register another one under that name (choose another name)")
        self._entries[name] = obj
        self._origins[name] = (origin, frame.f_globals)

    # ------------------------------------------------------------------ lookups
    def get(self, name: str, default: Any = _RAISE) -> Any:
        """The object registered as ``name`` (a ``"module:attr"`` entry is imported now, once). On a miss:
        ``default`` when given, else :class:`UnknownName` naming the known entries."""
        if name not in self._entries:
            if default is not _RAISE:
                return default
            raise UnknownName(f"unknown {self.key} {name!r}; known: {self.names()}")
        obj = self._entries[name]
        if isinstance(obj, str):
            resolved = import_object(obj)  # may register itself under `name`, replacing the string
            if self._entries.get(name) is obj:
                self._entries[name] = resolved
            obj = self._entries[name]
        return obj

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._entries)

    def origin(self, name: str) -> str:
        """Where the entry ``name`` was defined (or the loader string and where it was registered)."""
        return self._origins[name][0]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __getitem__(self, name: str) -> Any:
        return self.get(name)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    # ------------------------------------------------------------------ changes
    def __setitem__(self, name: str, obj: Any) -> None:
        self._add(name, obj, sys._getframe(1))

    @contextmanager
    def replaced(self, name: str, obj: Any) -> Iterator[Any]:
        """``obj`` under ``name`` (registered or not) inside the ``with`` block, the old entry (or none) after it."""
        missing = object()
        old, origin = self._entries.get(name, missing), self._origins.get(name)
        self._entries[name] = obj
        self._origins[name] = (f"a replacement ({_where(sys._getframe(2))})", None)
        try:
            yield obj
        finally:
            if old is missing:
                self._entries.pop(name, None)
                self._origins.pop(name, None)
            else:
                self._entries[name], self._origins[name] = old, origin

    def __delitem__(self, name: str) -> None:
        del self._entries[name]
        del self._origins[name]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


def _names(obj: Any, path: str) -> bool:
    """``path`` ("module:attr") names ``obj``'s definition."""
    module, _, attr = path.partition(":")
    obj = getattr(obj, "__wrapped__", obj)
    return getattr(obj, "__module__", None) == module and getattr(obj, "__qualname__", None) == attr


__all__ = ["DuplicateName", "Registry", "UnknownName", "definition", "import_object"]
