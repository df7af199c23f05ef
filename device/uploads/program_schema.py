"""The closed schema of a ``torch.export`` archive's JSON documents, checked without torch.

``torch.export.load`` and ``ExportedProgram.module()`` write Python source from many strings of ``models/*.json`` and
``exec`` it: graph input names become ``forward``'s parameters, ``guards_code`` becomes a guard function, attribute
paths become ``getattr`` chains, shape expressions go to ``sympy.sympify``. A list of dangerous keys is always one
torch release behind, so this check is the other way round:

* every struct, union and enum is torch's own (``device/assets/export_schema.json``, merged from
  ``torch/_export/serde/schema.yaml`` of each release it names): a key no release read writes refuses the file,
  naming its path;
* every string has a *role* (:data:`STRING_ROLES`, keyed by ``Struct.field``, ``Struct.field{}`` for a mapping's
  keys) with a grammar: a Python identifier, an attribute path, an allowed operator, a shape expression, a pytree
  spec, an enum word …; a string whose role is ``refused`` (``guards_code``, custom-object classes) must be absent or
  empty, and a string field without a role refuses the file, so a field a new torch adds is refused until it is read
  and given one (``tests/device/test_program_trust.py`` fails first).

Node metadata (stack traces and module stacks, which FX writes into comments of generated code) is plain text without
control characters; only the keys torch writes are accepted.
"""

from __future__ import annotations

import functools
import json
import zipfile
import keyword
import re
from pathlib import Path
from typing import Any, Callable

from device.uploads.archive_check import (MAX_EXTRA_BYTES, MAX_EXTRA_DEPTH, PROGRAM_ENTRIES, REFUSED_ENTRIES, ArchiveRefused,
                                  ENUM_WORD, check_attribute_path, check_expression, check_nested_torch_save,
                                  check_operator, check_treespec, check_zip, load_json, pickled_payloads, read_json)

ASSET = Path(__file__).parents[1] / "assets" / "export_schema.json"
ROOTS = {"program": "ExportedProgram", "payload": "PayloadConfig"}
MAX_NAME = 256
MAX_TEXT = 64 << 10
MAX_META_JSON_DEPTH = 16

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DUNDER = re.compile(r"__\w*__")
_VERSION = re.compile(r"[0-9A-Za-z.+_\-]{1,64}")
_DEVICE = re.compile(r"[a-z]{1,16}")
_FILE = re.compile(r"[A-Za-z0-9_]{1,128}")
# Node metadata torch writes (torch/_export/serde/serialize.py serialize_metadata, 2.6-2.14) and what each may hold.
NODE_METADATA = {"stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "custom", "from_node"}
GRAPH_METADATA = {"custom"}
_SOURCE_FN_TARGET = re.compile(r"(torch|_operator|math)(\.[A-Za-z_][A-Za-z0-9_]*)+")


def _name(text: str, where: str) -> None:
    """A name torch writes into generated source as a Python name (a parameter of ``forward``, a local)."""
    if not (len(text) <= MAX_NAME and _IDENTIFIER.fullmatch(text) and not keyword.iskeyword(text)
            and not _DUNDER.fullmatch(text)):
        raise ArchiveRefused(f"{where}: {text[:80]!r} is not a plain Python identifier (letters, digits and _, no "
                             "keyword, no __dunder__); torch writes it into the program's generated code")


def _path(text: str, where: str) -> None:
    check_attribute_path(text, where)
    if any(_DUNDER.fullmatch(part) for part in text.split(".")) or len(text) > 4 * MAX_NAME:
        raise ArchiveRefused(f"{where}: {text[:80]!r} is not a module attribute path a model has")


def _matching(pattern: re.Pattern, what: str) -> Callable[[str, str], None]:
    def check(text: str, where: str) -> None:
        if not pattern.fullmatch(text):
            raise ArchiveRefused(f"{where}: {text[:80]!r} is not {what}")
    return check


def _word(text: str, where: str) -> None:
    if not ENUM_WORD.fullmatch(text):
        raise ArchiveRefused(f"{where}: string argument {text[:80]!r} is not an enum word (a path or code has no "
                             "place in an inference graph)")


def _refused(text: str, where: str) -> None:
    raise ArchiveRefused(f"{where} holds {text[:80]!r}: torch turns this field into code or imports (refused on this "
                         "device, whatever its value)")


def _expression_key(text: str, where: str) -> None:
    check_expression(text, where)


# The grammar of every string of the documents, by where it sits. A string position not named here refuses the file.
STRING_ROLES: dict[str, Callable[[str, str], None]] = {
    **{f"{struct}.{field}": _name for struct, field in [
        ("TensorArgument", "name"), ("TokenArgument", "name"), ("SymIntArgument", "as_name"),
        ("SymBoolArgument", "as_name"), ("SymFloatArgument", "as_name"), ("GraphArgument", "name"),
        ("NamedArgument", "name"), ("Node", "name"), ("CustomObjArgument", "name"),
        ("InputToConstantInputSpec", "name"), ("GradientToUserInputSpec", "user_input_name"),
        ("UserInputMutationSpec", "user_input_name"), ("ModuleCallSignature", "forward_arg_names"),
        ("NamedTupleDef", "field_names"), ("ExportedProgram", "verifiers")]},
    **{f"{struct}.{field}{{}}": _name for struct, field in [
        ("Graph", "tensor_values"), ("Graph", "sym_int_values"), ("Graph", "sym_bool_values"),
        ("Graph", "sym_float_values"), ("Graph", "custom_obj_values"), ("ExportedProgram", "opset_version"),
        ("Argument", "as_string_to_argument")]},
    **{f"{struct}.{field}": _path for struct, field in [
        ("InputToParameterSpec", "parameter_name"), ("InputToBufferSpec", "buffer_name"),
        ("InputToTensorConstantSpec", "tensor_constant_name"), ("InputToCustomObjSpec", "custom_obj_name"),
        ("BufferMutationSpec", "buffer_name"), ("ParameterMutationSpec", "parameter_name"),
        ("GradientToParameterSpec", "parameter_name"), ("ModuleCallEntry", "fqn")]},
    "PayloadConfig.config{}": _path,
    "PayloadMeta.path_name": _matching(_FILE, "a plain file name"),
    "Node.target": lambda text, where: check_operator(text, where),
    "Argument.as_operator": lambda text, where: check_operator(text, where),
    "Argument.as_string": _word, "Argument.as_strings": _word, "ConstantValue.as_string": _word,
    "SymExpr.expr_str": check_expression,
    "ExportedProgram.range_constraints{}": _expression_key,
    "ModuleCallSignature.in_spec": check_treespec, "ModuleCallSignature.out_spec": check_treespec,
    "ExportedProgram.torch_version": _matching(_VERSION, "a torch version"),
    "Device.type": _matching(_DEVICE, "a device type (cpu, cuda …)"),
    # Python source torch execs when it builds the module (torch/export/_unlift.py, 2.13+).
    "ExportedProgram.guards_code": _refused,
    # A TorchScript class torch imports by name; custom-object constants are refused by the archive check too.
    "CustomObjArgument.class_fqn": _refused,
    # Named tuples torch re-creates by name for pytree specs: an inference graph's inputs are tensors.
    "GraphModule.treespec_namedtuple_fields{}": _refused,
    # Both metadata maps are checked whole (their keys decide their values' grammar): see _check_metadata.
    "Node.metadata{}": lambda text, where: None, "Node.metadata": lambda text, where: None,
    "GraphModule.metadata{}": lambda text, where: None, "GraphModule.metadata": lambda text, where: None,
}


@functools.cache
def schema() -> dict:
    """The merged schema asset: ``{"schema_versions": [...], "types": {name: {kind, fields | values}}}``."""
    return json.loads(ASSET.read_text())


def _parse(kind: str) -> tuple:
    """``List[Dict[str, X]]`` → ("List", ("Dict", ("X",))); a plain name → (name,)."""
    match = re.fullmatch(r"(List|Optional|Dict)\[(.*)\]", kind)
    if not match:
        return (kind,)
    inner = match.group(2)
    if match.group(1) == "Dict":
        key, _, value = inner.partition(",")
        if key.strip() != "str":
            raise ValueError(f"a mapping keyed by {key}")
        return ("Dict", _parse(value.strip()))
    return (match.group(1), _parse(inner))


class _Walker:
    def __init__(self, document_name: str):
        self.types = schema()["types"]
        self.name = document_name

    def check(self, value: Any, kinds: list[str], role: str, where: str) -> None:
        """``value`` is one of ``kinds`` (a field's types over the releases read)."""
        failures = []
        for kind in kinds:
            try:
                return self._value(value, _parse(kind), role, where)
            except ArchiveRefused as err:
                failures.append(err)
        raise failures[0]

    def _value(self, value: Any, kind: tuple, role: str, where: str) -> None:
        head = kind[0]
        if head == "Optional":
            if value is not None:
                self._value(value, kind[1], role, where)
        elif head == "List":
            if not isinstance(value, list):
                raise ArchiveRefused(f"{where}: a {type(value).__name__} where torch writes a list")
            for index, item in enumerate(value):
                self._value(item, kind[1], role, f"{where}[{index}]")
        elif head == "Dict":
            if not isinstance(value, dict):
                raise ArchiveRefused(f"{where}: a {type(value).__name__} where torch writes a mapping")
            if role in ("Node.metadata", "GraphModule.metadata"):
                _check_metadata(value, role, where)
                return
            for key, item in value.items():
                self._string(key, f"{role}{{}}", f"{where}{{{key[:40]!r}}}")
                self._value(item, kind[1], role, f"{where}/{key[:40]}")
        elif head == "str":
            if not isinstance(value, str):
                raise ArchiveRefused(f"{where}: a {type(value).__name__} where torch writes a string")
            self._string(value, role, where)
        elif head == "int":
            if type(value) is not int:
                raise ArchiveRefused(f"{where}: {str(value)[:40]!r} where torch writes an integer")
        elif head == "float":
            if not (type(value) in (int, float) or value in ("Infinity", "-Infinity", "NaN")):
                raise ArchiveRefused(f"{where}: {str(value)[:40]!r} where torch writes a number")
        elif head == "bool":
            if type(value) is not bool:
                raise ArchiveRefused(f"{where}: {str(value)[:40]!r} where torch writes true or false")
        else:
            self._typed(value, head, where)

    def _string(self, text: str, role: str, where: str) -> None:
        check = STRING_ROLES.get(role)
        if check is None:
            raise ArchiveRefused(f"{where}: the string field {role} is not one this device has read (no grammar for "
                                 "it, so nothing in it is trusted)")
        check(text, f"{self.name}{where}")

    def _typed(self, value: Any, type_name: str, where: str) -> None:
        entry = self.types.get(type_name)
        if entry is None:
            raise ArchiveRefused(f"{where}: type {type_name} is unknown to this device")
        if entry["kind"] == "enum":
            if type(value) is not int or value not in entry["values"].values():
                raise ArchiveRefused(f"{where}: {str(value)[:40]!r} is not a {type_name} "
                                     f"({', '.join(map(str, sorted(entry['values'].values())))})")
            return
        if not isinstance(value, dict):
            raise ArchiveRefused(f"{where}: a {type(value).__name__} where torch writes a {type_name} object")
        unknown = [key for key in value if key not in entry["fields"]]
        if unknown:
            raise ArchiveRefused(f"{self.name}{where}: key {unknown[0][:80]!r} is not a field of {type_name} in any "
                                 f"torch.export schema this device knows ({', '.join(schema()['schema_versions'])})")
        if entry["kind"] == "union":
            if len(value) != 1:
                raise ArchiveRefused(f"{where}: a {type_name} holds exactly one of its fields, not {len(value)}")
        for key, item in value.items():
            self.check(item, entry["fields"][key], f"{type_name}.{key}", f"{where}/{key}")


def _plain_text(text: Any, where: str, newlines: bool = False) -> str:
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise ArchiveRefused(f"{where}: not a string of at most {MAX_TEXT >> 10} KiB")
    allowed = "\n" if newlines else ""
    bad = next((c for c in text if (not c.isprintable() and c not in allowed) or c in "\r\x0b\x0c\x85\u2028\u2029"),
               None)
    if bad is not None:
        raise ArchiveRefused(f"{where}: holds the control character {bad!r} (FX writes this text into comments of "
                             "generated code, where a line break would end the comment)")
    return text


def _check_metadata(value: dict, role: str, where: str) -> None:
    """A node's or the module's metadata: only the keys torch writes, each value of its grammar."""
    known = NODE_METADATA if role == "Node.metadata" else GRAPH_METADATA
    for key, text in value.items():
        at = f"{where}/{key[:40]}"
        if key not in known:
            raise ArchiveRefused(f"{at}: metadata key {key[:80]!r} is not one torch writes ({', '.join(sorted(known))})")
        _plain_text(text, at, newlines=key == "stack_trace")
        if key in ("custom", "from_node"):
            try:
                load_json(text, at, max_depth=MAX_META_JSON_DEPTH, finite=True)
            except ValueError as err:
                raise ArchiveRefused(str(err)) from None
        elif key == "source_fn_stack":
            for item in text.split(";"):
                name, _, target = item.partition(",")
                _name(name, at)
                if not (_SOURCE_FN_TARGET.fullmatch(target) and "__" not in target):
                    raise ArchiveRefused(f"{at}: source function {target[:80]!r} is not a torch, operator or math "
                                         "name (torch resolves it by walking attributes)")


def check_document(document: Any, kind: str, name: str) -> None:
    """Checks one JSON document of a ``.pt2`` against the closed schema.

    Args:
        document: The parsed JSON.
        kind: ``program`` (``models/*.json``, an ExportedProgram) or ``payload`` (``data/*/..._config.json``).
        name: The entry's name, for messages.

    Raises:
        ArchiveRefused: The first key, type or string outside the schema, named by its path.
    """
    walker = _Walker(name)
    if kind == "program":
        version = document.get("schema_version") if isinstance(document, dict) else None
        majors = {v.split(".")[0] for v in schema()["schema_versions"]}
        if not isinstance(version, dict) or str(version.get("major")) not in majors:
            shown = (f"{version.get('major')}.{version.get('minor')}" if isinstance(version, dict) else repr(version))
            wrote = str(document.get("torch_version"))[:40] if isinstance(document, dict) else "unknown"
            raise ArchiveRefused(f"{name} was written by torch {wrote} (serialization schema {shown}); this device "
                                 f"reads serialization schema {', '.join(schema()['schema_versions'])} only",
                                 fix="send the rung's device checkpoint (<rung>.device.pt), which the device rebuilds "
                                     "and exports with its own torch")
    walker.check(document, [ROOTS[kind]], ROOTS[kind], "")


def string_positions() -> set[str]:
    """Every ``Struct.field`` (and ``Struct.field{}`` for a mapping's keys) of the roots' reachable types that holds
    a string: what :data:`STRING_ROLES` must cover."""
    types, found, seen, pending = schema()["types"], set(), set(), list(ROOTS.values())
    while pending:
        name = pending.pop()
        if name in seen or name not in types or types[name]["kind"] == "enum":
            continue
        seen.add(name)
        for field, kinds in types[name]["fields"].items():
            for kind in kinds:
                parsed = _parse(kind)
                while parsed[0] in ("List", "Optional", "Dict"):
                    if parsed[0] == "Dict":
                        found.add(f"{name}.{field}{{}}")
                    parsed = parsed[1]
                if parsed[0] == "str":
                    found.add(f"{name}.{field}")
                elif parsed[0] not in ("int", "float", "bool"):
                    pending.append(parsed[0])
    return found


def check_program(path) -> None:
    """Checks a ``.pt2``: the archive's entries and pickles (:mod:`device.uploads.archive_check`), then its JSON documents
    against the closed schema.

    Raises:
        ArchiveRefused: The entry or value that is refused, and why.
    """
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise ArchiveRefused(f"not a torch.export archive: {err}") from None
    with archive:
        root = check_zip(archive, "the program")
        names = {e.filename[len(root) + 1:]: e for e in archive.infolist() if not e.is_dir()}
        for name in names:
            for prefix, why in REFUSED_ENTRIES.items():
                if name.startswith(prefix):
                    raise ArchiveRefused(f"the program holds {name}: {why}")
            if not any(p.fullmatch(name) for p in PROGRAM_ENTRIES):
                raise ArchiveRefused(f"the program holds {name}, which torch.export.save does not write")
        models = [n for n in names if n.startswith("models/")]
        if not models:
            raise ArchiveRefused("the archive holds no models/*.json: not a torch.export program")
        for name in models:
            check_document(read_json(archive, names[name]), "program", name)
        for name in names:
            if name.startswith("extra/"):  # read by EdgeFold (and by torch's callers) as JSON: bounded and parsed here
                read_json(archive, names[name], limit=MAX_EXTRA_BYTES, max_depth=MAX_EXTRA_DEPTH)
        pickled = [n for n in names if n.startswith("data/sample_inputs/") or n.endswith(".pt")]
        for name in names:
            if name.endswith("_config.json") and name.startswith(("data/weights/", "data/constants/")):
                config = read_json(archive, names[name])
                check_document(config, "payload", name)
                pickled += pickled_payloads(config, name, {n: e.file_size for n, e in names.items()})
        for name in sorted(set(pickled)):
            if name not in names:
                raise ArchiveRefused(f"the program's configuration names {name}, which the archive does not hold")
            check_nested_torch_save(archive, names[name], name)
