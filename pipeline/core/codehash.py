"""The project code a stage depends on, as one hash: part of the stage's cache key.

A stage's result depends on its own module and on every project module it imports, directly or
through others (``train.py``, ``losses.py``, ``device/runners/qdq_lint.py`` …), so the key covers the
transitive closure of project imports found by reading the sources (``ast``, nothing executed).
Imports inside functions count too: a lazily imported helper still does the stage's work.

A package's ``__init__.py`` counts only when it is imported by name (``from device import
__version__``), not merely because a submodule was: a task's ``__init__.py`` imports
every stage of the task, and counting it would make each stage depend on all the others.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from typing import Iterable

PROJECT_PACKAGES = ("pipeline", "device")
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def module_path(name: str, root: Path | None = None) -> Path | None:
    """The source file of project module ``name`` under ``root``, or None if there is none."""
    if name.split(".")[0] not in PROJECT_PACKAGES:
        return None
    base = (root or PROJECT_ROOT).joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imported_modules(name: str, root: Path | None = None) -> set[str]:
    """Project modules that module ``name`` imports anywhere in its source."""
    path = module_path(name, root)
    if path is None:
        return set()
    found: set[str] = set()
    for candidates in _import_candidates(name, path):
        existing = next((c for c in candidates if module_path(c, root)), None)
        if existing is not None:
            found.add(existing)
    found.discard(name)
    return found


# Parsed once per module name and source text: every stage of every run walks much the same closure, and the
# parse was half a second per stage. Which candidates exist is looked up each time (a module may appear later).
_CANDIDATES: dict[tuple[str, bytes], tuple[tuple[str, ...], ...]] = {}


def _import_candidates(name: str, path: Path) -> tuple[tuple[str, ...], ...]:
    """Per import in the source: the module names it may mean, the first existing one wins."""
    source = path.read_bytes()
    key = (name, hashlib.sha256(source).digest())
    if key in _CANDIDATES:
        return _CANDIDATES[key]
    package = name if _is_package(path) else name.rpartition(".")[0]
    found: list[tuple[str, ...]] = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name,) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from .x import y
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{node.module}" if node.module else anchor
            else:
                base = node.module or ""
            found.extend((f"{base}.{alias.name}", base) for alias in node.names)
    _CANDIDATES[key] = tuple(found)
    return _CANDIDATES[key]


def closure(roots: Iterable[str], root: Path | None = None) -> list[str]:
    """``roots`` and every project module they import, transitively, sorted.

    Raises:
        ConfigError: A root that is no project module (a misspelled name would hash nothing, silently, and the
            stage would never re-run when that code changed).
    """
    roots = list(roots)
    missing = [r for r in roots if module_path(r, root) is None]
    if missing:
        import difflib

        from device.errors import ConfigError

        known = [".".join(path.relative_to(root or PROJECT_ROOT).with_suffix("").parts)
                 for package in PROJECT_PACKAGES for path in (root or PROJECT_ROOT).joinpath(package).rglob("*.py")]
        near = difflib.get_close_matches(missing[0], known, n=1)
        raise ConfigError(f"code root {missing[0]!r} is not a module of {' or '.join(PROJECT_PACKAGES)}: its code "
                          "would not be in the stage's cache key",
                          fix=f"did you mean {near[0]!r}?" if near else "name a module path such as 'pipeline.tasks.classification.train'")
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(imported_modules(name, root) - seen)
    return sorted(seen)


def code_sha256(roots: Iterable[str], root: Path | None = None) -> tuple[str, list[str]]:
    """One sha256 over the sources of :func:`closure` (names and bytes), and the module list."""
    modules = closure(roots, root)
    digest = hashlib.sha256()
    for name in modules:
        digest.update(name.encode() + b"\0" + module_path(name, root).read_bytes() + b"\0")
    return digest.hexdigest(), modules
