"""A refused request's problems as text that JSON can always carry: the agent answers with them (422), the
client and the build side show them in one line."""

from __future__ import annotations

from typing import Any


def safe_text(value: Any, limit: int | None = None) -> str:
    """``str(value)`` as text that UTF-8 (and so JSON) can always carry (lone surrogates become ``\\udXXX``), cut to
    ``limit`` characters with an ellipsis when given."""
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    return text


def field_problems(errors: list[dict[str, Any]], limit: int = 20) -> list[dict[str, Any]]:
    """Pydantic's ``errors()`` as :class:`FieldProblem` dicts that JSON can always carry.

    The offending input is left out on purpose: it may be NaN, a lone surrogate or megabytes long,
    and echoing it is what turned refusals into 500s.
    """
    problems = []
    for error in errors[:limit]:
        loc = [part if isinstance(part, int) and not isinstance(part, bool) else safe_text(part, 100)
               for part in error.get("loc", ())]
        problems.append({"loc": loc, "msg": safe_text(error.get("msg", ""), 300),
                         "type": safe_text(error.get("type", ""), 60)})
    return problems


def describe_problems(problems: list[dict[str, Any]]) -> str:
    """One line naming every problem: ``duration_s: Input should be a finite number; …``."""
    return "; ".join(f"{'.'.join(map(str, p['loc'])) or '(body)'}: {p['msg']}" for p in problems)
