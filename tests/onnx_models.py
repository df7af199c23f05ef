"""ONNX files made by the tests for the ONNX start (:mod:`pipeline.export.onnx_start`): a torchvision classifier that is
not in EdgeFold's registry (ShuffleNetV2 ×0.5), trained for a few epochs on scikit-learn's digits at 32 px with the
preprocessing the test recipes declare, and exported as a user's training code would; nothing is downloaded.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import numpy as np

ARCH = "shufflenet_v2_x0_5"  # torchvision's; not a key of device.models.architectures (checked by the tests)
SIZE = 32
MEAN, STD = [0.3, 0.3, 0.3], [0.38, 0.38, 0.38]
PREPROCESS = {"input_size": SIZE, "channels": 3, "mean": MEAN, "std": STD}


@functools.cache
def trained_state() -> dict:
    """The classifier's state after four seeded epochs on the digits' training split (about 25 s on two cores,
    86% top-1 on its test split)."""
    import torch
    import torchvision

    from device.preprocess import Preprocess
    from pipeline.core.data.sources import load_source

    train = load_source("digits").train
    preprocess = Preprocess(input_size=SIZE, resize=SIZE, channels=3, mean=tuple(MEAN), std=tuple(STD))
    images = torch.from_numpy(np.concatenate([preprocess(train.image(i)) for i in range(len(train))]))
    labels = torch.from_numpy(train.labels).long()
    torch.manual_seed(0)
    model = torchvision.models.get_model(ARCH, weights=None, num_classes=10)
    optimizer = torch.optim.AdamW(model.parameters(), 3e-3)
    model.train()
    for _ in range(4):
        order = torch.randperm(len(images))
        for start in range(0, len(images), 32):
            chosen = order[start : start + 32]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(images[chosen]), labels[chosen]).backward()
            optimizer.step()
    return {key: value.clone() for key, value in model.eval().state_dict().items()}


def trained_model(layout: str = "nchw"):
    """The trained classifier; for ``nhwc`` behind a permute, as a TensorFlow-style graph takes its images."""
    import torch
    import torchvision

    model = torchvision.models.get_model(ARCH, weights=None, num_classes=10)
    model.load_state_dict(trained_state())
    if layout == "nhwc":
        class ChannelsLast(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return self.inner(x.permute(0, 3, 1, 2))

        model = ChannelsLast(model)
    return model.eval()


def export(model, path: Path, shape: tuple[int, ...], dynamic_batch: bool = True, opset: int = 17,
           input_names: tuple[str, ...] = ("images",), output_names: tuple[str, ...] = ("scores",),
           keep_initializers_as_inputs: bool = False) -> Path:
    """``torch.onnx.export`` as a user's training code calls it (their own I/O names)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = tuple(torch.zeros(shape) for _ in input_names)
        torch.onnx.export(model, args, str(path), dynamo=False, opset_version=opset, input_names=list(input_names),
                          output_names=list(output_names),
                          dynamic_axes={name: {0: "n"} for name in (*input_names, *output_names)} if dynamic_batch
                          else None, keep_initializers_as_inputs=keep_initializers_as_inputs)
    return path


def trained_onnx(path: Path, layout: str = "nchw", dynamic_batch: bool = True, opset: int = 17) -> Path:
    """The trained classifier as an ONNX file of the given layout, batch and opset."""
    shape = (1, 3, SIZE, SIZE) if layout == "nchw" else (1, SIZE, SIZE, 3)
    return export(trained_model(layout), path, shape, dynamic_batch, opset)


if __name__ == "__main__":  # python -m tests.onnx_models shufflenet.onnx: the README's example of a user's file
    import sys

    print(trained_onnx(Path(sys.argv[1] if len(sys.argv) > 1 else "shufflenet.onnx")))
