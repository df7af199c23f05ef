"""A torch-free check that a ``torch.save`` pickle can only rebuild tensors and plain data.

Scanning a pickle's ``GLOBAL`` names is not enough: what a file does is what its ``REDUCE`` calls do, with the
arguments they get, and a memo can hand a callable around under any name. So this module *runs* the pickle, on
symbols instead of objects: every opcode ``torch.save`` (protocol 2) writes is interpreted, any other is refused, and
every call is checked against a rule for that callable and its arguments (``_rebuild_tensor_v2`` must get a storage, an
offset, a size, a stride, a bool and empty hooks, and its view must fit the storage). Nothing is imported or called.

Used at upload, on every pickle an artifact holds (a device checkpoint's ``data.pkl``, a ``.pt2``'s sample inputs and
pickled weights), and again just before the device loads one.
"""

from __future__ import annotations

import math
import pickletools
import zipfile
from dataclasses import dataclass, field
from typing import Any

MAX_PICKLE_BYTES = 256 << 20  # a checkpoint's pickle is its small metadata; tensors are separate entries
MAX_OPCODES = 5_000_000
MAX_DIMS = 16

# Storage classes torch.save names in a persistent id, with their element sizes (torch/storage.py's legacy names).
STORAGE_ITEMSIZE = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
    "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
    "Float8_e4m3fnStorage": 1, "Float8_e5m2Storage": 1, "UntypedStorage": 1,
}
# Values a checkpoint may name but never call.
DTYPES = {"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
          "float8_e4m3fn", "float8_e5m2"}
# The opcodes protocol 2's pickler writes for tensors, containers, numbers and strings; anything else is refused.
ALLOWED_OPCODES = {
    "PROTO", "STOP", "MARK", "POP", "POP_MARK", "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1",
    "BINFLOAT", "BINUNICODE", "SHORT_BINUNICODE", "BINSTRING", "SHORT_BINSTRING", "BINBYTES", "SHORT_BINBYTES",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_LIST", "APPEND", "APPENDS", "EMPTY_DICT",
    "SETITEM", "SETITEMS", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET", "GLOBAL", "REDUCE", "BUILD",
    "BINPERSID",
}


class UnsafePickleError(ValueError):
    """A pickle refused before loading: it could run code, or it is not what ``torch.save`` of tensors writes."""


@dataclass(frozen=True)
class Global:
    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(frozen=True)
class Storage:
    """A persistent id: a storage entry of the archive."""
    kind: str
    key: str
    numel: int


@dataclass
class Tensor:
    storage: Storage


@dataclass
class Mapping:
    """A dict or an OrderedDict (their items only; nothing is hashed)."""
    items: list = field(default_factory=list)
    ordered: bool = False


class _Mark:
    pass


_MARK = _Mark()


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple) or len(value) > MAX_DIMS or not all(
            type(v) is int and v >= 0 for v in value):
        raise UnsafePickleError(f"{what} is not a tuple of at most {MAX_DIMS} non-negative ints")
    return value


def _empty_hooks(value: Any) -> bool:
    return isinstance(value, Mapping) and not value.items


def _rebuild_tensor_v2(args: tuple) -> Tensor:
    # torch/_utils.py: _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks,
    # metadata=None). Hooks are callables: a tensor's must be empty. Metadata is a dict of plain values.
    if len(args) not in (6, 7) or not isinstance(args[0], Storage) or type(args[1]) is not int or args[1] < 0 \
            or type(args[4]) is not bool or not _empty_hooks(args[5]) \
            or (len(args) == 7 and args[6] is not None and not isinstance(args[6], Mapping)):
        raise UnsafePickleError("torch._utils._rebuild_tensor_v2 called with arguments that are not a tensor's "
                                "(storage, offset, size, stride, requires_grad, empty hooks)")
    storage, offset = args[0], args[1]
    size, stride = _ints(args[2], "a tensor's size"), _ints(args[3], "a tensor's stride")
    if len(size) != len(stride):
        raise UnsafePickleError(f"a tensor's size {size} and stride {stride} differ in length")
    numel = math.prod(size)
    extent = offset + sum((s - 1) * st for s, st in zip(size, stride)) + 1 if numel else 0
    if extent > storage.numel or numel > storage.numel:
        # More elements than the storage holds means overlapping strides (stride 0): the first copy makes it dense.
        raise UnsafePickleError(f"a tensor view (size {size}, stride {stride}, offset {offset}) reaches past or "
                                f"repeats its storage of {storage.numel} elements")
    return Tensor(storage)


def _rebuild_parameter(args: tuple) -> Tensor:
    # torch/_utils.py: _rebuild_parameter(data, requires_grad, backward_hooks).
    if len(args) != 3 or not isinstance(args[0], Tensor) or type(args[1]) is not bool or not _empty_hooks(args[2]):
        raise UnsafePickleError("torch._utils._rebuild_parameter called with arguments that are not a parameter's "
                                "(tensor, requires_grad, empty hooks)")
    return args[0]


def _ordered_dict(args: tuple) -> Mapping:
    if args:
        raise UnsafePickleError("collections.OrderedDict called with arguments (torch.save writes OrderedDict())")
    return Mapping(ordered=True)


def _size(args: tuple) -> tuple:
    if len(args) != 1:
        raise UnsafePickleError("torch.Size called with other than one tuple of ints")
    return _ints(args[0], "torch.Size's argument")


def _device(args: tuple) -> str:
    if not 1 <= len(args) <= 2 or not isinstance(args[0], str) or (len(args) == 2 and type(args[1]) is not int):
        raise UnsafePickleError("torch.device called with other than a device string and an index")
    return args[0]


CALLS = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): _ordered_dict,
    ("torch", "Size"): _size,
    ("torch", "device"): _device,
}


def _allowed_global(module: str, name: str) -> bool:
    return (module, name) in CALLS or (module == "torch" and (name in DTYPES or name in STORAGE_ITEMSIZE))


def _persistent_id(pid: Any) -> Storage:
    # torch/serialization.py _save: ('storage', storage_type, key, location, numel).
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], Global)
            and pid[1].module == "torch" and pid[1].name in STORAGE_ITEMSIZE and isinstance(pid[2], str)
            and pid[2].isalnum() and isinstance(pid[3], str) and type(pid[4]) is int and pid[4] >= 0):
        raise UnsafePickleError("a persistent id that is not torch.save's ('storage', type, key, location, numel)")
    return Storage(pid[1].name, pid[2], pid[4])


def _pop_mark(stack: list) -> list:
    for index in range(len(stack) - 1, -1, -1):
        if stack[index] is _MARK:
            items = stack[index + 1:]
            del stack[index:]
            return items
    raise UnsafePickleError("a malformed pickle (no MARK on the stack)")


def interpret(data: bytes) -> tuple[Any, list[Storage]]:
    """Runs ``data`` symbolically.

    Returns:
        The unpickled value as symbols (tuples, lists, :class:`Mapping`, :class:`Tensor`, numbers, strings) and every
        storage it references.

    Raises:
        UnsafePickleError: An opcode ``torch.save`` never writes, a global outside the tensor allowlist, a call with
            arguments its rule refuses, or a malformed or oversized pickle.
    """
    if len(data) > MAX_PICKLE_BYTES:
        raise UnsafePickleError(f"a pickle of {len(data)} bytes, over {MAX_PICKLE_BYTES >> 20} MiB")
    stack: list = []
    memo: dict[int, Any] = {}
    storages: list[Storage] = []
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(data)):
            if count > MAX_OPCODES:
                raise UnsafePickleError(f"a pickle of over {MAX_OPCODES} opcodes")
            name = op.name
            if name not in ALLOWED_OPCODES:
                raise UnsafePickleError(f"its pickle uses {name}, which torch.save (protocol 2) never writes")
            if name in ("PROTO",):
                continue
            if name == "STOP":
                if len(stack) != 1:
                    raise UnsafePickleError("a malformed pickle (STOP with other than one value)")
                return stack[0], storages
            if name == "MARK":
                stack.append(_MARK)
            elif name == "POP":
                stack.pop()
            elif name == "POP_MARK":
                _pop_mark(stack)
            elif name in ("NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT",
                          "BINUNICODE", "SHORT_BINUNICODE", "BINSTRING", "SHORT_BINSTRING", "BINBYTES",
                          "SHORT_BINBYTES"):
                stack.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}.get(name, arg))
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name == "TUPLE":
                stack.append(tuple(_pop_mark(stack)))
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                if len(stack) < n:
                    raise UnsafePickleError("a malformed pickle (a tuple of missing values)")
                items = tuple(stack[-n:])
                del stack[-n:]
                stack.append(items)
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name in ("APPEND", "APPENDS"):
                items = [stack.pop()] if name == "APPEND" else _pop_mark(stack)
                if not isinstance(stack[-1], list):
                    raise UnsafePickleError(f"{name} on a {type(stack[-1]).__name__}, not a list")
                stack[-1].extend(items)
            elif name == "EMPTY_DICT":
                stack.append(Mapping())
            elif name in ("SETITEM", "SETITEMS"):
                items = stack[-2:] if name == "SETITEM" else _pop_mark(stack)
                if name == "SETITEM":
                    del stack[-2:]
                if not isinstance(stack[-1], Mapping) or len(items) % 2:
                    raise UnsafePickleError(f"{name} on a {type(stack[-1]).__name__}, not a dict")
                for key in items[::2]:
                    if not isinstance(key, (str, int, float, bool, type(None), tuple)):
                        raise UnsafePickleError(f"a dict key of type {type(key).__name__}")
                stack[-1].items.extend(zip(items[::2], items[1::2]))
            elif name in ("BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise UnsafePickleError(f"a malformed pickle (memo {arg} read before it is written)")
                stack.append(memo[arg])
            elif name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
                if not _allowed_global(module, attr):
                    raise UnsafePickleError(f"it names {module}.{attr}, which a file of tensors never needs: loading "
                                            "it would run code")
                stack.append(Global(module, attr))
            elif name == "BINPERSID":
                storage = _persistent_id(stack.pop())
                storages.append(storage)
                stack.append(storage)
            elif name == "REDUCE":
                args, func = stack.pop(), stack.pop()
                if not isinstance(func, Global) or (func.module, func.name) not in CALLS:
                    raise UnsafePickleError(f"it calls {func}, which a file of tensors never calls")
                if not isinstance(args, tuple):
                    raise UnsafePickleError(f"{func} called with a {type(args).__name__} for arguments")
                stack.append(CALLS[(func.module, func.name)](args))
            elif name == "BUILD":
                # OrderedDict.__reduce__ hands a state dict's ``_metadata`` attribute to BUILD; nothing else may be
                # given state (a tensor's would set arbitrary attributes).
                state = stack.pop()
                if not (isinstance(stack[-1], Mapping) and stack[-1].ordered and isinstance(state, Mapping)):
                    raise UnsafePickleError(f"BUILD (set state) on a {type(stack[-1]).__name__}: only an "
                                            "OrderedDict's metadata is ever set")
        raise UnsafePickleError("a truncated pickle (no STOP)")
    except IndexError:
        raise UnsafePickleError("a malformed pickle (it pops an empty stack)") from None
    except UnsafePickleError:
        raise
    except Exception as err:  # noqa: BLE001 (pickletools raises ValueError and others on damaged bytes)
        raise UnsafePickleError(f"a damaged pickle: {type(err).__name__}: {err}") from None


# A TorchScript archive: torch < 2.6 hands it to torch.jit.load even under weights_only=True (CVE-2025-32434).
_TORCHSCRIPT_ENTRIES = ("/constants.pkl", "/code/")


def check_torch_save(archive: zipfile.ZipFile, where: str = "") -> Any:
    """Checks a ``torch.save`` zip archive: one uncompressed ``data.pkl`` that :func:`interpret` passes, no TorchScript,
    and every storage it references present and large enough.

    Returns:
        The symbolic value (see :func:`interpret`).

    Raises:
        UnsafePickleError: Anything that could run code or that ``torch.save`` does not write.
    """
    entries = {e.filename: e for e in archive.infolist()}
    script = [n for n in entries if any(mark in f"/{n}" for mark in _TORCHSCRIPT_ENTRIES)]
    if script:
        raise UnsafePickleError(f"{where}a TorchScript archive ({script[0]}): torch before 2.6 runs its code even "
                                "with weights_only=True")
    data = [n for n in entries if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(data) != 1:
        raise UnsafePickleError(f"{where}expected one data.pkl in a torch.save archive, found {len(data)}")
    info = entries[data[0]]
    if info.compress_type != zipfile.ZIP_STORED or info.file_size > MAX_PICKLE_BYTES:
        raise UnsafePickleError(f"{where}{info.filename} is compressed or over {MAX_PICKLE_BYTES >> 20} MiB "
                                f"({info.file_size} bytes): torch.save stores it uncompressed and small")
    try:
        value, storages = interpret(archive.read(info))
    except UnsafePickleError as err:
        raise UnsafePickleError(f"{where}{err}") from None
    root = data[0][:-len("data.pkl")]
    for storage in storages:
        entry = entries.get(f"{root}data/{storage.key}")
        need = storage.numel * STORAGE_ITEMSIZE[storage.kind]
        if entry is None or entry.file_size < need:
            raise UnsafePickleError(f"{where}storage {storage.key} ({storage.numel} × {storage.kind}) is missing or "
                                    f"shorter than {need} bytes")
    return value
