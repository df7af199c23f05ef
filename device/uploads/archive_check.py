"""The parts of the check of a ``torch.export`` program (``.pt2``) before the device loads it, without torch (assembled
by :func:`device.uploads.program_schema.check_program`).

``torch.export.load`` trusts its file: in torch 2.14 it unpickles pickled weights and constants with
``weights_only=False``, retries sample inputs the same way when the safe load refuses them, unpickles "opaque"
constants with ``pickle.loads``, resolves a node's target by walking attributes from ``torch`` (``torch.os.system`` is
a valid walk), and hands every symbolic-shape string to ``sympy.sympify``, which evaluates it as Python;
``ExportedProgram.module()`` then writes Python source from names in the document and ``exec`` s it. A default agent
refuses programs outright (:func:`device.uploads.artifacts.check`); one started with ``--trust-programs`` accepts a program
only when every one of those inputs is inert:

* the zip's entries are bounded in count and size, stored or deflated within a ratio, under one root, with names that
  stay inside the archive, and each is one of the entries ``torch.export.save`` writes (no AOTInductor shared
  libraries, no TorchScript or opaque-object constants);
* every pickle (sample inputs, pickled weights and tensor constants, legacy weight files) passes
  :func:`device.uploads.safe_pickle.check_torch_save`;
* ``models/*.json`` and the payload configurations pass the closed schema of :mod:`device.uploads.program_schema`: torch's
  own keys only, and every string of the grammar its field has — among them, every operator an ATen, prims or
  quantize op (or one of ``operator``'s, ``math``'s and torch's ``sym_*`` helpers), every shape expression sympy's
  and torch's symbolic functions over integer symbols and literals, every name an identifier, ``guards_code`` empty;
* ``extra/`` entries are small JSON documents.
"""

from __future__ import annotations

import ast
import json
import math
import re
import struct
import zipfile
from pathlib import PurePosixPath
from typing import Any

from device.uploads.safe_pickle import UnsafePickleError, check_torch_save

MAX_ENTRIES = 20_000
MAX_ENTRY_BYTES = 8 << 30
MAX_TOTAL_BYTES = 16 << 30
MAX_RATIO = 200  # a deflated entry may expand at most this much (zip bombs reach 1000× and more)
MAX_JSON_BYTES = 64 << 20
MAX_JSON_DEPTH = 200
# An ``extra/`` entry (torch.export.save's extra_files; EdgeFold's edgefold.json): a small JSON sidecar.
MAX_EXTRA_BYTES = 1 << 20
MAX_EXTRA_DEPTH = 32

# The entries torch.export.save writes (torch/export/pt2_archive/constants.py, 2.6-2.14), under the archive's root.
_NAME = r"[A-Za-z0-9_.\-]+"
PROGRAM_ENTRIES = [re.compile(p) for p in (
    r"archive_format", r"archive_version", r"byteorder", r"version", r"\.data/version", r"\.data/serialization_id",
    rf"models/{_NAME}\.json", rf"data/sample_inputs/{_NAME}\.pt",
    rf"data/weights/{_NAME}", rf"data/constants/{_NAME}", r"extra/[^/]+",
)]
REFUSED_ENTRIES = {
    "data/aotinductor/": "an AOTInductor package: its compiled shared libraries would be loaded and run",
    "data/executorch/": "an ExecuTorch payload, which this device does not run",
    "data/mtia/": "an MTIA payload, which this device does not run",
    "data/constants/custom_obj": "a TorchScript custom-object constant, which torch unpickles with code of its class",
    "data/constants/opaque_obj": "an opaque Python object constant, which torch reads with pickle.loads",
}
_FIX = ("export a graph of tensor operations only: torch.export.save(torch.export.export(model, args), path), with "
        "tensor constants and no custom or opaque objects (EdgeFold's export stage writes such a .pt2)")

# Operators a graph node may name (torch._export.serde.serialize.GraphModuleDeserializer.deserialize_operator): the
# inference ops of image networks, by name, any overload. Not a namespace: ATen also has ops that open files
# (aten.from_file maps any path, read-write) or allocate what they are told.
_ATEN_OPS = frozenset("""
    conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d convolution _convolution linear addmm mm bmm
    matmul baddbmm einsum batch_norm native_batch_norm _native_batch_norm_legit_no_training
    _native_batch_norm_legit_functional layer_norm native_layer_norm group_norm native_group_norm instance_norm
    relu relu_ relu6 hardtanh hardtanh_ hardswish hardswish_ hardsigmoid hardsigmoid_ sigmoid sigmoid_ silu silu_ gelu
    gelu_ tanh tanh_ leaky_relu leaky_relu_ elu elu_ mish mish_ softplus clamp clamp_ clamp_min clamp_max prelu
    add add_ sub sub_ rsub mul mul_ div div_ neg exp log log2 sqrt rsqrt pow abs reciprocal maximum minimum where floor
    ceil round trunc sign eq ne lt le gt ge logical_and logical_or logical_not isnan
    adaptive_avg_pool1d adaptive_avg_pool2d adaptive_max_pool2d avg_pool1d avg_pool2d max_pool1d max_pool2d
    max_pool2d_with_indices upsample_nearest2d upsample_bilinear2d
    view reshape _unsafe_view flatten unflatten permute transpose t contiguous clone squeeze unsqueeze expand cat
    concat stack split split_with_sizes chunk slice select narrow index_select gather unbind repeat flip pad
    constant_pad_nd sym_size sym_numel sym_stride sym_storage_offset alias detach _to_copy to type_as
    mean sum amax amin max min argmax argmin topk sort softmax log_softmax _softmax _log_softmax norm
    linalg_vector_norm cumsum
    dropout dropout_ feature_dropout feature_dropout_ alpha_dropout scalar_tensor zeros_like ones_like full_like
    masked_fill nonzero index scaled_dot_product_attention _scaled_dot_product_flash_attention_for_cpu
    _scaled_dot_product_efficient_attention _scaled_dot_product_flash_attention
    _assert_scalar _assert_async _assert_tensor_metadata sym_constrain_range sym_constrain_range_for_size
""".split())
_OTHER_OPS = frozenset({"tensorrt.quantize_op", "quantized_decomposed.quantize_per_tensor",
                        "quantized_decomposed.dequantize_per_tensor", "quantized_decomposed.quantize_per_channel",
                        "quantized_decomposed.dequantize_per_channel"})
_TORCH_OP = re.compile(r"torch\.ops\.(?P<namespace>[a-z_]+)\.(?P<op>[A-Za-z_][A-Za-z0-9_]*)(\.[A-Za-z][A-Za-z0-9_]*)?")
ENUM_WORD = re.compile(r"[A-Za-z0-9_]{0,32}")  # a string argument: an enum ("same", "tanh", "floor"), never a path
_OPERATORS = {"getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs", "eq", "ne",
              "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift", "rshift"}
_MATH = {"sqrt", "floor", "ceil", "trunc", "exp", "log", "log2", "sin", "cos", "tan", "tanh", "pow", "fabs"}
_SYM = re.compile(r"torch\._?sym_[a-z_]+")

# Names a shape expression may use (sympy's and torch.utils._sympy.functions' as torch prints them).
_EXPR_FUNCTIONS = {
    "Symbol", "Integer", "Float", "Rational", "Add", "Mul", "Pow", "Max", "Min", "Abs", "Eq", "Ne", "Lt", "Le", "Gt",
    "Ge", "And", "Or", "Not", "Piecewise", "floor", "ceiling", "sqrt", "oo", "zoo", "nan", "true", "false", "True",
    "False", "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat",
    "Identity", "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or", "BitwiseFn_bitwise_xor",
}
# Module names may hold hyphens (torchvision's RegNet: trunk_output.block1.block1-0); torch quotes them as strings.
_ATTRIBUTE_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_][A-Za-z0-9_\-]*)*")
_TREESPEC_TYPES = {None, "builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict",
                   "torch.fx.immutable_collections.immutable_list", "torch.fx.immutable_collections.immutable_dict"}
# s0, u3, zuf0: torch's symbol names (no Python builtin has this shape). Five digits at most: torch counts its
# unbacked symbols up to a name's number in a Python loop (u99999999999 would never end).
_EXPR_SYMBOL = re.compile(r"[a-z]{1,4}\d{1,5}")
MAX_LITERAL = 2 ** 32  # the largest number a shape expression may hold: sympy computes with what it is given
# A pytree dict's key becomes a parameter name of the forward torch generates when forward_arg_names is empty.
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
_EXPR_KEYWORDS = {"positive", "integer", "real", "nonnegative", "negative", "nonzero", "finite", "zero"}
_EXPR_NODES = (ast.Expression, ast.Call, ast.Name, ast.Load, ast.Constant, ast.keyword, ast.BinOp, ast.UnaryOp,
               ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Compare,
               ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Tuple)


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")


class ArchiveRefused(ValueError):
    """An archive the device will not load; the message names the entry and the reason, :attr:`fix` the remedy."""

    def __init__(self, message: str, fix: str = _FIX):
        super().__init__(message)
        self.fix = fix


def _recorded_directory_offset(handle) -> int:
    """The central directory's offset as the end record says it (zip64's where the record defers to it): what a zip
    reader that does not correct for prepended bytes (torch's miniz) reads the directory at."""
    handle.seek(0, 2)
    size = handle.tell()
    handle.seek(max(0, size - (1 << 16) - 22))
    tail = handle.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) < at + 22:
        raise ArchiveRefused("no end of central directory record")
    offset = struct.unpack("<I", tail[at + 16:at + 20])[0]
    locator = at - 20
    if offset == 0xFFFFFFFF and locator >= 0 and tail[locator:locator + 4] == b"PK\x06\x07":
        record = struct.unpack("<Q", tail[locator + 8:locator + 16])[0]
        handle.seek(record)
        zip64 = handle.read(56)
        if zip64[:4] != b"PK\x06\x06":
            raise ArchiveRefused("a zip64 end record that is not where its locator says")
        offset = struct.unpack("<Q", zip64[48:56])[0]
    return offset


def _check_layout(archive: zipfile.ZipFile, entries: list, what: str) -> None:
    """One archive for every reader: no bytes before the first entry or between the recorded and the real directory
    (Python's zipfile corrects offsets for prepended data, torch's miniz does not: such a file shows each of them
    another set of entries), and every entry's local header names what the directory names."""
    if archive.fp is None:
        return
    position = archive.fp.tell()
    try:
        if _recorded_directory_offset(archive.fp) != archive.start_dir or (
                entries and min(e.header_offset for e in entries) != 0):
            raise ArchiveRefused(f"{what} has bytes before its entries or its directory is not where its end record "
                                 "says: zip readers would each see other entries")
        for entry in entries:
            archive.fp.seek(entry.header_offset)
            header = archive.fp.read(30)
            if header[:4] != b"PK\x03\x04":
                raise ArchiveRefused(f"{what}: entry {entry.filename!r} has no local header where the directory says")
            name_length = struct.unpack("<H", header[26:28])[0]
            if archive.fp.read(name_length) != entry.orig_filename.encode("utf-8" if entry.flag_bits & 0x800
                                                                           else "cp437"):
                raise ArchiveRefused(f"{what}: entry {entry.filename!r} is named otherwise in its local header")
    finally:
        archive.fp.seek(position)


def check_zip(archive: zipfile.ZipFile, what: str) -> str:
    """Bounds a zip before anything reads it: entry count and sizes, compression ratio, names inside one root.

    Returns:
        The root folder every entry sits under (``torch.save`` and ``torch.export.save`` write one).

    Raises:
        ArchiveRefused: A zip bomb, a name that leaves the archive, or entries under several roots.
    """
    entries = archive.infolist()
    if len(entries) > MAX_ENTRIES:
        raise ArchiveRefused(f"{what} has {len(entries)} entries, over {MAX_ENTRIES}")
    _check_layout(archive, entries, what)
    total, roots, seen = 0, set(), set()
    for entry in entries:
        name = entry.filename
        parts = PurePosixPath(name).parts
        # zipfile cuts a name at its first NUL (ZipInfo keeps the whole one as orig_filename): check what is stored.
        if (name.startswith(("/", "\\")) or "\\" in name or "\x00" in entry.orig_filename
                or re.match(r"[A-Za-z]:", name)
                or ".." in parts or not parts):
            raise ArchiveRefused(f"{what} has an entry named {name!r}, which leaves the archive")
        if name in seen:
            raise ArchiveRefused(f"{what} has two entries named {name!r}")
        seen.add(name)
        if entry.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ArchiveRefused(f"{what}: entry {name} uses compression method {entry.compress_type}")
        if entry.file_size > MAX_ENTRY_BYTES or (
                entry.compress_type == zipfile.ZIP_DEFLATED and entry.file_size > MAX_RATIO * max(entry.compress_size, 1)):
            raise ArchiveRefused(f"{what}: entry {name} expands to {entry.file_size} bytes from "
                                 f"{entry.compress_size} (a zip bomb)")
        total += entry.file_size
        roots.add(parts[0])
    if total > MAX_TOTAL_BYTES:
        raise ArchiveRefused(f"{what} expands to {total} bytes, over {MAX_TOTAL_BYTES >> 30} GiB")
    if len(roots) != 1 or all(len(PurePosixPath(e.filename).parts) < 2 for e in entries):
        raise ArchiveRefused(f"{what} is not under one root folder ({', '.join(sorted(roots)[:3])})")
    return roots.pop()


def read_json(archive: zipfile.ZipFile, entry: zipfile.ZipInfo, limit: int = MAX_JSON_BYTES,
               max_depth: int = MAX_JSON_DEPTH) -> Any:
    if entry.file_size > limit:
        raise ArchiveRefused(f"{entry.filename} is {entry.file_size} bytes of JSON, over {limit >> 10} KiB")
    try:
        return load_json(archive.read(entry), entry.filename, max_depth=max_depth)
    except ValueError as err:
        raise ArchiveRefused(str(err)) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name}")


def load_json(data: bytes | str, what: str, max_depth: int = MAX_JSON_DEPTH, finite: bool = False) -> Any:
    """``json.loads`` with its nesting bounded first (CPython's parser recurses: a deep document exhausts the stack).

    Raises:
        ValueError: Not JSON, or nested deeper than ``max_depth``.
    """
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    depth = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub("", text)):  # brackets inside strings do not nest
        depth += 1 if bracket in "[{" else -1
        if depth > max_depth:
            raise ValueError(f"{what} nests deeper than {max_depth} levels")
    try:
        return json.loads(text, parse_constant=_no_constant) if finite else json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{what} is not valid JSON: {err}") from None


def pickled_payloads(config: Any, name: str, sizes: dict[str, int]) -> list[str]:
    """The entries a weights or constants configuration says are pickled; every ``path_name`` a plain file name, and
    every raw payload's view within its bytes."""
    folder = name.rsplit("/", 1)[0]
    if not isinstance(config, dict) or not isinstance(config.get("config"), dict):
        raise ArchiveRefused(f"{name} is not a payload configuration ({{'config': {{...}}}})")
    pickled = []
    for fqn, meta in config["config"].items():
        check_attribute_path(fqn, f"{name}: payload name")
        path_name = meta.get("path_name") if isinstance(meta, dict) else None
        if not isinstance(path_name, str) or not re.fullmatch(r"[A-Za-z0-9_]+", path_name):
            raise ArchiveRefused(f"{name}: payload {fqn!r} has path_name {path_name!r}, not a plain file name")
        if path_name.startswith(("custom_obj", "opaque_obj")):
            raise ArchiveRefused(f"{name}: constant {fqn!r} is {REFUSED_ENTRIES['data/constants/' + path_name[:10]]}")
        if meta.get("use_pickle"):
            pickled.append(f"{folder}/{path_name}")
        else:
            _check_tensor_meta(meta.get("tensor_meta"), f"{name}: payload {fqn!r}", sizes.get(f"{folder}/{path_name}"))
    return pickled


# torch._export.serde.schema.ScalarType → bytes per element.
_ITEMSIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 2, 7: 4, 8: 8, 9: 4, 10: 8, 11: 16, 12: 1, 13: 2, 28: 2, 29: 1, 30: 1,
             31: 1, 32: 1, 33: 1, 34: 4, 35: 8}


def _check_tensor_meta(meta: Any, where: str, payload_bytes: int | None) -> None:
    """A raw payload's view: known dtype, integer sizes and strides, and no more elements than its payload holds (a
    stride-0 view of a few bytes would be made dense, gigabytes, by the first copy)."""
    if not isinstance(meta, dict):
        raise ArchiveRefused(f"{where}: no tensor_meta for a raw payload")
    itemsize = _ITEMSIZE.get(meta.get("dtype"))

    def ints(values: Any) -> list[int]:
        out = [v.get("as_int") if isinstance(v, dict) else None for v in (values or [])]
        if not isinstance(values, list) or len(out) > 16 or not all(type(v) is int and v >= 0 for v in out):
            raise ArchiveRefused(f"{where}: sizes and strides must be at most 16 non-negative integers")
        return out

    sizes, strides = ints(meta.get("sizes")), ints(meta.get("strides"))
    offset = (meta.get("storage_offset") or {}).get("as_int", 0)
    if itemsize is None or len(sizes) != len(strides) or type(offset) is not int or offset < 0:
        raise ArchiveRefused(f"{where}: dtype {meta.get('dtype')!r}, {len(sizes)} sizes, {len(strides)} strides")
    numel = math.prod(sizes)
    extent = offset + sum((n - 1) * st for n, st in zip(sizes, strides)) + 1 if numel else 0
    elements = (payload_bytes or 0) // itemsize
    if payload_bytes is None or numel > elements or extent > elements:
        raise ArchiveRefused(f"{where}: a view of {numel} elements (extent {extent}) over a payload of {elements}: "
                             "weights are dense views of their own bytes")


def check_nested_torch_save(archive: zipfile.ZipFile, entry: zipfile.ZipInfo, name: str) -> None:
    import io

    data = archive.read(entry)
    try:
        inner = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise ArchiveRefused(f"{name} is not a torch.save archive (torch would unpickle it as a legacy file)") from None
    with inner:
        try:
            check_zip(inner, name)
            check_torch_save(inner, f"{name}: ")
        except UnsafePickleError as err:
            raise ArchiveRefused(str(err)) from None


def check_attribute_path(text: Any, where: str) -> None:
    """A module attribute path (``layer1.0.conv1.weight``, or ``""`` for the root): torch writes it into generated
    Python source (``getattr(self, "…")``), so anything but dot-separated words is refused."""
    if not isinstance(text, str) or not (text == "" or _ATTRIBUTE_PATH.fullmatch(text)):
        raise ArchiveRefused(f"{where}: {str(text)[:80]!r} is not a module attribute path (words joined by dots); "
                             "torch would write it into the program's generated code")


def check_treespec(text: str, where: str) -> None:
    """A serialized pytree spec (``[protocol, {"type", "context", "children_spec"}]``): only the containers a model's
    inputs and outputs use, with contexts of plain keys. torch resolves ``type`` by name and decodes ``context`` with a
    hook that imports any module named in an ``__enum__`` object."""
    try:
        document = load_json(text, where, max_depth=MAX_JSON_DEPTH)
    except ValueError as err:
        raise ArchiveRefused(str(err)) from None
    if not (isinstance(document, list) and len(document) == 2 and isinstance(document[1], dict)):
        raise ArchiveRefused(f"{where}: not a pytree spec ([protocol, node])")
    nodes = [document[1]]
    while nodes:
        node = nodes.pop()
        if not isinstance(node, dict) or node.get("type") not in _TREESPEC_TYPES:
            kind = node.get("type") if isinstance(node, dict) else node
            raise ArchiveRefused(f"{where}: pytree node type {str(kind)[:80]!r} (only tuples, lists, dicts and "
                                 f"leaves: {', '.join(sorted(t for t in _TREESPEC_TYPES if t))})")
        context = node.get("context")
        decoded = load_json(context, where) if isinstance(context, str) else context
        import keyword

        if decoded is not None and not (isinstance(decoded, list) and all(
                (type(key) is int and abs(key) <= MAX_LITERAL) or (
                    isinstance(key, str) and _KEY.fullmatch(key) and not keyword.iskeyword(key)
                    and not key.startswith("__")) for key in decoded)):
            raise ArchiveRefused(f"{where}: pytree context {str(context)[:80]!r} is not null or a list of plain keys "
                                 "(identifiers, or small integers): torch writes a key into the generated forward")
        children = node.get("children_spec", [])
        if not isinstance(children, list):
            raise ArchiveRefused(f"{where}: pytree children_spec is not a list")
        nodes.extend(children)


def check_operator(target: str, where: str) -> None:
    module, _, attr = target.partition(".")
    op = _TORCH_OP.fullmatch(target)
    allowed = "__" not in target and (
        (op and (op["op"] in _ATEN_OPS if op["namespace"] == "aten" else f"{op['namespace']}.{op['op']}" in _OTHER_OPS))
        or _SYM.fullmatch(target) or (module == "_operator" and attr in _OPERATORS)
        or (module == "math" and attr in _MATH))
    if not allowed:
        raise ArchiveRefused(f"{where} names operator {target!r}, which is not among the image-network inference "
                             "ops this device runs (device/uploads/archive_check.py: _ATEN_OPS)")


MAX_EXPONENT = 64
_POWER_FUNCTIONS = {"Pow", "PowByNatural", "FloatPow"}


def _is_power(node: ast.AST) -> bool:
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow)) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _POWER_FUNCTIONS)


def _small_exponent(node: ast.AST) -> bool:
    exponent = node.right if isinstance(node, ast.BinOp) else (node.args[1] if len(node.args) == 2 else None)
    return (isinstance(exponent, ast.Constant) and type(exponent.value) is int
            and abs(exponent.value) <= MAX_EXPONENT)


def check_expression(text: str, where: str) -> None:
    """A shape expression as torch serializes it (``Symbol('s77', positive=True, integer=True)``, ``2*s0 + 1``):
    torch hands it to ``sympy.sympify``, which evaluates it as Python, so only symbols, literals and known functions
    pass.

    Raises:
        ArchiveRefused: Anything else, named.
    """
    if len(text) > 10_000:
        raise ArchiveRefused(f"{where}: a shape expression of {len(text)} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # deep nesting exhausts the parser
        raise ArchiveRefused(f"{where}: {text[:80]!r} is not a shape expression") from None
    powers = sum(_is_power(node) for node in ast.walk(tree))
    for node in ast.walk(tree):
        bad = None
        if not isinstance(node, _EXPR_NODES):
            bad = type(node).__name__
        elif _is_power(node) and (powers > 2 or any(_is_power(inner) for inner in ast.walk(node) if inner is not node)):
            bad = "powers of powers, or more than two powers (sympy would compute with their product)"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Float" and (
                len(node.args) > 1 or node.keywords):
            bad = "a Float with a precision (sympy would compute to it)"
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float) and not (
                math.isfinite(node.value) and abs(node.value) <= MAX_LITERAL):
            bad = f"the number {str(node.value)[:40]} (at most {MAX_LITERAL} in a shape expression)"
        elif isinstance(node, ast.Name) and node.id not in _EXPR_FUNCTIONS and not _EXPR_SYMBOL.fullmatch(node.id):
            bad = f"the name {node.id!r}"
        elif isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _EXPR_FUNCTIONS):
            bad = "a call of something other than a sympy function"
        elif isinstance(node, ast.keyword) and node.arg not in _EXPR_KEYWORDS:
            bad = f"the keyword {node.arg!r}"
        elif _is_power(node) and not _small_exponent(node):
            bad = f"a power whose exponent is not an integer literal of at most {MAX_EXPONENT} (sympy would compute it)"
        elif isinstance(node, ast.Constant) and not (
                isinstance(node.value, (int, float, bool)) or (isinstance(node.value, str)
                                                               and _EXPR_SYMBOL.fullmatch(node.value))):
            bad = f"the literal {node.value!r}"
        if bad:
            raise ArchiveRefused(f"{where}: shape expression {text[:80]!r} holds {bad} (torch would evaluate it as "
                                 "Python)")
