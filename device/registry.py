"""A name → component registry that refuses duplicates and suggests near names."""

from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

from device.errors import ConfigError, UnknownKeyError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps registry keys to components (classes, factories).

    Components are chosen from recipes by key, never by importing a dotted path from a
    config, so a recipe cannot run arbitrary code.

    Args:
        kind: What the registry holds, used in error messages ("architecture", "stage").
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def _ready(self) -> None:
        """Called before every read; a registry that gathers entries lazily (entry points) does it here."""

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers ``obj`` under ``name``.

        Raises:
            ConfigError: If ``name`` is already taken (two components silently shadowing each
                other is a bug that only shows up as wrong results).
        """

        def decorator(obj: T) -> T:
            self.add(name, obj)
            return obj

        return decorator

    def add(self, name: str, obj: T) -> None:
        """Registers ``obj`` under ``name``; see :meth:`register`."""
        if name in self._items:
            raise ConfigError(
                f"{self.kind} {name!r} is already registered",
                fix=f"choose another name; taken: {', '.join(sorted(self._items))}",
            )
        self._items[name] = obj

    def get(self, name: str) -> T:
        """Returns the component registered as ``name``.

        Raises:
            UnknownKeyError: With the closest registered names as suggestions.
        """
        self._ready()
        try:
            return self._items[name]
        except KeyError:
            raise UnknownKeyError(f"unknown {self.kind} {name!r}", fix=self.suggest(name)) from None

    def suggest(self, name: str) -> str:
        """A hint naming the nearest registered keys, or all of them."""
        near = difflib.get_close_matches(str(name), self.names(), n=3, cutoff=0.5)
        if near:
            return f"did you mean {' or '.join(repr(n) for n in near)}? (known: {', '.join(self.names())})"
        return f"known {self.kind}s: {', '.join(self.names())}"

    def names(self) -> list[str]:
        """Registered keys, sorted."""
        self._ready()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        self._ready()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())
