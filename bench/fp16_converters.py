"""Which FP16 converter keeps a model's outputs closest to FP32, with its inputs and outputs kept float32?

    python bench/fp16_converters.py [--images 512] [--out bench/results]

Compares onnxconverter-common's ``float16.convert_float_to_float16(model, keep_io_types=True)`` with NVIDIA
ModelOpt's AutoCast: ``convert_to_mixed_precision`` (AutoCast proper: a reference run keeps nodes whose
values exceed data_max=512 in FP32) and ``convert_to_f16`` (its converter without that classifier), all
with float32 I/O. Models are exported the way the export stage does (pipeline.export.onnx.export_onnx,
opset 17, dynamic batch, BN folded): torchvision resnet18 and mobilenet_v3_small with random weights at
3x32x32 and 10 classes (BatchNorm statistics measured on random inputs, so activations have a trained
network's unit scale), the tests' tiny_onnx (Conv/Relu/pool/Gemm at 3x16x16), and one stress case,
resnet18 with its classifier scaled so its largest logit is about 1e5, past FP16's largest value (65504).

Inputs are random normal (seed 0), not images: with random weights there is no data to be faithful to,
and a preprocessed image is roughly zero-mean unit-variance too. Per converter and model: max and mean
|Δlogit| against the FP32 model and top-1 agreement, under ONNX Runtime on CPU; whether the converted graph
loads there; node outputs typed FP16 whose FP32 values pass 65504 on the first 64 inputs (ONNX Runtime's
CPU provider computes FP16 ops in FP32, so only this column sees FP16's range; TensorRT would write inf);
Casts inserted; nodes still computing in FP32; file size; seconds to convert (one conversion, after one
untimed warm-up conversion per converter).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

GOAL = ("Goal: which FP16 converter keeps outputs closest to FP32 with inputs and outputs kept float32 "
        "(onnxconverter-common vs NVIDIA ModelOpt AutoCast).")


def _converters():
    """name → (source path → converted ModelProto); imports happen here, outside the timed calls."""
    import onnx
    from modelopt.onnx.autocast import convert_to_f16, convert_to_mixed_precision
    from onnxconverter_common import float16

    return {
        "onnxconverter-common": lambda src: float16.convert_float_to_float16(onnx.load(str(src)),
                                                                             keep_io_types=True),
        "autocast (convert_to_mixed_precision)": lambda src: convert_to_mixed_precision(
            str(src), low_precision_type="fp16", keep_io_types=True, providers=["cpu"]),
        "autocast (convert_to_f16)": lambda src: convert_to_f16(onnx.load(str(src)), low_precision_type="fp16",
                                                                keep_io_types=True),
    }


def _recalibrate(net, chw: tuple[int, ...]):
    # Random weights with BatchNorm's default statistics (mean 0, var 1) shrink the activations layer by
    # layer (mobilenet_v3_small's logits come out near 1e-10); BN statistics measured on the inputs give
    # each layer the unit-scale activations a trained network has, which is what FP16's range is about.
    import torch

    for module in net.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # a plain average over the batches
    net.train()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(4):
            net(torch.randn((64, *chw), generator=generator))
    return net.eval()


def _models(folder: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    import torch
    import torchvision

    from pipeline.export.onnx import export_onnx
    from tests.device.agent_process import tiny_onnx

    models = {"tiny_onnx": (tiny_onnx(folder / "tiny.onnx"), (3, 16, 16))}
    for name in ("resnet18", "mobilenet_v3_small"):
        torch.manual_seed(0)
        net = _recalibrate(getattr(torchvision.models, name)(num_classes=10), (3, 32, 32))
        export_onnx(net, folder / f"{name}.onnx", (1, 3, 32, 32), opset=17)
        models[name] = (folder / f"{name}.onnx", (3, 32, 32))
    torch.manual_seed(0)
    net = _recalibrate(torchvision.models.resnet18(num_classes=10), (3, 32, 32))
    with torch.no_grad():  # the largest logit on these inputs made about 1e5: past FP16's 65504
        scale = 1e5 / net(torch.randn((64, 3, 32, 32), generator=torch.Generator().manual_seed(0))).abs().max()
        net.fc.weight.mul_(scale)
        net.fc.bias.mul_(scale)
    export_onnx(net, folder / "resnet18_wide.onnx", (1, 3, 32, 32), opset=17)
    models["resnet18, logits ~1e5 (stress)"] = (folder / "resnet18_wide.onnx", (3, 32, 32))
    return models


def _ranges(src: Path, images: np.ndarray) -> dict[tuple[str, int], float]:
    """(node name, output index) → the largest |value| the FP32 model computes there on ``images``."""
    import onnx
    import onnxruntime as ort

    model = onnx.shape_inference.infer_shapes(onnx.load(str(src)))
    typed = {v.name: v for v in list(model.graph.value_info) + list(model.graph.output)}
    where = {}
    for node in model.graph.node:
        for index, name in enumerate(node.output):
            if name in typed and typed[name].type.tensor_type.elem_type == onnx.TensorProto.FLOAT and node.name:
                where[name] = (node.name, index)
    if not where:  # unnamed nodes (tiny_onnx): nothing to match the converted graph's nodes by
        return {}
    del model.graph.output[:]
    model.graph.output.extend(typed[name] for name in where)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    values = session.run(list(where), {session.get_inputs()[0].name: images})
    return {where[name]: float(np.abs(value).max()) for name, value in zip(where, values)}


def _overflows(model, ranges: dict[tuple[str, int], float]) -> int | None:
    # ONNX Runtime on CPU runs FP16 ops in FP32 and drops the Casts between them (a MatMul of 100 × 1200 in
    # FP16 returns 120000 there), so its logits cannot show an overflow; TensorRT's FP16 kernels write FP16.
    # What would overflow is counted instead: the node outputs the converter typed FP16 whose FP32 values
    # pass 65504.
    import onnx

    if not ranges:
        return None
    inferred = onnx.shape_inference.infer_shapes(model)
    values = list(inferred.graph.value_info) + list(inferred.graph.output)
    types = {v.name: v.type.tensor_type.elem_type for v in values}
    return sum(types.get(name) == onnx.TensorProto.FLOAT16 and ranges.get((node.name, index), 0.0) > 65504
               for node in inferred.graph.node for index, name in enumerate(node.output))


def _logits(path: Path, images: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.concatenate([session.run(None, {name: images[i: i + 64]})[0] for i in range(0, len(images), 64)])


def _measure(convert, src: Path, dst: Path, images: np.ndarray, reference: np.ndarray,
             ranges: dict[tuple[str, int], float]) -> dict:
    import onnx

    from pipeline.quantize.fp16 import graph_facts, quiet

    before = graph_facts(onnx.load(str(src)))
    started = time.perf_counter()
    with quiet():
        model = convert(src)
    seconds = time.perf_counter() - started
    onnx.save(model, str(dst))
    facts = graph_facts(model)
    io_float32 = all(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
                     for v in list(model.graph.input) + list(model.graph.output))
    row = {"seconds": seconds, "casts": facts["casts"] - before["casts"], "fp32_nodes": facts["fp32_nodes"],
           "nodes": facts["nodes"] - facts["casts"], "size_mb": dst.stat().st_size / 1e6, "io_float32": io_float32,
           "overflows": _overflows(model, ranges),
           "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))}
    try:
        got = _logits(dst, images)
    except Exception as err:  # a graph ONNX Runtime refuses is a result here, not a crash
        return {**row, "loads": f"no: {type(err).__name__}: {str(err).splitlines()[0][:80]}"}
    diff = np.abs(got.astype(np.float64) - reference)
    return {**row, "loads": "yes", "max": float(diff.max()), "mean": float(diff.mean()),
            "agree": float((got.argmax(1) == reference.argmax(1)).mean())}


def table(rows: list[dict]) -> str:
    head = ["model", "converter", "loads in ORT", "max abs Δlogit", "mean abs Δlogit", "top-1 agreement",
            "FP16 outputs > 65504", "Casts inserted", "FP32 nodes left / nodes", "I/O float32", "opset", "MB",
            "convert s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        measured = r["loads"] == "yes"
        lines.append("| " + " | ".join([
            r["model"], r["converter"], r["loads"], f"{r['max']:.3g}" if measured else "—",
            f"{r['mean']:.3g}" if measured else "—", f"{100 * r['agree']:.1f}%" if measured else "—",
            "—" if r["overflows"] is None else str(r["overflows"]), str(r["casts"]),
            f"{r['fp32_nodes']} / {r['nodes']}",
            "yes" if r["io_float32"] else "no", str(r["opset"]), f"{r['size_mb']:.2f}", f"{r['seconds']:.2f}"]) + " |")
    return "\n".join(lines)


def main() -> int:
    import onnx
    import onnxruntime
    import torch

    parser = argparse.ArgumentParser(description=GOAL)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--out", default=str(HERE / "results"))
    args = parser.parse_args()
    print(GOAL)
    torch.set_num_threads(2)
    import modelopt
    import onnxconverter_common

    from pipeline.quantize.fp16 import quiet

    converters = _converters()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        models = _models(folder)
        warm_src = models["tiny_onnx"][0]
        for name, convert in converters.items():  # first-call imports and caches stay out of the timings
            with quiet():
                convert(warm_src)
        for model_name, (src, chw) in models.items():
            images = np.random.default_rng(0).standard_normal((args.images, *chw)).astype(np.float32)
            reference = _logits(src, images).astype(np.float64)
            ranges = _ranges(src, images[:64])
            fp32_mb = src.stat().st_size / 1e6
            print(f"{model_name}: FP32 {fp32_mb:.2f} MB, max |logit| {np.abs(reference).max():.3g}", flush=True)
            for index, (name, convert) in enumerate(converters.items()):
                row = _measure(convert, src, folder / f"{src.stem}.{index}.fp16.onnx", images, reference, ranges)
                rows.append({"model": model_name, "converter": name, **row})
    versions = (f"onnxconverter-common {onnxconverter_common.__version__}, nvidia-modelopt {modelopt.__version__}, "
                f"onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__} (CPUExecutionProvider), "
                f"torch {torch.__version__}")
    text = table(rows)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"fp16-converters-{time.strftime('%Y%m%d')}.md"
    path.write_text(f"# FP16 converters: onnxconverter-common vs ModelOpt AutoCast\n\n{GOAL}\n\n"
                    f"`python bench/fp16_converters.py --images {args.images}`; {versions}. Inputs: {args.images} "
                    "random-normal tensors (seed 0), not images; logits compared with the FP32 model's under "
                    "ONNX Runtime CPU. \"FP32 nodes left\": nodes other than Cast with a float32 output after "
                    "ONNX type inference.\n\n" + text + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
