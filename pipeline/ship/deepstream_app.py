"""Runs the shipped rung in DeepStream and prints each frame's answer (written by ``edgefold ship`` as
``deepstream/app.py``; standalone, run on the device from any directory).

    python3 app.py file:///home/me/video.mp4             # a file, drawn on the screen
    python3 app.py rtsp://camera/stream --out out.mp4     # RTSP in, an annotated H.264 file out
    python3 app.py /dev/video0 --json answers.json        # a V4L2 camera, every frame's answer kept

Built the way NVIDIA's deepstream_python_apps build theirs (deepstream-test1, deepstream-ssd-parser,
deepstream-segmentation): source → nvstreammux → nvinfer (``config_infer.txt`` beside this file) → a probe on
nvinfer's src pad → nvvideoconvert → nvdsosd (nvsegvisual for a segmenter) → sink. The probe reads what nvinfer
attached: a classifier's and a detector's raw output tensors (``output-tensor-meta=1``), decoded with the arithmetic
the rung was scored with (a detector with ``../detection_post.py``, the decoder the device measured with, its boxes
mapped back through nvinfer's letterbox into frame coordinates and attached as object meta for nvdsosd); a
segmenter's class map (``network-type=2``), drawn by nvsegvisual.

Needs DeepStream 6.x/7.x with its Python bindings — ``pyds``, the wheel published with each deepstream_python_apps
release for its DeepStream (PyPI's ``pyds`` is an unrelated project) — GStreamer's ``gi`` and NumPy.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BUNDLE = HERE.parent
MUXER_BATCH_TIMEOUT_USEC = 33000  # deepstream_python_apps' value: a batch waits at most one 30 fps frame


def _imports():
    """GStreamer and pyds, or what to install."""
    try:
        import gi

        gi.require_version("Gst", "1.0")
        from gi.repository import GLib, Gst
        import pyds
    except (ImportError, ValueError) as err:
        sys.exit(f"error: {err}\n  fix: run this on a device with DeepStream and its Python bindings: install the "
                 "pyds wheel of the deepstream_python_apps release for your DeepStream (not PyPI's pyds), and "
                 "python3-gi")
    return GLib, Gst, pyds


def read_config(path: Path) -> dict[str, str]:
    """config_infer.txt's [property] keys."""
    keys, group = {}, None
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1]
        elif group == "property" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            keys[key.strip()] = value.strip()
    return keys


def letterbox(width: int, height: int, size: int, centred: bool) -> tuple[float, float, float]:
    """nvinfer's maintain-aspect-ratio=1: (factor, left, top) of a width×height frame scaled into the size×size
    network input, at the top-left corner or centred (symmetric-padding=1)."""
    factor = min(size / width, size / height)
    new_w, new_h = max(1, int(round(width * factor))), max(1, int(round(height * factor)))
    return (factor, (size - new_w) // 2, (size - new_h) // 2) if centred else (factor, 0, 0)


class Answers:
    """What the probe makes of nvinfer's output for one frame, by the task (``postprocess.json``'s ``kind``)."""

    def __init__(self, bundle: Path = BUNDLE, score_threshold: float | None = None):
        self.post = json.loads((bundle / "postprocess.json").read_text())
        self.labels = (bundle / "labels.txt").read_text().splitlines()
        self.keys = read_config(bundle / "deepstream" / "config_infer.txt")
        self.kind = self.post["kind"]
        self.size = int(self.keys["infer-dims"].split(";")[-1])
        if self.kind == "detection":
            sys.path.insert(0, str(bundle))
            from detection_post import head_spec_from_dict

            head = dict(self.post["head"])
            if score_threshold is not None:
                head["postprocess"] = {**head.get("postprocess", {}), "score_threshold": score_threshold}
            self.spec = head_spec_from_dict(head, "postprocess.json")
            self.maintain = self.keys.get("maintain-aspect-ratio") == "1"
            self.centred = self.keys.get("symmetric-padding") == "1"

    def classify(self, probabilities: np.ndarray) -> dict:
        """The top classes of the graph's probabilities (the DeepStream graph ends in the Softmax)."""
        values = probabilities.reshape(-1).astype(np.float64)
        top = np.argsort(-values, kind="stable")[:self.post.get("top_k", 5)]
        return {"top": [[int(k), self.labels[k], float(values[k])] for k in top]}

    def detect(self, raw: np.ndarray, width: int, height: int) -> dict:
        """The boxes in the frame's pixels (nvstreammux's width × height): decoded in the network's pixels by the
        shipped decoder, then mapped back through nvinfer's scaling (letterboxed or stretched)."""
        from detection_post import postprocess

        found = postprocess(self.spec, raw[None].astype(np.float32))[0]
        boxes = found["boxes"].astype(np.float64)
        if self.maintain:
            factor, left, top = letterbox(width, height, self.size, self.centred)
            boxes = (boxes - [left, top, left, top]) / factor
        else:
            boxes = boxes * [width / self.size, height / self.size, width / self.size, height / self.size]
        boxes = np.clip(boxes, 0, [width, height, width, height])
        return {"boxes": boxes.tolist(), "scores": [float(s) for s in found["scores"]],
                "classes": [int(k) for k in found["labels"]], "labels": [self.labels[int(k)] for k in found["labels"]]}

    def segment(self, class_map: np.ndarray) -> dict:
        """Each class's share of the frame (nvinfer's class map; -1 where no class passed the threshold)."""
        counts = np.bincount(class_map[class_map >= 0].reshape(-1).astype(np.int64), minlength=len(self.labels))
        shares = counts / max(1, class_map.size)
        return {"shares": {self.labels[k]: round(float(shares[k]), 4) for k in np.argsort(-shares) if shares[k] > 0}}


def layer_array(pyds, layer) -> np.ndarray:
    """One output layer of nvinfer's tensor meta as a NumPy array (its host copy), without the batch axis."""
    dims = tuple(layer.inferDims.d[:layer.inferDims.numDims])
    ctype = ctypes.c_float if layer.dataType == 0 else ctypes.c_uint16  # FLOAT, else HALF
    pointer = ctypes.cast(pyds.get_ptr(layer.buffer), ctypes.POINTER(ctype))
    array = np.ctypeslib.as_array(pointer, shape=dims).copy()
    return array.view(np.float16).astype(np.float32) if layer.dataType != 0 else array


def _each(glist, cast):
    while glist is not None:
        try:
            yield cast(glist.data)
            glist = glist.next
        except StopIteration:
            break


def make_probe(pyds, Gst, answers: Answers, kept: list, width: int, height: int):
    """The buffer probe on nvinfer's src pad: each frame's answer from the meta nvinfer attached, kept in ``kept``,
    printed, and drawn (a detector's boxes as object meta for nvdsosd; a classifier's top class as display text).
    ``width`` × ``height``: nvstreammux's frames, the ones nvinfer scaled into the network's input."""
    outputs = answers.post.get("outputs") or []

    def probe(pad, info, u_data):
        buffer = info.get_buffer()
        if not buffer:
            return Gst.PadProbeReturn.OK
        batch_meta = pyds.gst_buffer_get_nvds_batch_meta(hash(buffer))
        for frame_meta in _each(batch_meta.frame_meta_list, pyds.NvDsFrameMeta.cast):
            answer = None
            for user_meta in _each(frame_meta.frame_user_meta_list, pyds.NvDsUserMeta.cast):
                kind = user_meta.base_meta.meta_type
                if kind == pyds.NvDsMetaType.NVDSINFER_SEGMENTATION_META:
                    segmentation = pyds.NvDsInferSegmentationMeta.cast(user_meta.user_meta_data)
                    answer = answers.segment(np.array(pyds.get_segmentation_masks(segmentation), copy=True))
                elif kind == pyds.NvDsMetaType.NVDSINFER_TENSOR_OUTPUT_META and answers.kind != "segmentation":
                    tensor_meta = pyds.NvDsInferTensorMeta.cast(user_meta.user_meta_data)
                    layers = {}
                    for index in range(tensor_meta.num_output_layers):
                        layer = pyds.get_nvds_LayerInfo(tensor_meta, index)
                        layers[layer.layerName] = layer_array(pyds, layer)
                    first = layers.get(outputs[0]) if outputs and outputs[0] in layers else next(iter(layers.values()))
                    if answers.kind == "classification":
                        answer = answers.classify(first)
                        _text(pyds, batch_meta, frame_meta, f"{answer['top'][0][1]} {answer['top'][0][2]:.2f}")
                    else:
                        answer = answers.detect(first, width, height)
                        for box, score, cls in zip(answer["boxes"], answer["scores"], answer["classes"]):
                            _object(pyds, batch_meta, frame_meta, box, score, cls, answers.labels[cls])
            if answer is not None:
                kept.append({"frame": frame_meta.frame_num, "source": frame_meta.source_id, **answer})
                shown = answer.get("top") or list(answer.get("shares", {}).items()) or list(
                    zip(answer["labels"], answer["scores"]))
                print(f"frame {frame_meta.frame_num}: {shown[:3]}")
        return Gst.PadProbeReturn.OK

    return probe


def _object(pyds, batch_meta, frame_meta, box, score: float, cls: int, label: str) -> None:
    """One detection as object meta (deepstream-ssd-parser's add_obj_meta_to_frame), for nvdsosd to draw."""
    obj_meta = pyds.nvds_acquire_obj_meta_from_pool(batch_meta)
    rect = obj_meta.rect_params
    rect.left, rect.top = float(box[0]), float(box[1])
    rect.width, rect.height = float(box[2] - box[0]), float(box[3] - box[1])
    rect.border_width = 2
    rect.border_color.set(1.0, 0.0, 0.0, 1.0)
    obj_meta.confidence = float(score)
    obj_meta.class_id = int(cls)
    obj_meta.object_id = 0xFFFFFFFFFFFFFFFF  # untracked: a tracker assigns ids
    obj_meta.obj_label = label
    text = obj_meta.text_params
    text.display_text = f"{label} {score:.2f}"
    text.x_offset, text.y_offset = int(rect.left), max(0, int(rect.top) - 10)
    pyds.nvds_add_obj_meta_to_frame(frame_meta, obj_meta, None)


def _text(pyds, batch_meta, frame_meta, words: str) -> None:
    display = pyds.nvds_acquire_display_meta_from_pool(batch_meta)
    display.num_labels = 1
    text = display.text_params[0]
    text.display_text = words
    text.x_offset, text.y_offset = 10, 12
    pyds.nvds_add_display_meta_to_frame(frame_meta, display)


def _make(Gst, factory: str, name: str, **properties):
    element = Gst.ElementFactory.make(factory, name)
    if element is None:
        sys.exit(f"error: GStreamer has no element {factory}\n  fix: run this where DeepStream is installed "
                 "(its plugins register nvstreammux, nvinfer, nvdsosd …)")
    for key, value in properties.items():
        element.set_property(key, value)
    return element


def build(Gst, source: str, out: str | None, answers: Answers, width: int, height: int, probe):
    """The pipeline: source → nvstreammux → nvinfer → (probe) → nvvideoconvert → nvdsosd | nvsegvisual → sink."""
    pipeline = Gst.Pipeline()
    if source.startswith("/dev/video"):
        src = _make(Gst, "v4l2src", "camera", device=source)
        convert_in = _make(Gst, "nvvideoconvert", "camera-convert")
        chain_in = [src, convert_in]
    else:
        uri = source if "://" in source else Path(source).resolve().as_uri()
        src = _make(Gst, "uridecodebin", "source", uri=uri)
        chain_in = [src]
    mux = _make(Gst, "nvstreammux", "mux", width=width, height=height, **{"batch-size": 1,
                "batched-push-timeout": MUXER_BATCH_TIMEOUT_USEC, "live-source": int("://" in source
                                                                                     and not source.startswith("file"))})
    infer = _make(Gst, "nvinfer", "primary-inference", **{"config-file-path": str(HERE / "config_infer.txt")})
    convert = _make(Gst, "nvvideoconvert", "convert")
    if answers.kind == "segmentation":
        draw = _make(Gst, "nvsegvisual", "segvisual", **{"batch-size": 1, "width": width, "height": height})
    else:
        draw = _make(Gst, "nvdsosd", "osd")
    if out:
        tail = [_make(Gst, "nvvideoconvert", "encode-convert"), _make(Gst, "nvv4l2h264enc", "encoder"),
                _make(Gst, "h264parse", "parser"), _make(Gst, "qtmux", "container"),
                _make(Gst, "filesink", "sink", location=out, sync=0)]
    else:
        tail = [_make(Gst, "nv3dsink" if Path("/etc/nv_tegra_release").exists() else "nveglglessink", "sink")]
    for element in (*chain_in, mux, infer, convert, draw, *tail):
        pipeline.add(element)
    sink_pad = mux.request_pad_simple("sink_0") if hasattr(mux, "request_pad_simple") else \
        mux.get_request_pad("sink_0")
    if source.startswith("/dev/video"):
        src.link(convert_in)
        convert_in.get_static_pad("src").link(sink_pad)
    else:  # uridecodebin's pad appears once it knows the stream
        src.connect("pad-added", lambda _, pad: pad.link(sink_pad) if pad.query_caps(None).to_string()
                    .startswith("video") else None)
    chain = [mux, infer, convert, draw, *tail]
    for left, right in zip(chain, chain[1:]):
        left.link(right)
    infer.get_static_pad("src").add_probe(Gst.PadProbeType.BUFFER, probe, 0)
    return pipeline


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a file (path or file:// URI), rtsp:// or http:// URI, or /dev/videoN")
    parser.add_argument("--out", help="write the annotated video to this .mp4 instead of the screen")
    parser.add_argument("--json", help="write every frame's answer to this JSON file at the end")
    parser.add_argument("--width", type=int, default=1920,
                        help="nvstreammux's frame width (default 1920): give the source's own, as nvstreammux "
                             "stretches every frame to width × height before nvinfer scales it; boxes are in its pixels")
    parser.add_argument("--height", type=int, default=1080, help="nvstreammux's frame height (default 1080)")
    args = parser.parse_args(argv)
    GLib, Gst, pyds = _imports()
    Gst.init(None)
    answers, kept = Answers(), []
    pipeline = build(Gst, args.source, args.out, answers, args.width, args.height, make_probe(pyds, Gst, answers, kept, args.width,
                                                                                     args.height))
    loop = GLib.MainLoop()
    bus = pipeline.get_bus()
    bus.add_signal_watch()

    def on_message(_, message):
        if message.type == Gst.MessageType.EOS:
            loop.quit()
        elif message.type == Gst.MessageType.ERROR:
            error, debug = message.parse_error()
            print(f"error: {error}: {debug}", file=sys.stderr)
            loop.quit()
        return True

    bus.connect("message", on_message)
    pipeline.set_state(Gst.State.PLAYING)
    try:
        loop.run()
    except KeyboardInterrupt:
        pass
    finally:
        pipeline.set_state(Gst.State.NULL)
    if args.json:
        Path(args.json).write_text(json.dumps(kept, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
