"""A recipe's validation errors in words: each key path with what is wrong there, an unknown key's near names and
the keys allowed beside it, a missing section's reason (a root model's ``MISSING_HINTS``)."""

from __future__ import annotations

import difflib
from typing import Any

from pydantic import BaseModel, ValidationError

from device.errors import ConfigError


def validation_error(err: ValidationError, source: str, root: type[BaseModel]) -> ConfigError:
    """The ConfigError of a recipe that failed validation, one line per error."""
    lines = []
    for item in err.errors():
        path = ".".join(str(p) for p in item["loc"])
        if item["type"] == "extra_forbidden":
            parent_loc = item["loc"][:-1]
            known = field_names_at(parent_loc, root)
            near = difflib.get_close_matches(str(item["loc"][-1]), known, n=1, cutoff=0.6)
            hint = f" (did you mean {'.'.join([*map(str, parent_loc), near[0]])!r}?)" if near else ""
            lines.append(f"{path}: unknown key{hint}; allowed here: {', '.join(known)}")
        elif item["type"] == "missing" and path in getattr(root, "MISSING_HINTS", {}):  # why no default
            lines.append(f"{path}: required; {root.MISSING_HINTS[path]}")
        else:
            msg = item["msg"].removeprefix("Value error, ")
            where = f"{path}: " if path else ""  # a check across sections (a wrap validator's) has no one key
            lines.append(f"{where}{msg} (got {item.get('input')!r})" if "input" in item and path else f"{where}{msg}")
    return ConfigError(f"invalid recipe {source}:\n  " + "\n  ".join(lines), fix="correct the keys named above")


def field_names_at(loc: tuple, root: type[BaseModel]) -> list[str]:
    """The keys allowed at ``loc`` under the root model (none where it is no section)."""
    model: Any = root
    for key in loc:
        field = model.model_fields.get(str(key)) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return []
        annotation = field.annotation
        for candidate in getattr(annotation, "__args__", (annotation,)):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                model = candidate
                break
        else:
            return []
    return sorted(model.model_fields)
