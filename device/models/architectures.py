"""Architecture registry: torchvision models and tiny test models under one set of keys, for both sides.

The build side trains these; the device rebuilds them from a checkpoint (state + architecture key) when it must
export on its own torch (the Torch-TensorRT road, :mod:`device.uploads.torch_checkpoint`). So the registry lives here and
the pipeline imports it (``pipeline`` → ``device``, never back). ``device`` imports without torch: every factory
imports torch and torchvision when it is called, never at import.

Every factory takes ``num_classes`` and ``in_channels`` and returns an untrained ``nn.Module``; ``classifier`` names
the head that pruning must never touch and that is replaced when loaded weights were trained for another class count.
Grey input (``in_channels=1``) replaces the stem, the model's first convolution, with one of the same shape but one
input channel; ImageNet weights for it are folded by summing the stem's kernels over RGB (:func:`fold_stem_weight`,
what timm's ``adapt_input_conv`` does for ``in_chans=1``).

Keys come from three sources, each named by :meth:`ArchitectureRegistry.source`: the built-ins below; ``timm/<name>``
for any of timm's architectures, resolved when first asked for (:mod:`device.models.timm_architectures`); and packages the
user installs, which register builders under the ``edgefold.architectures`` entry-point group. A recipe only ever
names a key: no source imports code that a recipe names, and two sources claiming one key are refused.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable

from device.errors import ConfigError, UnknownKeyError
from device.registry import Registry

ENTRY_POINT_GROUP = "edgefold.architectures"


@dataclass(frozen=True)
class Architecture:
    """A registered architecture.

    Attributes:
        name: Registry key.
        build: ``build(num_classes, in_channels) -> nn.Module``.
        classifier: Dotted module name of the final classification layer.
        extra_heads: Further classification layers whose outputs the model averages with the classifier's (timm's
            distillation heads: RepViT's, DeiT distilled's, LeViT's). Each is kept whole and replaced for another
            class count, as the classifier is.
        torchvision_name: The torchvision builder whose ImageNet weights fit, if any.
        source: Where the key comes from ("built-in (torchvision)", "timm 1.0.31", "entry point pkg.mod:obj (pkg 1.0)").
        preprocess: ``preprocess() -> dict`` of the input size, mean, std and interpolation the model was trained
            with (a :class:`device.preprocess.Preprocess`'s fields), used when a recipe leaves ``preprocess`` unset.
        sized: ``build`` also takes ``input_size=``: the model's shape depends on it (a ViT's position embedding).
        inference_form: ``inference_form(model) -> model``, the same function with its train-time branches folded
            (timm's ``reparameterize_model``: RepVGG's, MobileOne's, FastViT's parallel convolutions into one), used
            for export; None where the trained form is the inference form.
        fingerprint: What besides EdgeFold's own code decides what ``build`` makes (the timm version; an entry
            point's package version and its code's sha256), part of a stage's cache key; empty for the built-ins.
        requirement: What a device must have installed to build it (``torchvision`` for the built-ins, ``timm==…``,
            the entry point's ``package==version``): named when a device lacks it.
    """

    name: str
    build: Callable[[int, int], Any]
    classifier: str
    torchvision_name: str | None = None
    source: str = "built-in"
    preprocess: Callable[[], dict] | None = None
    sized: bool = False
    inference_form: Callable[[Any], Any] | None = None
    fingerprint: str = ""
    requirement: str = "torchvision"
    extra_heads: tuple[str, ...] = ()

    @property
    def heads(self) -> tuple[str, ...]:
        """The classifier and the extra heads, by their names in the trained form."""
        return (self.classifier, *self.extra_heads)

    def head_modules(self, model, exact: bool = False) -> list:
        """The head layers of ``model``, in its trained or its inference form: a head that folding replaced (RepViT's
        two heads fused into ``head``, LeViT's normalised ``head.linear`` into ``head``) is found at the nearest
        enclosing module that still exists. ``exact``: the trained form, where every name must exist as registered
        (a mistyped registration is not hidden by its parent)."""
        found = []
        for name in self.heads:
            parts = name.split(".")
            for end in range(len(parts), len(parts) - 1 if exact else 0, -1):
                try:
                    module = model.get_submodule(".".join(parts[:end]))
                    break
                except AttributeError:
                    continue
            else:
                raise AttributeError(f"{type(model).__name__} has no module {name!r} (the registered classifier)")
            if all(module is not seen for seen in found):
                found.append(module)
        return found

    def identity(self) -> dict[str, str]:
        """What a device checkpoint records of its architecture, so the device rebuilds the same module or refuses
        (:func:`check_identity`)."""
        return {"key": self.name, "source": self.source, "fingerprint": self.fingerprint,
                "requirement": self.requirement}


def source_kind(source: str) -> str:
    """``built-in``, ``timm`` or ``entry point``, from an :attr:`Architecture.source`."""
    return "timm" if source.startswith("timm") else "entry point" if source.startswith("entry point") else "built-in"


def check_identity(recorded: Any, where: str) -> Architecture:
    """The device's architecture for a checkpoint's recorded identity (:meth:`Architecture.identity`), refused when the
    device lacks its source or would build another module from it.

    Raises:
        CheckpointError: No identity recorded, a source this device lacks, or another fingerprint; the fix names the
            package to install.
    """
    import importlib.util

    from device.errors import CheckpointError, MissingDependencyError

    fields = ("key", "source", "fingerprint", "requirement")
    if not (isinstance(recorded, dict) and set(recorded) == set(fields)
            and all(isinstance(recorded[f], str) and len(recorded[f]) <= 512 for f in fields)):
        raise CheckpointError(f"{where} records no architecture source and fingerprint (or an edited one): the device "
                              "cannot tell that it would rebuild the same module",
                              fix="re-run the export stage with this EdgeFold (edgefold run … --force export)")
    key, requirement = recorded["key"], recorded["requirement"]
    install = (f"pip install '{requirement}' into the agent's environment and restart it"
               + (" (on a Jetson: make bundle or docker-jetson with TORCH_TENSORRT=1 carry JetPack's torchvision)"
                  if requirement.startswith("torchvision") else ""))
    if requirement.startswith("torchvision") and importlib.util.find_spec("torchvision") is None:
        raise CheckpointError(f"{where}: its architecture {key} is built from torchvision, which this device lacks",
                              fix=install)
    try:
        arch = ARCHITECTURES.get(key)
    except (ConfigError, MissingDependencyError) as err:
        raise CheckpointError(f"{where}: its architecture {key} comes from {recorded['source']} on the build host, "
                              f"which this device lacks ({err.message})", fix=install) from None
    if source_kind(arch.source) != source_kind(recorded["source"]) or arch.fingerprint != recorded["fingerprint"]:
        raise CheckpointError(f"{where}: its architecture {key} was built by {recorded['source']} "
                              f"({recorded['fingerprint'] or 'EdgeFold built-in'}) on the build host; this device has "
                              f"{arch.source} ({arch.fingerprint or 'EdgeFold built-in'}), which may build another "
                              "module", fix=install)
    return arch


def architecture_sources() -> dict[str, Any]:
    """What this device can rebuild a checkpoint's module from, read without importing any of it (``GET /v1/device``):
    torchvision for the built-ins, timm, and the installed entry points by key with their package."""
    from importlib.metadata import PackageNotFoundError, entry_points, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    points = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        points[point.name] = f"{point.dist.name}=={point.dist.version}" if point.dist else point.value
    return {"torchvision": installed("torchvision"), "timm": installed("timm"), "entry_points": points}


class ArchitectureRegistry(Registry[Architecture]):
    """The registry of :class:`Architecture` s: the built-ins, ``timm/<name>`` resolved on demand, and the
    ``edgefold.architectures`` entry points, gathered on the first read."""

    PREFIXES = ("timm/",)

    def __init__(self, kind: str):
        super().__init__(kind)
        self._plugins_loaded = False
        self._plugin_error: ConfigError | None = None
        self._lock = threading.RLock()
        self._resolved: dict[str, Architecture] = {}

    def _ready(self) -> None:
        """Gathers the entry points once, all or none: a refused source (a key claimed twice, a plugin that fails
        to load) registers nothing and is raised again on every later read, never half-applied."""
        if self._plugins_loaded:
            if self._plugin_error is not None:
                raise self._plugin_error
            return
        with self._lock:
            if self._plugins_loaded:
                return self._ready()
            try:
                found = entry_point_architectures()
                claimed = dict(self._items)
                for arch in found:
                    self._check_free(arch.name, arch, claimed)
                    claimed[arch.name] = arch
            except ConfigError as err:
                self._plugin_error = err
            else:
                self._items = claimed
            self._plugins_loaded = True
        self._ready()

    def _check_free(self, name: str, obj: Architecture, taken: dict[str, Architecture]) -> None:
        if name.startswith(self.PREFIXES):
            raise ConfigError(f"architecture {name!r} ({obj.source}) uses the reserved prefix {name.split('/')[0]}/",
                              fix="register it under a key without a '/' prefix")
        if name in taken:
            raise ConfigError(f"architecture {name!r} is registered twice: by {taken[name].source} and by "
                              f"{obj.source}", fix="uninstall one of the two packages, or rename one entry point")

    def add(self, name: str, obj: Architecture) -> None:
        """Registers ``obj``; a key taken already is refused naming both sources, and the source prefixes are reserved.

        Raises:
            ConfigError: Two sources register ``name``, or it begins with a source's prefix (``timm/``).
        """
        self._check_free(name, obj, self._items)
        self._items[name] = obj

    def get(self, name: str) -> Architecture:
        """The architecture registered as ``name``, or resolved by its source prefix (``timm/resnet10t``).

        Raises:
            UnknownKeyError: With the nearest names (of timm's for a ``timm/`` key).
            MissingDependencyError: A ``timm/`` key where timm is not installed.
        """
        if str(name).startswith("timm/"):
            # Imported by name here (not through a table) so that a stage's code hash follows it.
            from device.models import timm_architectures

            with self._lock:
                if name not in self._resolved:
                    self._resolved[name] = Architecture(**timm_architectures.architecture_fields(name[len("timm/"):]))
                return self._resolved[name]
        return super().get(name)

    def __contains__(self, name: object) -> bool:
        if str(name).startswith(self.PREFIXES):
            try:
                self.get(str(name))
            except UnknownKeyError:
                return False
            return True
        return super().__contains__(name)

    def suggest(self, name: str) -> str:
        return f"{super().suggest(name)}; or timm/<name> for any timm architecture"

    def source(self, name: str) -> str:
        """Where ``name`` comes from, for ``edgefold recipes --check`` and the run's log."""
        return self.get(name).source


def entry_point_architectures() -> list[Architecture]:
    """The architectures that installed packages register under the ``edgefold.architectures`` entry-point group.

    An entry point names an :class:`Architecture`, a mapping with its fields (``build``, ``classifier``, optional
    ``torchvision_name``, ``preprocess`` and ``inference_form``), or a function of no arguments returning either; its key is the entry
    point's name. Only packages installed into the environment are read: a recipe names keys, never code.

    Raises:
        ConfigError: An entry point fails to load or names something of another shape, naming it and its package.
    """
    from importlib.metadata import entry_points

    found = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        dist = f"{point.dist.name} {point.dist.version}" if point.dist else "an unknown distribution"
        package = point.dist.name if point.dist else point.module
        where = f"entry point {point.value} ({dist})"
        try:
            obj = point.load()
            if callable(obj) and not isinstance(obj, Architecture):
                obj = obj()
        except Exception as err:  # a plugin's own bug: named, with the package to blame
            raise ConfigError(f"the architecture {point.name!r} registered by {where} fails to load: "
                              f"{type(err).__name__}: {err}", fix=f"fix or uninstall {package}") from None
        fingerprint = f"{dist}, {point.module} sha256 {_code_sha256(point)}"
        requirement = f"{point.dist.name}=={point.dist.version}" if point.dist else point.module
        if isinstance(obj, Architecture):
            found.append(replace(obj, name=point.name, build=_channels_fitted(obj.build), source=where,
                                 fingerprint=fingerprint, requirement=requirement))
            continue
        fields = obj if isinstance(obj, dict) else {}
        if not callable(fields.get("build")) or not isinstance(fields.get("classifier"), str):
            raise ConfigError(f"{where} registers {point.name!r} as {type(obj).__name__}, not an architecture",
                              fix="point it at a dict {'build': build(num_classes, in_channels) -> nn.Module, "
                                  "'classifier': 'dotted.name.of.head'} or a device.models.architectures.Architecture")
        unknown = set(fields) - {"build", "classifier", "torchvision_name", "preprocess", "inference_form"}
        if unknown:
            raise ConfigError(f"{where} gives {point.name!r} unknown fields {sorted(unknown)}",
                              fix="allowed: build, classifier, torchvision_name, preprocess, inference_form")
        found.append(Architecture(point.name, _channels_fitted(fields["build"]), fields["classifier"],
                                  fields.get("torchvision_name"), where, fields.get("preprocess"),
                                  inference_form=fields.get("inference_form"), fingerprint=fingerprint,
                                  requirement=requirement))
    return found


def _code_sha256(point) -> str:
    """The sha256 of the Python files an entry point's package installed (or, installed editable, of the module it
    names): a changed builder is another model, and the stages it fed must run again."""
    import hashlib
    import sys
    from pathlib import Path

    files = sorted(str(f) for f in (point.dist.files or []) if f.suffix == ".py") if point.dist else []
    paths = [Path(point.dist.locate_file(f)) for f in files] if files else []
    module = getattr(sys.modules.get(point.module), "__file__", None)
    if module and not any(path.resolve() == Path(module).resolve() for path in paths):
        paths.append(Path(module))  # editable installs record a finder, not the package's files
    digest = hashlib.sha256()
    for path in paths:
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(b"unreadable:" + str(path).encode())
    return digest.hexdigest()[:16] if paths else "unknown"


def _channels_fitted(build: Callable[[int, int], Any]) -> Callable[[int, int], Any]:
    """A user's builder whose model's stem is swapped to the asked channel count when it built another."""
    def fitted(num_classes: int, in_channels: int = 3, **size):  # size: input_size=, for a sized architecture
        return with_input_channels(build(num_classes, in_channels, **size), in_channels)

    return fitted


ARCHITECTURES = ArchitectureRegistry("architecture")


def stem_name(model) -> str:
    """The dotted name of the model's first convolution (every registered architecture begins with one)."""
    from torch import nn

    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            return name
    raise ValueError(f"{type(model).__name__} has no convolution to take the input")


def with_input_channels(model, in_channels: int):
    """``model`` with its stem replaced by the same convolution over ``in_channels`` inputs (freshly initialised)."""
    from torch import nn

    name = stem_name(model)
    stem = model.get_submodule(name)
    if stem.in_channels == in_channels:
        return model
    if stem.groups != 1:
        raise ValueError(f"the stem {name} of {type(model).__name__} is a grouped convolution")
    parent, _, attr = name.rpartition(".")
    replacement = nn.Conv2d(in_channels, stem.out_channels, stem.kernel_size, stride=stem.stride,
                            padding=stem.padding, dilation=stem.dilation, bias=stem.bias is not None,
                            padding_mode=stem.padding_mode)
    setattr(model.get_submodule(parent) if parent else model, attr, replacement)
    return model


def fold_stem_weight(weight, in_channels: int):
    """A stem kernel trained on RGB (out × 3 × k × k) for ``in_channels`` inputs: summed over RGB for grey, as timm's
    ``adapt_input_conv`` does, so a grey image x·(1,1,1) gives the same response as before; unchanged for 3."""
    if weight.shape[1] == in_channels:
        return weight
    if in_channels == 1 and weight.shape[1] == 3:
        return weight.sum(dim=1, keepdim=True)
    raise ValueError(f"cannot fold a stem of {weight.shape[1]} input channels to {in_channels}")


def _torchvision(name: str, classifier: str) -> None:
    def build(num_classes: int, in_channels: int = 3):
        import torchvision

        return with_input_channels(torchvision.models.get_model(name, weights=None, num_classes=num_classes),
                                   in_channels)

    ARCHITECTURES.add(name, Architecture(name, build, classifier, torchvision_name=name, source="built-in (torchvision)"))


for _name, _classifier in [
    ("resnet18", "fc"),
    ("resnet34", "fc"),
    ("resnet50", "fc"),
    ("resnet101", "fc"),
    ("mobilenet_v2", "classifier.1"),
    ("mobilenet_v3_small", "classifier.3"),
    ("mobilenet_v3_large", "classifier.3"),
    ("efficientnet_b0", "classifier.1"),
    ("regnet_y_400mf", "fc"),
]:
    _torchvision(_name, _classifier)


@functools.cache
def tiny_resnet_class():
    """``TinyResNet``: a three-stage residual net made of torchvision's own ``BasicBlock``.

    The test model of the registry (timm keeps ``test_*`` models the same way): residual adds and downsample
    branches exercise DepGraph's coupled channels, yet a whole pipeline run on ``digits`` takes seconds on two
    cores. Defined on first use, so that this module imports without torch.
    """
    import torch
    from torch import nn
    from torchvision.models.resnet import BasicBlock

    class TinyResNet(nn.Module):
        def __init__(self, num_classes: int = 10, in_channels: int = 3, widths: tuple[int, ...] = (16, 32, 64)):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
                                      nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True))
            blocks, channels = [], widths[0]
            for index, width in enumerate(widths):
                stride = 1 if index == 0 else 2
                downsample = None
                if stride != 1 or channels != width:
                    downsample = nn.Sequential(nn.Conv2d(channels, width, 1, stride=stride, bias=False),
                                               nn.BatchNorm2d(width))
                blocks.append(BasicBlock(channels, width, stride=stride, downsample=downsample))
                channels = width
            self.layers = nn.Sequential(*blocks)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(channels, num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))

    # Found by pickle and copy as device.models.architectures.TinyResNet (the module's __getattr__ below).
    TinyResNet.__module__, TinyResNet.__qualname__ = __name__, "TinyResNet"
    return TinyResNet


def __getattr__(name: str):
    if name == "TinyResNet":
        return tiny_resnet_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ARCHITECTURES.add("tiny_resnet", Architecture("tiny_resnet", lambda n, c=3: tiny_resnet_class()(n, in_channels=c),
                                              "fc", source="built-in (test model)"))


def build_model(arch: str, num_classes: int, in_channels: int = 3, input_size: int | None = None):
    """Builds an untrained model of a registered architecture for ``in_channels`` input channels (1 or 3).

    Args:
        input_size: The side of the input, for an architecture whose shape depends on it (:attr:`Architecture.sized`,
            a timm ViT); None builds it at its default size. Ignored by every other architecture.

    Raises:
        UnknownKeyError: ``arch`` is not registered (the error suggests near names).
    """
    entry = ARCHITECTURES.get(arch)
    if entry.sized and input_size:
        return entry.build(num_classes, in_channels, input_size=input_size)
    return entry.build(num_classes, in_channels)


def fold_batchnorm(model):
    """A copy of ``model`` (eval mode) with every BatchNorm that directly follows a Conv folded into it.

    Needed before fake quantization, on both sides alike (the build host calibrates, the device restores):
    otherwise the quantizers see unfolded weights and the exported graph keeps its BatchNorm nodes.
    """
    import copy

    import torch.fx
    from torch import nn
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    if not any(isinstance(m, nn.BatchNorm2d) for m in model.modules()):  # a ViT's: nothing to fold, nothing to trace
        return copy.deepcopy(model).eval()
    try:
        traced = torch.fx.symbolic_trace(copy.deepcopy(model).eval())
    except Exception as err:  # torch.fx's TraceError and the model's own code under tracing
        raise ConfigError(f"{type(model).__name__} cannot be traced by torch.fx to fold its BatchNorm "
                          f"({type(err).__name__}: {str(err)[:160]})",
                          fix="set quantize.qat: null (quantization-aware fine-tuning needs the folded model)") from None
    modules = dict(traced.named_modules())
    for node in list(traced.graph.nodes):
        if node.op != "call_module" or not isinstance(modules[node.target], nn.BatchNorm2d):
            continue
        conv = node.args[0]
        if conv.op == "call_module" and isinstance(modules[conv.target], nn.Conv2d) and len(conv.users) == 1:
            parent, _, name = conv.target.rpartition(".")
            setattr(traced.get_submodule(parent), name, fuse_conv_bn_eval(modules[conv.target], modules[node.target]))
            node.replace_all_uses_with(conv)
            traced.graph.erase_node(node)
            bn_parent, _, bn_name = node.target.rpartition(".")
            delattr(traced.get_submodule(bn_parent), bn_name)
    traced.graph.lint()
    traced.recompile()
    return traced
