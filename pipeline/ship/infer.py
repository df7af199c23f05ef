"""Runs the shipped rung on images or a camera and prints the answer (written by ``edgefold ship``; standalone).

    python infer.py photo.jpg more/*.png         # each image's answer
    python infer.py images/ --json answers.json  # a folder, answers kept as JSON
    python infer.py --camera 0                   # frames from a camera until Ctrl-C

Needs OpenCV and NumPy, and TensorRT where it is installed (the engine in ``engine/`` runs only on the device it was
built on), else ONNX Runtime on ``model.onnx`` (``--onnx`` forces it). It reads ``preprocess.json`` (how the images
were fed when the rung was measured), ``postprocess.json`` and ``labels.txt`` beside it; a detector's decode and NMS
are ``detection_post.py`` beside it; a segmenter writes each image's mask and overlay (``--masks``).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import sys
import time
from pathlib import Path

import cv2
import numpy as np

HERE = Path(__file__).resolve().parent
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
INTERPOLATION = {"bilinear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA, "nearest": cv2.INTER_NEAREST,
                 "bicubic": cv2.INTER_CUBIC}


def read_rgb(path: Path) -> np.ndarray:
    image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if image is None:
        raise SystemExit(f"error: cannot decode {path}")
    if image.dtype == np.uint16:
        image = (image // 257).astype(np.uint8)
    if image.ndim == 3:
        image = cv2.cvtColor(image, cv2.COLOR_BGRA2RGB if image.shape[2] == 4 else cv2.COLOR_BGR2RGB)
    return image


def _pil_bilinear(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """PIL's bilinear resize (antialiased: torchvision's Resize), as the rung was fed: ``pil_resize.py`` beside this
    file computes it as the run did, to the bit, whatever Pillow is installed."""
    sys.path.insert(0, str(HERE))
    from pil_resize import resize_antialiased

    return resize_antialiased(image, height, width)


def geometry(image: np.ndarray, pre: dict) -> tuple[np.ndarray, float]:
    """The network-sized uint8 image (H×W×C) and the factor from the image's pixels to the network's."""
    size = pre["input_size"]
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    height, width = image.shape[:2]
    if pre["kind"] == "letterbox_ultralytics":  # Ultralytics' LetterBox: centred on grey 114, bilinear
        factor = min(size / height, size / width)
        new = (max(1, int(round(width * factor))), max(1, int(round(height * factor))))
        resized = cv2.resize(image, new, interpolation=cv2.INTER_LINEAR) if new != (width, height) else image
        resized = np.repeat(resized[:, :, None], 3, axis=2) if resized.ndim == 2 else resized
        left, top = int(round((size - new[0]) / 2 - 0.1)), int(round((size - new[1]) / 2 - 0.1))
        square = np.full((size, size, 3), 114, np.uint8)
        square[top:top + new[1], left:left + new[0]] = resized
        return (square[:, :, ::-1].copy() if pre.get("channel_order") == "bgr" else square), factor
    if pre["kind"] == "stretch":  # the whole image to the square, aspect not kept (a segmenter's feed)
        factor = 1.0
        if (height, width) != (size, size):
            image = cv2.resize(image, (size, size), interpolation=INTERPOLATION[pre["interpolation"]])
        image = np.repeat(image[:, :, None], 3, axis=2) if image.ndim == 2 else image
        return np.ascontiguousarray(image[:, :, ::-1] if pre.get("channel_order") == "bgr" else image), factor
    if pre["kind"] == "letterbox":  # scaled to fit, at the top-left corner on black (boxes map by one factor)
        factor = size / max(height, width)
        new = (max(1, int(round(width * factor))), max(1, int(round(height * factor))))
        resized = cv2.resize(image, new, interpolation=cv2.INTER_AREA if factor < 1 else cv2.INTER_LINEAR)
        if resized.ndim == 2:
            resized = np.repeat(resized[:, :, None], 3, axis=2)
        square = np.zeros((size, size, 3), np.uint8)
        square[:new[1], :new[0]] = resized
        return square, factor
    scale = pre["resize"] / min(height, width)  # the shorter side to `resize`, then the centre crop
    new_h, new_w = max(pre["resize"], round(height * scale)), max(pre["resize"], round(width * scale))
    if (new_h, new_w) != (height, width) and pre["interpolation"] == "bilinear_antialias":
        image = _pil_bilinear(image, new_w, new_h)
    elif (new_h, new_w) != (height, width):
        image = cv2.resize(image, (new_w, new_h), interpolation=INTERPOLATION[pre["interpolation"]])
    top, left = (new_h - size) // 2, (new_w - size) // 2
    image = image[top:top + size, left:left + size]
    image = image[:, :, None] if image.ndim == 2 else image
    if pre["channels"] == 3 and image.shape[2] == 1:
        image = np.repeat(image, 3, axis=2)
    elif pre["channels"] == 1 and image.shape[2] == 3:
        image = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)[:, :, None]
    if pre.get("channel_order") == "bgr":  # a model trained on BGR images
        image = image[:, :, ::-1]
    return np.ascontiguousarray(image), scale


def normalize(images: np.ndarray, pre: dict) -> np.ndarray:
    """uint8 N×H×W×C → float32 N×C×H×W: scaled to [0, 1], minus the mean, over the standard deviation."""
    mean = np.asarray(pre["mean"], np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(pre["std"], np.float32).reshape(1, -1, 1, 1)
    data = images.astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    if pre.get("input_range") == "0-255":  # a graph that takes pixel values (std 1/255): x/255·255, as the run fed it
        return np.ascontiguousarray(data * np.float32(255.0))
    return np.ascontiguousarray((data - mean) / std)


class OnnxRuntime:
    def __init__(self, path: Path, outputs: list[str] | None = None):
        try:
            import onnxruntime
        except ImportError:
            sys.exit("error: neither TensorRT nor ONNX Runtime is importable here, and one runs the model\n"
                     f"  fix: pip install -r {HERE / 'requirements.txt'} (ONNX Runtime on the CPU), or run this on "
                     "the device with JetPack's TensorRT and engine/engine.plan")

        available = onnxruntime.get_available_providers()
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
        self.session = onnxruntime.InferenceSession(str(path), providers=providers)
        self.input = self.session.get_inputs()[0].name
        self.outputs = outputs or [o.name for o in self.session.get_outputs()]
        self.name = f"ONNX Runtime {onnxruntime.__version__} ({self.session.get_providers()[0]})"

    def __call__(self, batch: np.ndarray) -> list[np.ndarray]:
        return self.session.run(self.outputs, {self.input: batch})

    def close(self) -> None:
        pass


class Cuda:
    """The CUDA runtime calls a TensorRT engine needs (libcudart through ctypes)."""

    def __init__(self):
        name = ctypes.util.find_library("cudart") or "/usr/local/cuda/lib64/libcudart.so"
        self.lib = ctypes.CDLL(name)  # OSError where there is no CUDA runtime

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            raise RuntimeError(f"{call} failed with CUDA error {status}")

    def malloc(self, nbytes: int) -> int:
        pointer = ctypes.c_void_p()
        self._check(self.lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(nbytes)), "cudaMalloc")
        return int(pointer.value)

    def free(self, pointer: int) -> None:
        self._check(self.lib.cudaFree(ctypes.c_void_p(pointer)), "cudaFree")

    def stream(self) -> int:
        handle = ctypes.c_void_p()
        self._check(self.lib.cudaStreamCreate(ctypes.byref(handle)), "cudaStreamCreate")
        return int(handle.value or 0)

    def destroy_stream(self, stream: int) -> None:
        self._check(self.lib.cudaStreamDestroy(ctypes.c_void_p(stream)), "cudaStreamDestroy")

    def copy(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        self._check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(nbytes),
                                             kind, ctypes.c_void_p(stream)), "cudaMemcpyAsync")

    def synchronize(self, stream: int) -> None:
        self._check(self.lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")


def _host_type(trt, dtype) -> np.dtype:
    """The NumPy type of a tensor's host buffer: bfloat16 (no NumPy type, TensorRT's nptype refuses it) travels as
    its 16 bits."""
    if dtype == getattr(trt.DataType, "BF16", object()):
        return np.dtype(np.uint16)
    return np.dtype(trt.nptype(dtype))


def _to_bfloat16(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def _from_bfloat16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


class TensorRT:
    """The shipped engine (TensorRT 10/11): one fixed batch, tensors bound by name once, ``execute_async_v3``."""

    def __init__(self, path: Path, outputs: list[str] | None = None, cuda=None, dla_core: int | None = None):
        import tensorrt as trt

        self.trt = trt
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        if dla_core is not None:  # the core the engine was built for (IRuntime.DLA_core is -1 unless set)
            runtime.DLA_core = dla_core
        self.engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise RuntimeError(f"TensorRT could not deserialize {path}: it runs only on the device and TensorRT "
                               "it was built with (engine/build.json); rebuild it there with its trtexec line")
        self.cuda = cuda or Cuda()
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input = next(n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT)
        found = [n for n in names if n != self.input]
        # In the ONNX graph's output order (postprocess.json), which TensorRT's tensor order need not keep.
        self.outputs = [n for n in outputs if n in found] + [n for n in found if n not in outputs] if outputs \
            else found
        shape = tuple(self.engine.get_tensor_shape(self.input))
        if shape[0] < 0:  # a dynamic axis: the engine's one profile fixes it (EdgeFold builds min = opt = max)
            shape = tuple(self.engine.get_tensor_profile_shape(self.input, 0)[2])
        self.batch = int(shape[0])
        if not self.context.set_input_shape(self.input, shape):  # TensorRT answers False, with a log line
            raise RuntimeError(f"TensorRT refused the input shape {shape} for {self.input}")
        # The batch is fixed, so every buffer is made and bound once.
        self.hosts = {self.input: np.empty(shape, _host_type(trt, self.engine.get_tensor_dtype(self.input)))}
        for name in self.outputs:
            self.hosts[name] = np.empty(tuple(self.context.get_tensor_shape(name)),
                                        _host_type(trt, self.engine.get_tensor_dtype(name)))
        self.stream = self.cuda.stream()
        self.devices = {}
        for name, host in self.hosts.items():
            self.devices[name] = self.cuda.malloc(max(host.nbytes, 1))
            if not self.context.set_tensor_address(name, self.devices[name]):
                raise RuntimeError(f"TensorRT refused the address of tensor {name}")
        self.name = f"TensorRT {trt.__version__} ({path.name})"

    def __call__(self, batch: np.ndarray) -> list[np.ndarray]:
        if batch.shape[0] != self.batch:  # the engine's batch is fixed: pad, then drop
            if batch.shape[0] > self.batch:
                return [np.concatenate(parts) for parts in zip(*(self(batch[i:i + self.batch])
                                                                 for i in range(0, len(batch), self.batch)))]
            padded = np.zeros((self.batch, *batch.shape[1:]), batch.dtype)
            padded[:len(batch)] = batch
            return [out[:len(batch)] for out in self(padded)]
        host = self.hosts[self.input]
        host[...] = _to_bfloat16(batch) if host.dtype == np.uint16 else batch
        self.cuda.copy(self.devices[self.input], host.ctypes.data, host.nbytes, 1, self.stream)
        if not self.context.execute_async_v3(self.stream):
            raise RuntimeError("TensorRT's execute_async_v3 failed (its log above says why)")
        for name in self.outputs:
            self.cuda.copy(self.hosts[name].ctypes.data, self.devices[name], self.hosts[name].nbytes, 2, self.stream)
        self.cuda.synchronize(self.stream)
        return [(_from_bfloat16(self.hosts[name]) if self.hosts[name].dtype == np.uint16
                 else self.hosts[name].astype(np.float32)) for name in self.outputs]

    def close(self) -> None:
        for pointer in self.devices.values():
            self.cuda.free(pointer)
        self.devices = {}
        self.cuda.destroy_stream(self.stream)


def load_runtime(force_onnx: bool, outputs: list[str] | None = None):
    engine = HERE / "engine" / "engine.plan"
    if not force_onnx and engine.is_file():
        build = HERE / "engine" / "build.json"
        dla_core = json.loads(build.read_text()).get("dla_core") if build.is_file() else None
        try:
            return TensorRT(engine, outputs, dla_core=dla_core)
        except ImportError:
            print("TensorRT is not installed here: ONNX Runtime runs model.onnx instead", file=sys.stderr)
        except (RuntimeError, OSError) as err:
            print(f"the engine does not run here ({err}): ONNX Runtime runs model.onnx instead", file=sys.stderr)
    return OnnxRuntime(HERE / "model.onnx", outputs)


def answer(outputs: list[np.ndarray], factor: float, post: dict, labels: list[str],
           image_size: tuple[int, int] | None = None) -> dict:
    """One image's answer: the top classes with their probabilities, or the boxes in the image's pixels (a centred
    letterbox's mapped back through its padding, from the image's (height, width))."""
    if post["kind"] == "classification":
        logits = outputs[0].reshape(-1).astype(np.float64)
        probabilities = np.exp(logits - logits.max())
        probabilities /= probabilities.sum()
        top = np.argsort(-probabilities, kind="stable")[:post["top_k"]]
        return {"top": [[int(k), labels[k], float(probabilities[k])] for k in top]}
    if post["kind"] == "segmentation":  # each pixel's class: the argmax over the class axis
        return {"class_map": outputs[0][0].argmax(0).astype(np.uint8)}
    sys.path.insert(0, str(HERE))
    from detection_post import head_spec_from_dict, postprocess

    head = dict(post["head"])
    head["postprocess"] = {**head.get("postprocess", {}), **post.get("override", {})}
    spec = head_spec_from_dict(head, "postprocess.json")
    centred = spec.resize == "letterbox" and image_size is not None
    detections = postprocess(spec, outputs[0], [image_size] if centred else None)[0]
    return {"boxes": (np.asarray(detections["boxes"], np.float64) / (1.0 if centred else factor)).tolist(),
            "scores": [float(s) for s in detections["scores"]],
            "labels": [labels[int(k)] for k in detections["labels"]], "classes": [int(k) for k in detections["labels"]]}


class MaskWriter:
    """A segmenter's answer as files: the class map at the image's own size (nearest-neighbour from the network's
    square) as a PNG of class indices, and the image overlaid with the palette's colours."""

    def __init__(self, folder: Path, post: dict, labels: list[str]):
        self.folder, self.labels = folder, labels
        self.palette = np.asarray(post["palette"], np.uint8)
        self.used: set[str] = set()
        folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, name: str, image: np.ndarray, found: dict) -> dict:
        height, width = image.shape[:2]
        mask = cv2.resize(found.pop("class_map"), (width, height), interpolation=cv2.INTER_NEAREST)
        stem = Path(name).stem.replace(" ", "_")
        unique, count = stem, 1
        while unique in self.used:  # two images of one name from different folders
            unique, count = f"{stem}_{count}", count + 1
        self.used.add(unique)
        mask_path, overlay_path = self.folder / f"{unique}.png", self.folder / f"{unique}_overlay.png"
        cv2.imwrite(str(mask_path), mask)
        rgb = np.repeat(image[:, :, None], 3, axis=2) if image.ndim == 2 else image[:, :, :3]
        overlay = (0.5 * rgb + 0.5 * self.palette[mask]).astype(np.uint8)
        cv2.imwrite(str(overlay_path), cv2.cvtColor(overlay, cv2.COLOR_RGB2BGR))
        shares = np.bincount(mask.reshape(-1), minlength=len(self.labels)) / mask.size
        return {"mask": str(mask_path), "overlay": str(overlay_path),
                "shares": {self.labels[k]: round(float(shares[k]), 4) for k in np.argsort(-shares) if shares[k] > 0}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="*", help="image files or folders")
    parser.add_argument("--camera", type=int, help="read frames from this camera (OpenCV's index)")
    parser.add_argument("--json", help="write every answer to this JSON file")
    parser.add_argument("--onnx", action="store_true", help="run model.onnx with ONNX Runtime even where TensorRT is")
    parser.add_argument("--stats", help="write the runtime and the time per image (the network call's median, and "
                                        "the whole path from the file) to this JSON file")
    post = json.loads((HERE / "postprocess.json").read_text())
    scored = (post.get("head") or {}).get("postprocess") or {}
    if scored:  # a detector: the thresholds its score was measured at are the defaults
        parser.add_argument("--score-threshold", type=float, default=scored.get("score_threshold"),
                            help=f"keep boxes scoring at least this (default {scored.get('score_threshold')}: what "
                                 "the rung's mAP was measured at; Ultralytics' predict uses 0.25)")
        parser.add_argument("--max-detections", type=int, default=scored.get("max_detections"),
                            help=f"at most this many boxes per image (default {scored.get('max_detections')})")
    if post["kind"] == "segmentation":
        parser.add_argument("--masks", default="masks", help="the folder each image's mask PNG (class indices) and "
                                                             "overlay are written to (default: masks/)")
    args = parser.parse_args(argv)
    if scored:
        if not 0 <= args.score_threshold <= 1 or args.max_detections < 1:
            parser.error("--score-threshold is a probability in [0, 1]; --max-detections is 1 or more")
        post["override"] = {"score_threshold": args.score_threshold, "max_detections": args.max_detections}
    pre = json.loads((HERE / "preprocess.json").read_text())
    labels = (HERE / "labels.txt").read_text().splitlines()
    runtime = load_runtime(args.onnx, post.get("outputs"))
    print(f"running {runtime.name}", file=sys.stderr)
    answers = {}
    masks = MaskWriter(Path(args.masks), post, labels) if post["kind"] == "segmentation" else None

    network_ms, whole_ms = [], []

    def one(name: str, image: np.ndarray, started: float) -> None:
        fed, factor = geometry(image, pre)
        batch = normalize(fed[None], pre)
        before = time.perf_counter()
        outputs = runtime(batch)
        network_ms.append(1000 * (time.perf_counter() - before))
        found = answer(outputs, factor, post, labels, image.shape[:2])
        answers[name] = masks(name, image, found) if masks else found
        shown = (answers[name].get("top") or list(answers[name].get("shares", {}).items())
                 or list(zip(answers[name]["labels"], answers[name]["scores"])))
        whole_ms.append(1000 * (time.perf_counter() - started))
        print(f"{name}: {shown[:3]}")

    try:
        if args.camera is not None:
            capture = cv2.VideoCapture(args.camera)
            frame_index = 0
            try:
                while True:
                    started = time.perf_counter()
                    ok, frame = capture.read()
                    if not ok:
                        break
                    one(f"frame {frame_index}", cv2.cvtColor(frame, cv2.COLOR_BGR2RGB), started)
                    frame_index += 1
            except KeyboardInterrupt:
                pass
        files = []
        for item in map(Path, args.images):
            files += (sorted(p for p in item.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES) if item.is_dir()
                      else [item])
        for path in files:
            started = time.perf_counter()
            one(str(path), read_rgb(path), started)
    finally:
        runtime.close()
    if args.json:
        Path(args.json).write_text(json.dumps(answers, indent=1) + "\n")
    if network_ms:
        stats = {"runtime": runtime.name, "images": len(network_ms),
                 "network_ms_p50": float(np.median(network_ms)), "whole_ms_p50": float(np.median(whole_ms))}
        print(f"{len(network_ms)} images: network p50 {stats['network_ms_p50']:.3f} ms, from the file to the answer "
              f"{stats['whole_ms_p50']:.3f} ms per image ({runtime.name})", file=sys.stderr)
        if args.stats:
            Path(args.stats).write_text(json.dumps(stats, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
