"""A STAND-IN for GStreamer (``gi.repository.Gst``, ``GLib``) and DeepStream's Python bindings (``pyds``): neither
exists off a Jetson or a DeepStream container. It has what the shipped ``deepstream/app.py`` calls, shaped as
NVIDIA's deepstream_python_apps samples use it (deepstream-test1's pipeline, deepstream-ssd-parser's tensor-meta probe
and object meta, deepstream-segmentation's ``get_segmentation_masks``) and as the bindings declare it
(``bindings/src/bindnvdsinfer.cpp``: a layer's ``layerName``, ``dataType``, ``inferDims.d``/``numDims``, ``buffer``;
``pyds.get_ptr`` its C address). It records the pipeline (elements, properties, links, the probe) and feeds the probe
frames whose tensors a test computed: the decode is the app's own, on the tensors nvinfer would attach.
"""

from __future__ import annotations

import ctypes
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class Pad:
    def __init__(self, element: "Element", name: str):
        self.element, self.name, self.linked, self.probes = element, name, [], []

    def link(self, other: "Pad") -> int:
        self.linked.append(other)
        return 0

    def add_probe(self, kind, callback, data) -> int:
        self.probes.append((kind, callback, data))
        return len(self.probes)


class Element:
    def __init__(self, factory: str, name: str):
        self.factory, self.name, self.properties, self.links, self.signals = factory, name, {}, [], {}
        self.pads: dict[str, Pad] = {}

    def set_property(self, key: str, value: Any) -> None:
        self.properties[key] = value

    def get_static_pad(self, name: str) -> Pad:
        return self.pads.setdefault(name, Pad(self, name))

    request_pad_simple = get_static_pad

    def link(self, other: "Element") -> bool:
        self.links.append(other)
        return True

    def connect(self, signal: str, callback) -> None:
        self.signals[signal] = callback


class Pipeline(Element):
    def __init__(self):
        super().__init__("pipeline", "pipeline")
        self.elements: list[Element] = []

    def add(self, element: Element) -> None:
        self.elements.append(element)

    def chain(self) -> list[str]:
        """The factories from the muxer on, following links."""
        mux = next(e for e in self.elements if e.factory == "nvstreammux")
        found, current = [], mux
        while current is not None:
            found.append(current.factory)
            current = current.links[0] if current.links else None
        return found


KNOWN = {"uridecodebin", "v4l2src", "nvstreammux", "nvinfer", "nvvideoconvert", "nvdsosd", "nvsegvisual",
         "nveglglessink", "nv3dsink", "nvv4l2h264enc", "h264parse", "qtmux", "filesink"}


def gst_module() -> types.ModuleType:
    gst = types.ModuleType("gi.repository.Gst")
    gst.init = lambda args: None
    gst.Pipeline = Pipeline
    gst.ElementFactory = types.SimpleNamespace(make=lambda factory, name: Element(factory, name)
                                               if factory in KNOWN else None)
    gst.PadProbeType = types.SimpleNamespace(BUFFER=16)
    gst.PadProbeReturn = types.SimpleNamespace(OK=1)
    gst.State = types.SimpleNamespace(PLAYING=4, NULL=1)
    gst.MessageType = types.SimpleNamespace(EOS=1, ERROR=2)
    return gst


# -- pyds ----------------------------------------------------------------------------------------------------------
class GList:
    def __init__(self, items: list):
        self.data, rest = items[0], items[1:]
        self.next = GList(rest) if rest else None


def glist(items: list) -> GList | None:
    return GList(items) if items else None


class Color:
    def set(self, *rgba) -> None:
        self.rgba = rgba


@dataclass
class Rect:
    left: float = 0.0
    top: float = 0.0
    width: float = 0.0
    height: float = 0.0
    border_width: int = 0
    border_color: Color = field(default_factory=Color)


@dataclass
class Text:
    display_text: str = ""
    x_offset: int = 0
    y_offset: int = 0


@dataclass
class ObjectMeta:
    rect_params: Rect = field(default_factory=Rect)
    text_params: Text = field(default_factory=Text)
    confidence: float = 0.0
    class_id: int = -1
    object_id: int = 0
    obj_label: str = ""


@dataclass
class DisplayMeta:
    num_labels: int = 0
    text_params: list = field(default_factory=lambda: [Text() for _ in range(16)])


@dataclass
class Dims:
    d: list
    numDims: int


class Layer:
    """An output layer as nvinfer's tensor meta holds it: its host copy in C memory (``buffer``)."""

    def __init__(self, name: str, array: np.ndarray):
        self.layerName, self.dataType = name, 0 if array.dtype == np.float32 else 1
        self.inferDims = Dims(list(array.shape) + [0] * (8 - array.ndim), array.ndim)
        self._memory = (ctypes.c_byte * array.nbytes).from_buffer_copy(np.ascontiguousarray(array).tobytes())
        self.buffer = self._memory


def _meta(kind: int, data: Any):
    return types.SimpleNamespace(base_meta=types.SimpleNamespace(meta_type=kind), user_meta_data=data)


def frame(frame_num: int, tensors: dict[str, np.ndarray] | None = None, class_map: np.ndarray | None = None):
    """One frame's meta as nvinfer leaves it: its output layers (``output-tensor-meta=1``) or its class map
    (``network-type=2``) in the frame's user meta."""
    user = []
    if tensors is not None:
        layers = [Layer(name, array) for name, array in tensors.items()]
        user.append(_meta(TENSOR_META, types.SimpleNamespace(num_output_layers=len(layers), layers=layers)))
    if class_map is not None:
        user.append(_meta(SEGMENTATION_META, types.SimpleNamespace(class_map=class_map)))
    meta = types.SimpleNamespace(frame_num=frame_num, source_id=0, frame_user_meta_list=glist(user), objects=[],
                                 displays=[])
    return meta


TENSOR_META, SEGMENTATION_META = 12, 13
_BATCHES: dict[int, Any] = {}


def pyds_module() -> types.ModuleType:
    pyds = types.ModuleType("pyds")
    identity = types.SimpleNamespace(cast=lambda value: value)
    pyds.NvDsFrameMeta = pyds.NvDsUserMeta = pyds.NvDsInferTensorMeta = pyds.NvDsInferSegmentationMeta = identity
    pyds.NvDsMetaType = types.SimpleNamespace(NVDSINFER_TENSOR_OUTPUT_META=TENSOR_META,
                                              NVDSINFER_SEGMENTATION_META=SEGMENTATION_META)
    pyds.gst_buffer_get_nvds_batch_meta = lambda address: _BATCHES[address]
    pyds.get_nvds_LayerInfo = lambda tensor_meta, index: tensor_meta.layers[index]
    pyds.get_ptr = lambda buffer: ctypes.addressof(buffer)
    pyds.get_segmentation_masks = lambda meta: meta.class_map
    pyds.nvds_acquire_obj_meta_from_pool = lambda batch_meta: ObjectMeta()
    pyds.nvds_add_obj_meta_to_frame = lambda frame_meta, obj, parent: frame_meta.objects.append(obj)
    pyds.nvds_acquire_display_meta_from_pool = lambda batch_meta: DisplayMeta()
    pyds.nvds_add_display_meta_to_frame = lambda frame_meta, display: frame_meta.displays.append(display)
    return pyds


def install(monkeypatch) -> None:
    """``gi``, ``gi.repository`` and ``pyds`` as the app imports them."""
    gi = types.ModuleType("gi")
    gi.require_version = lambda name, version: None
    repository = types.ModuleType("gi.repository")
    repository.Gst = gst_module()
    repository.GLib = types.SimpleNamespace(MainLoop=lambda: types.SimpleNamespace(run=lambda: None,
                                                                                   quit=lambda: None))
    gi.repository = repository
    for name, module in (("gi", gi), ("gi.repository", repository), ("pyds", pyds_module())):
        monkeypatch.setitem(sys.modules, name, module)


def run_probe(probe, frames: list) -> list:
    """Calls the probe on one buffer carrying ``frames`` (a batch of one or more), as nvinfer's src pad would."""
    buffer = object()
    _BATCHES[hash(buffer)] = types.SimpleNamespace(frame_meta_list=glist(frames))
    try:
        assert probe(None, types.SimpleNamespace(get_buffer=lambda: buffer), 0) == 1
    finally:
        del _BATCHES[hash(buffer)]
    return frames


def load_app(folder, monkeypatch):
    """The shipped deepstream/app.py imported with the stand-in installed."""
    import importlib.util

    install(monkeypatch)
    spec = importlib.util.spec_from_file_location(f"shipped_app_{abs(hash(str(folder)))}",
                                                  folder / "deepstream" / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.HERE, module.BUNDLE = folder / "deepstream", folder
    return module


def built_app(folder, monkeypatch, source: str, width: int, height: int, out: str | None = None):
    """The shipped app's pipeline for ``source`` at nvstreammux's ``width`` × ``height``, its probe, and the list the
    probe keeps each frame's answer in."""
    app = load_app(folder, monkeypatch)
    _, gst, pyds = app._imports()
    answers, kept = app.Answers(folder), []
    probe = app.make_probe(pyds, gst, answers, kept, width, height)
    return app.build(gst, source, out, answers, width, height, probe), probe, kept
