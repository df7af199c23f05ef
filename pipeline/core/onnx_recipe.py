"""The recipe of ``MODEL=path/to/model.onnx``: an ONNX start (:mod:`pipeline.export.onnx_start`) with nothing else
written.

Its input size, channels and layout come from the file's input shape; its mean and std are ImageNet's, and the run
says they were assumed. A recipe with ``start: {onnx: path}`` states all of them instead. A file whose output is
three-dimensional is a detector (:mod:`pipeline.tasks.detection.onnx_start`): its layout is read from that shape.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from device.errors import ConfigError

IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
DEFAULT_SIZE = 224


def _dims(path: Path) -> tuple[list[Any], list[Any]]:
    """The first non-initialiser input's and the first output's dimensions (ints where static), or [] when the file
    does not parse: the export stage's preflight then says what is wrong with it."""
    try:
        import onnx

        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # any parse failure is reported, with the file's hash, by pipeline.export.onnx_start
        return [], []
    initialisers = {t.name for t in graph.initializer}
    image = next((i for i in graph.input if i.name not in initialisers), None)

    def dims(value) -> list[Any]:
        return [] if value is None else [d.dim_value if d.HasField("dim_value") else None
                                         for d in value.type.tensor_type.shape.dim]

    return dims(image), dims(graph.output[0] if graph.output else None)


def exported_size(path: Path) -> int | None:
    """The square size an Ultralytics export was made at (its metadata's ``imgsz``, ``[640, 640]``), or None."""
    try:
        import onnx

        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        sides = [int(v) for v in re.findall(r"\d+", props.get("imgsz", ""))]
    except Exception:  # noqa: BLE001 (no metadata: the caller assumes a size and says so)
        return None
    return sides[0] if sides and all(side == sides[0] for side in sides) else None


def _detector_recipe(path: Path, name: str, size: int | None, output: list[Any]) -> tuple[dict[str, Any], str]:
    """A detector's raw recipe: its output layout read from the output's shape (Ultralytics' exports: the shape
    ONNX Runtime gives on one zero image where the file leaves dimensions free), the COCO images letterboxed to its
    input size: the graph's own, else the size it was exported at (Ultralytics' metadata), else 640."""
    fixed = size
    recorded = None if size else exported_size(path)
    size = size or recorded or 640
    if not all(isinstance(d, int) for d in output[1:]):
        try:
            import numpy as np
            import onnxruntime as ort

            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            image = np.zeros((1, 3, size, size), np.float32)
            output = list(session.run(None, {session.get_inputs()[0].name: image})[0].shape)
        except Exception:  # noqa: BLE001 (the export stage's preflight says what is wrong with the file)
            pass
    first, last = (d if isinstance(d, int) else None for d in output[1:3])
    if last == 6 and (first is None or first <= 1000):  # an end-to-end model's few detections of six columns
        layout = "end2end"
    elif first is not None and last is not None:  # the longer side is the boxes': columns first is YOLOv8's
        layout = "yolov8" if first < last else "yolov5"
    else:
        layout = "yolov5" if last is not None else "yolov8"
    raw = {"name": name, "description": f"{path.name}, a detector started at export", "task": "detection",
           "start": {"onnx": str(path), "outputs": layout}, "data": {"canvas": {"size": size}}}
    where = ("" if fixed else f"; its height and width are free: {size} px, the size " + (
        "its metadata says it was exported at" if recorded else "assumed") + " (SET='data.canvas.size=N' to change)")
    said = (f"{path.name}'s output {output} read as {layout} (assumed from its shape: if not, "
            "SET='start.outputs=yolov8|yolov5|end2end'), images letterboxed to its input as Ultralytics does "
            f"({size} px, RGB in [0, 1]{where})")
    return raw, said


def ultralytics_onnx(checkpoint: Path, log=print) -> Path:
    """The ONNX export of an Ultralytics checkpoint (``MODEL=best.pt``), made with the user's own ``ultralytics``
    package (EdgeFold does not depend on it: AGPL-3.0) as ``yolo export … format=onnx dynamic=True`` makes it, beside
    the checkpoint; an export newer than the checkpoint is used as it is (a new one would carry a new date in its
    metadata, and every stage would run again). The command run is logged.

    Raises:
        ConfigError: No such file, no ``ultralytics`` importable (the export command to run by hand named), or the
            export failed (its last lines quoted).
    """
    import importlib.util
    import subprocess
    import sys

    if not checkpoint.is_file():
        raise ConfigError(f"{checkpoint} does not exist", fix="check the path (relative to where you run make)")
    exported = checkpoint.with_suffix(".onnx")
    by_hand = f"yolo export model={checkpoint} format=onnx dynamic=True"
    if exported.is_file() and exported.stat().st_mtime >= checkpoint.stat().st_mtime:
        log(f"{checkpoint.name}: using {exported} (exported after the checkpoint was written; delete it to export "
            "again)")
        return exported
    if importlib.util.find_spec("ultralytics") is None:
        raise ConfigError(f"{checkpoint} is a PyTorch checkpoint; EdgeFold starts a detector from its ONNX export, and "
                          "the ultralytics package that makes it is not importable here",
                          fix=f"export it: {by_hand}; then MODEL={exported} (or install ultralytics into this "
                              "environment, and EdgeFold runs that export itself)")
    code = (f"from ultralytics import YOLO; print(YOLO({str(checkpoint)!r}).export(format='onnx', dynamic=True))")
    command = [sys.executable, "-c", code]
    log(f"{checkpoint.name}: exporting with your ultralytics package (as {by_hand}): {' '.join(command[:2])} "
        f"\"{code}\"")
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0 or not exported.is_file():
        tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
        raise ConfigError(f"the ultralytics export of {checkpoint} failed (exit {result.returncode}): {tail}",
                          fix=f"run it by hand ({by_hand}) to see the whole error; then MODEL={exported}")
    return exported


def onnx_recipe(path: Path) -> tuple[dict[str, Any], str]:
    """The raw recipe of an ONNX file given as the model, and what it assumed, in words (the run logs it).

    Raises:
        ConfigError: When the file does not exist.
    """
    if not path.is_file():
        raise ConfigError(f"ONNX file {path} does not exist", fix="check the path (relative to where you run make)")
    dims, output = _dims(path)
    # Named after the whole file name: runs/model.onnx/ never resumes a run of a recipe named model.
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", path.name)
    if len(output) == 3:  # N×K×A or N×A×K: a detector's raw (or end-to-end) output
        return _detector_recipe(path, name, dims[2] if len(dims) == 4 and isinstance(dims[2], int) else None, output)
    nhwc = len(dims) == 4 and dims[3] in (1, 3) and dims[1] not in (1, 3)
    channels, height = (dims[3], dims[1]) if nhwc else (dims[1], dims[2]) if len(dims) == 4 else (3, None)
    channels = channels if channels in (1, 3) else 3
    size = height if isinstance(height, int) and height >= 4 else DEFAULT_SIZE
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ([0.449], [0.226])  # grey: RGB's average
    raw = {"name": name, "description": f"{path.name}, started at export",
           "start": {"onnx": str(path), "layout": "nhwc" if nhwc else "nchw"},
           "preprocess": {"input_size": size, "channels": channels, "mean": mean, "std": std}}
    said = (f"{path.name}'s input ({'NHWC' if nhwc else 'NCHW'}, {channels} channel{'s' if channels > 1 else ''}"
            + (f", {size} px" if size == height else f"; its size is not fixed: {size} px assumed")
            + ") and ImageNet's mean and std (assumed: if the model was trained otherwise, SET='preprocess.mean=[…] "
              "preprocess.std=[…]')")
    return raw, said
