"""The recipe of ``MODEL=path/to/model.onnx``: an ONNX start (:mod:`pipeline.onnx_start`) with nothing else written.

Its input size, channels and layout come from the file's input shape; its mean and std are ImageNet's, and the run
says they were assumed. A recipe with ``start: {onnx: path}`` states all of them instead.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from device.errors import ConfigError

IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
DEFAULT_SIZE = 224


def _input_dims(path: Path) -> list[Any]:
    """The first non-initialiser input's dimensions (ints where static), or [] when the file does not parse: the
    export stage's preflight then says what is wrong with it."""
    try:
        import onnx

        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # any parse failure is reported, with the file's hash, by pipeline.onnx_start
        return []
    initialisers = {t.name for t in graph.initializer}
    image = next((i for i in graph.input if i.name not in initialisers), None)
    if image is None:
        return []
    return [d.dim_value if d.HasField("dim_value") else None for d in image.type.tensor_type.shape.dim]


def onnx_recipe(path: Path) -> tuple[dict[str, Any], str]:
    """The raw recipe of an ONNX file given as the model, and what it assumed, in words (the run logs it).

    Raises:
        ConfigError: When the file does not exist.
    """
    if not path.is_file():
        raise ConfigError(f"ONNX file {path} does not exist", fix="check the path (relative to where you run make)")
    dims = _input_dims(path)
    nhwc = len(dims) == 4 and dims[3] in (1, 3) and dims[1] not in (1, 3)
    channels, height = (dims[3], dims[1]) if nhwc else (dims[1], dims[2]) if len(dims) == 4 else (3, None)
    channels = channels if channels in (1, 3) else 3
    size = height if isinstance(height, int) and height >= 4 else DEFAULT_SIZE
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ([0.449], [0.226])  # grey: RGB's average
    # Named after the whole file name: runs/model.onnx/ never resumes a run of a recipe named model.
    raw = {"name": re.sub(r"[^A-Za-z0-9_.-]", "_", path.name), "description": f"{path.name}, started at export",
           "start": {"onnx": str(path), "layout": "nhwc" if nhwc else "nchw"},
           "preprocess": {"input_size": size, "channels": channels, "mean": mean, "std": std}}
    said = (f"{path.name}'s input ({'NHWC' if nhwc else 'NCHW'}, {channels} channel{'s' if channels > 1 else ''}"
            + (f", {size} px" if size == height else f"; its size is not fixed: {size} px assumed")
            + ") and ImageNet's mean and std (assumed: if the model was trained otherwise, SET='preprocess.mean=[…] "
              "preprocess.std=[…]')")
    return raw, said
