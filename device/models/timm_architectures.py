"""``timm/<name>``: any of timm's architectures as a registry key (:class:`device.models.architectures.ArchitectureRegistry`).

timm (PyTorch Image Models) is where most image models people bring to a Jetson come from. A key is resolved on
first use: the model is built by ``timm.create_model(name, pretrained=False, num_classes=…, in_chans=…)``, never
downloaded (weights come from a file, ``WEIGHTS=path``); the head to keep unpruned and to replace for another class
count is the one timm's ``pretrained_cfg`` names, and so is the preprocessing a recipe may leave to the model.
Imports timm (and so torch) only when a ``timm/`` key is asked for.
"""

from __future__ import annotations

import difflib
import math

from device.errors import ConfigError, UnknownKeyError, require
from device.preprocess import _INTERPOLATIONS

VERSION = "1.0.31"  # setup.cfg's pin (the build side, and the torch-tensorrt agent that rebuilds models)
INSTALL = f"pip install timm=={VERSION} (make venv installs it; on a device, into the agent's environment)"
SINGLE_HEAD = ":single_head"
"""``timm/<name>:single_head``: a distilled model built without its distillation head (timm's ``distillation=False``
or ``distilled=False``), for a user training from scratch."""


def _timm():
    return require("timm", "timm", INSTALL)


def architecture_fields(name: str) -> dict:
    """The fields of the :class:`device.models.architectures.Architecture` of timm's ``name`` (without the ``timm/`` prefix;
    the registry builds it, so that this module needs nothing of the registry's).

    Raises:
        UnknownKeyError: timm has no such model; the nearest of its names are suggested.
        ConfigError: The model does not name its classifier.
    """
    timm = _timm()
    key, single = name, name.endswith(SINGLE_HEAD)
    name = name.removesuffix(SINGLE_HEAD)
    if not timm.is_model(name):
        near = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(repr('timm/' + n) for n in near)}? " if near else ""
        raise UnknownKeyError(f"unknown architecture 'timm/{name}': timm {timm.__version__} has no model {name!r}",
                              fix=f"{hint}timm.list_models('*{name[:4]}*') lists its names")
    try:
        cfg = timm.get_pretrained_cfg(name)
    except RuntimeError as err:  # a model timm has, with a pretrained tag it has not ("resnet18.bogus")
        tags = timm.list_pretrained(f"{name.split('.')[0]}.*")
        raise UnknownKeyError(f"unknown architecture 'timm/{name}': {err}",
                              fix=f"its tags: {', '.join(tags[:6])}" if tags else "leave the tag out") from None
    classifier, *extra_heads = _heads(timm, name, cfg)
    options = _single_head_option(timm, name, extra_heads) if single else {}
    extra_heads = [] if single else extra_heads
    # A ViT, Swin or LeViT is built for one input size (its position embedding, its windows): timm marks it so.
    sized = bool(cfg is not None and cfg.fixed_input_size)

    def build(num_classes: int, in_channels: int = 3, input_size: int | None = None):
        size = {"img_size": input_size} if sized and input_size else {}
        return timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_channels, **size,
                                 **options)

    return {"name": f"timm/{key}", "build": build, "classifier": classifier, "source": f"timm {timm.__version__}",
            "preprocess": lambda: pretrained_preprocess(name, cfg), "sized": sized, "inference_form": inference_form,
            "fingerprint": f"timm {timm.__version__}", "requirement": f"timm=={timm.__version__}",
            "extra_heads": tuple(extra_heads)}


def _single_head_option(timm, name: str, extra_heads: list[str]) -> dict:
    """The keyword that builds timm's ``name`` without its distillation head(s) ``extra_heads``.

    Raises:
        ConfigError: ``name`` has one head already, or timm builds it only with both.
    """
    import torch

    if not extra_heads:
        raise ConfigError(f"timm/{name}{SINGLE_HEAD}: timm/{name} has one head already", fix=f"use timm/{name}")
    for option in ({"distillation": False}, {"distilled": False}):  # RepViT, EfficientFormerV2; LeViT, PiT
        try:
            modules = dict(timm.create_model(name, pretrained=False, num_classes=2, **option).named_modules())
        except TypeError:  # the model takes the other keyword, or neither
            continue
        if not any(isinstance(modules.get(head), torch.nn.Linear) for head in extra_heads):
            return option
    raise ConfigError(f"timm/{name}{SINGLE_HEAD}: timm builds {name} only with its distillation head(s) "
                      f"({', '.join(extra_heads)})",
                      fix=f"train both heads (timm/{name}: they are averaged, as timm runs them), or take the model's "
                          "undistilled form (deit_small_patch16_224 for deit_small_distilled_patch16_224)")


def inference_form(model):
    """A copy of ``model`` with timm's train-time branches folded (``reparameterize_model``: every block with a
    ``reparameterize`` or ``fuse`` method, as RepVGG, MobileOne, FastViT and RepViT have); unchanged otherwise."""
    from timm.utils.model import reparameterize_model

    if getattr(model, "_edgefold_folded", False):  # folding twice breaks FastViT (its RepMixer is replaced)
        return model
    if not any(hasattr(m, "reparameterize") or hasattr(m, "fuse") for m in model.modules()):
        return model
    folded = reparameterize_model(model)
    folded._edgefold_folded = True
    return folded


def _heads(timm, name: str, cfg) -> list[str]:
    """The classifier timm's ``pretrained_cfg`` names, then any distillation head beside it.

    A distilled model (RepViT, DeiT distilled, LeViT, EfficientFormer and V2) has two heads and, out of timm's
    ``distilled_training`` mode, returns their average in training and in evaluation alike: EdgeFold builds and trains
    it so. Where both heads read the same feature, the inference form folds them into one layer (RepViT's classifier
    ``fuse``, through ``reparameterize_model``); where they read different tokens (DeiT, PiT) the graph keeps both."""
    classifier = getattr(cfg, "classifier", None) if cfg is not None else None
    if classifier is None:  # no pretrained config: find the head a built model reports
        model = timm.create_model(name, pretrained=False, num_classes=2)
        heads = model.get_classifier()
        names = {m: n for n, m in reversed(list(model.named_modules()))}
        classifier = [names.get(head) for head in (heads if isinstance(heads, (tuple, list)) else [heads])]
        if None in classifier:
            raise ConfigError(f"timm/{name} does not name its classifier", fix="choose another timm architecture")
    return list(classifier) if isinstance(classifier, (tuple, list)) else [classifier]


def pretrained_preprocess(name: str, cfg=None) -> dict:
    """The preprocessing timm's ``pretrained_cfg`` gives ``name``: its input size, mean, std and interpolation, and the
    shorter side before the centre crop (``input_size / crop_pct``, as timm's eval transform resizes). ``cfg`` is the
    model's ``pretrained_cfg`` when the caller has it already.

    Raises:
        ConfigError: The model has no such config, or one that :class:`device.preprocess.Preprocess` cannot state
            (a non-square input); the fix is to write ``preprocess`` in the recipe.
    """
    cfg = cfg if cfg is not None else _timm().get_pretrained_cfg(name)
    fix = "write the preprocess section in the recipe (input_size, mean, std, interpolation)"
    if cfg is None or not cfg.input_size or not cfg.mean or not cfg.std:
        raise ConfigError(f"timm/{name} has no pretrained_cfg to take the preprocessing from", fix=fix)
    channels, height, width = cfg.input_size
    if height != width:
        raise ConfigError(f"timm/{name} was trained at {height}×{width}, not a square input", fix=fix)
    if channels not in (1, 3) or len(cfg.mean) != channels:
        raise ConfigError(f"timm/{name}'s pretrained_cfg gives {channels} input channels", fix=fix)
    crop = cfg.crop_pct or 1.0
    return {"input_size": int(height), "resize": max(int(height), int(math.floor(height / crop))),
            "channels": int(channels), "mean": [float(v) for v in cfg.mean], "std": [float(v) for v in cfg.std],
            # 'random' and the like are train-time choices: evaluation resizes bilinearly then
            "interpolation": cfg.interpolation if cfg.interpolation in _INTERPOLATIONS else "bilinear"}
