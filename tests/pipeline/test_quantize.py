"""The quantize stage on the tiny recipe: ONNX Runtime Q/DQ, the TensorRT lint and the accuracy gate."""

import shutil

import numpy as np
import onnx
import pytest

from device.errors import StageError
from device.runners.qdq_lint import lint_qdq
from device.runners.onnxruntime import OnnxRuntimeRunner
from device.files import sha256_file
from pipeline.quantize.int8_weights import float_weights
from pipeline.tasks.classification import int8 as classifier_int8
from pipeline.quantize.quantizers import QUANTIZERS
from pipeline.runner import run_pipeline


@pytest.fixture
def runs(tiny_run, tmp_path):
    shutil.copytree(tiny_run.run_dir, tmp_path / "tiny" / "shared")
    return tmp_path


def rerun_quantize(runs, **overrides):
    return run_pipeline("tiny", runs_dir=runs, run_id="shared", force=["quantize"], until="quantize",
                        overrides=overrides)


def test_int8_model_is_tensorrt_clean_smaller_and_runs(tiny_run):
    entry = tiny_run.manifest.stage("quantize")
    path = tiny_run.run_dir / entry["outputs"]["student_int8"]
    assert lint_qdq(path).ok
    graph = onnx.load(str(path))
    ops = [n.op_type for n in graph.graph.node]
    assert ops.count("QuantizeLinear") > 0 and ops.count("DequantizeLinear") > ops.count("QuantizeLinear")
    int8_weights = [t for t in graph.graph.initializer if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 4]
    assert int8_weights, "weights are stored as int8"
    metrics = entry["metrics"]
    assert metrics["size_mb"] < 0.6 * metrics["fp32_size_mb"]
    assert metrics["drop_points"] <= 3.0 and metrics["attempts"][0]["lint"]["ok"]
    assert metrics["attempts"][0]["lint"]["float_layers"] == ["/fc/Gemm"], "only the classifier stays float"
    with OnnxRuntimeRunner(path) as runner:
        assert runner.infer(np.zeros((2, 3, 16, 16), dtype=np.float32)).shape == (2, 10)
    assert metrics["trtexec"]["tensorrt_10"].startswith("trtexec --onnx=student.int8.onnx")
    assert "--int8 --fp16" in metrics["trtexec"]["tensorrt_10"] and "--int8" not in metrics["trtexec"]["tensorrt_11"]
    rungs = tiny_run.manifest.stage("evaluate")["metrics"]["rungs"]
    assert rungs["student_int8"]["top1"] == metrics["top1"]


def scored_as(scores, top1_correct):
    """A stand-in score (says so): the real one with its top-1 count replaced."""
    return {**scores, "top1_correct": top1_correct, "top1": top1_correct / scores["images"]}


def test_gate_falls_back_to_the_next_calibration_method(runs, monkeypatch):
    """A stand-in scorer (says so) makes `max` miss the budget; `percentile` must then be tried and kept."""
    real = classifier_int8.onnx_accuracy

    def scorer(path, images, labels, batch=250, **kwargs):
        scores = real(path, images, labels, batch, **kwargs)
        return scored_as(scores, scores["images"] // 2) if path.name.endswith(".max.onnx") else scores

    monkeypatch.setattr(classifier_int8, "onnx_accuracy", scorer)
    metrics = rerun_quantize(runs).manifest.stage("quantize")["metrics"]
    assert [a["method"] for a in metrics["attempts"]] == ["max", "percentile"]
    assert metrics["method"] == "percentile" and metrics["attempts"][0]["top1"] == pytest.approx(0.5, abs=0.01)


def test_gate_fails_with_a_table_of_what_was_tried(runs, monkeypatch):
    """A stand-in scorer (says so) scores every INT8 model at zero, so every method misses."""
    real = classifier_int8.onnx_accuracy
    monkeypatch.setattr(classifier_int8, "onnx_accuracy", lambda path, images, labels, batch=250, **kw: (
        scored_as(real(path, images, labels, batch, **kw), 0) if ".int8." in path.name
        else real(path, images, labels, batch, **kw)))
    with pytest.raises(StageError) as err:
        rerun_quantize(runs, **{"quantize.calibration_methods": ["max", "percentile"]})
    text = str(err.value)
    assert "ort/max: top-1 0.00%" in text and "ort/percentile: top-1 0.00%" in text
    assert "quantization-aware fine-tuning is off" in text and "quantize.qat" in err.value.fix


def ort_with_defaults(fp32, out, calibration, method, per_channel):
    """ONNX Runtime's quantize_static as most people call it (QuantizeBias left on)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = [{"input": calibration[:32]}]

        def get_next(self):
            return self.left.pop() if self.left else None

    quantize_static(str(fp32), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True)


def test_ort_default_int32_biases_are_caught_by_the_lint(runs, monkeypatch):
    """ONNX Runtime's default (QuantizeBias on) emits int32 biases that TensorRT's parser rejects."""
    monkeypatch.setitem(QUANTIZERS._items, "ort", ort_with_defaults)
    with pytest.raises(StageError, match=r"breaks TensorRT's Q/DQ rules: .*\[dq-input\] a int32 constant"):
        rerun_quantize(runs)


def test_modelopt_quantizer_on_the_tiny_recipe(runs, capfd):
    pytest.importorskip("modelopt.onnx.quantization", reason="ModelOpt is the [modelopt] extra (make installs it)")
    capfd.readouterr()  # the shared run's output, if this test made it
    ctx = rerun_quantize(runs, **{"quantize.quantizer": "modelopt", "quantize.calibration_methods": ["max", "entropy"]})
    # ModelOpt's own output (progress bars, warnings from C++) goes to the stage's log, not the run's.
    out, err = capfd.readouterr()
    ours = ("run ", "[", "quantize: ")
    assert [line for line in (out + err).splitlines() if line.strip() and not line.startswith(ours)] == []
    assert (ctx.run_dir / "quantize" / "quantizer.log").is_file()
    # ModelOpt rewrites the ONNX it is given; the export stage's file must be as recorded.
    for rel, digest in ctx.manifest.stage("export")["sha256"].items():
        assert sha256_file(ctx.run_dir / rel) == digest
    metrics = ctx.manifest.stage("quantize")["metrics"]
    attempt = metrics["attempts"][0]
    assert attempt["quantizer"] == "modelopt" and attempt["lint"]["ok"]
    assert "/fc/Gemm" in attempt["lint"]["float_layers"]
    graph = onnx.load(str(ctx.run_dir / "quantize" / "student.int8.onnx"))
    assert any(t.data_type == onnx.TensorProto.INT8 for t in graph.graph.initializer), "dq_only stores int8 weights"
    assert metrics["size_mb"] < 0.6 * metrics["fp32_size_mb"]


def test_modelopt_refuses_methods_it_lacks_before_any_work(runs):
    """Refused when the recipe is read (for every task: the ladder's own settings), not halfway up the ladder."""
    from device.errors import ConfigError
    from pipeline.core.recipe import load_recipe

    with pytest.raises(ConfigError, match="ModelOpt calibrates with max or entropy, not 'percentile'"):
        rerun_quantize(runs, **{"quantize.quantizer": "modelopt", "quantize.calibration_methods": ["percentile"]})
    with pytest.raises(ConfigError, match=r"quantize: ModelOpt calibrates .* \[max, entropy\]"):
        load_recipe("tiny-det", {"quantize.quantizer": "modelopt"})


def test_a_planted_miss_is_met_by_layers_kept_in_fp16_and_the_report_names_them(runs, monkeypatch):
    """A stand-in scorer (says so) fails both calibration methods on the test split and everything-INT8 on the
    held-out images; the mixed step then ranks the layers and bisects k on the held-out images (k ≥ 1 scored for
    real), and its candidate passes the real gate.
    The kept layers are FP16 in the graph, named in the stage's metrics, report.md and results.json, and plotted."""
    import json

    from pipeline.tasks.classification.report import build_report

    real = classifier_int8.onnx_accuracy
    # Everything-INT8 misses on the test split and, calibrated without the held-out images, on those too.
    missed = ("student.int8.max.onnx", "student.int8.percentile.onnx", "student.int8.mixed.k0.onnx")
    monkeypatch.setattr(classifier_int8, "onnx_accuracy", lambda path, images, labels, batch=250, **kw: (
        scored_as(real(path, images, labels, batch, **kw), 0) if path.name in missed
        else real(path, images, labels, batch, **kw)))
    ctx = run_pipeline("tiny", runs_dir=runs, run_id="shared", force=["quantize"], until="evaluate",
                       overrides={"quantize.mixed_precision": {"max_layers": 4, "held_out": 0.25}})
    metrics = ctx.manifest.stage("quantize")["metrics"]
    assert [a["method"] for a in metrics["attempts"]] == ["max", "percentile", "mixed"]
    mixed = metrics["attempts"][-1]
    assert metrics["method"] == "mixed" and metrics["drop_points"] <= 3.0
    closeness = mixed["closeness_by_method"]
    assert set(closeness) == {"max", "percentile"} and mixed["base_method"] == min(closeness, key=closeness.get), \
        "the calibration closest to FP32 on the held-out images, not the one the (planted) test scores favour"
    assert mixed["kept_precision"] == "fp16" and metrics["kept_precision"] == "fp16"
    assert (mixed["held_out_images"], mixed["calibration_images"]) == (32, 96), "a quarter of the 128 held apart"
    kept = metrics["kept_layers"]
    assert 1 <= len(kept) <= 4 and kept == [layer["layer"] for layer in mixed["sensitivity"][: len(kept)]]
    graph = onnx.load(str(ctx.run_dir / "quantize" / "student.int8.onnx"))
    weights = {t.name: t for t in graph.graph.initializer}
    for node in (n for n in graph.graph.node if n.name in kept and n.op_type == "Conv"):
        assert weights[node.input[1]].data_type == onnx.TensorProto.FLOAT16, f"{node.name} kept in FP16"
    assert lint_qdq(ctx.run_dir / "quantize" / "student.int8.onnx").ok
    paths = build_report(ctx.run_dir)
    report = paths["md"].read_text()
    assert "## The INT8 ladder" in report and all(name in report for name in kept)
    assert "int8_sensitivity.png" in report and (ctx.run_dir / "int8_sensitivity.png").stat().st_size > 1000
    document = json.loads(paths["json"].read_text())
    assert document["quantize"]["kept_layers"] == kept and document["quantize"]["method"] == "mixed"


def test_gate_falls_back_to_quantization_aware_finetuning(runs, monkeypatch):
    """A stand-in scorer (says so) fails every PTQ model; the QAT model is scored for real."""
    pytest.importorskip("modelopt.torch.quantization", reason="ModelOpt is the [modelopt] extra (make installs it)")
    real = classifier_int8.onnx_accuracy
    monkeypatch.setattr(classifier_int8, "onnx_accuracy", lambda path, images, labels, batch=250, **kw: (
        scored_as(real(path, images, labels, batch, **kw), 0) if path.name in ("student.int8.max.onnx",)
        else real(path, images, labels, batch, **kw)))
    qat = {"epochs": 1, "batch_size": 32, "optimizer": "adamw", "lr": 1e-4}
    ctx = rerun_quantize(runs, **{"quantize.calibration_methods": ["max"], "quantize.qat": qat,
                                  "quantize.mixed_precision": None})
    metrics = ctx.manifest.stage("quantize")["metrics"]
    assert [(a["quantizer"], a["method"]) for a in metrics["attempts"]] == [("ort", "max"), ("modelopt", "qat")]
    assert metrics["method"] == "qat" and metrics["drop_points"] <= 3.0
    assert metrics["attempts"][1]["lint"]["ok"]
    graph = onnx.load(str(ctx.run_dir / "quantize" / "student.int8.onnx"))
    assert "BatchNormalization" not in {n.op_type for n in graph.graph.node}
    # A real INT8 artifact: int8 weights, no float weight behind a QuantizeLinear, smaller like PTQ's.
    assert float_weights(ctx.run_dir / "quantize" / "student.int8.onnx") == []
    assert any(t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 4 for t in graph.graph.initializer)
    assert metrics["size_mb"] < 0.6 * metrics["fp32_size_mb"]


def test_int8_float_islands_are_fp16_in_the_graph(tiny_run):
    """The layers left out of INT8 are FP16 in the artifact itself (ModelOpt's pattern: opset 19, FP16
    scales, each DequantizeLinear feeding its Conv directly), so it means the same on TensorRT 10 and 11."""
    metrics = tiny_run.manifest.stage("quantize")["metrics"]
    assert metrics["float_islands"] == "fp16"
    graph_model = onnx.load(str(tiny_run.run_dir / tiny_run.manifest.stage("quantize")["outputs"]["student_int8"]))
    assert next(o.version for o in graph_model.opset_import if o.domain in ("", "ai.onnx")) >= 19
    graph = graph_model.graph
    producers = {out: node for node in graph.node for out in node.output}
    inits = {t.name: t for t in graph.initializer}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    assert convs and all(producers[n.input[1]].op_type == "DequantizeLinear" for n in convs)
    assert all(inits[producers[n.input[1]].input[1]].data_type == onnx.TensorProto.FLOAT16 for n in convs)
    assert {v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]} == {onnx.TensorProto.FLOAT}


@pytest.mark.parametrize("method", ["percentile", "entropy", "max"])
def test_ort_calibrates_a_slice_that_batches_of_32_do_not_divide(tmp_path, method):
    """The mixed step calibrates on the held-in part of the slice (48 of 64 images): ORT's histogram calibrators
    fail on a short last batch, so the slice is fed in batches of one size."""
    from pipeline.quantize.ort import quantize_ort
    from tests.device.agent_process import tiny_onnx

    images = np.random.default_rng(0).standard_normal((48, 3, 16, 16)).astype(np.float32)
    out = tmp_path / "int8.onnx"
    quantize_ort(tiny_onnx(tmp_path / "fp32.onnx"), out, images, method, per_channel=True)
    assert sum(node.op_type == "QuantizeLinear" for node in onnx.load(str(out)).graph.node) >= 1


def test_an_attention_models_float_islands_become_fp16(tmp_path):
    """torch exports scaled_dot_product_attention's scale as Shape → Cast → Sqrt → Div → Cast → Sqrt → Mul; the FP16
    converter left those Casts float32 under FP16 Muls and the rewrite failed (a timm ViT's islands stayed FP32)."""
    pytest.importorskip("timm")
    import onnxruntime as ort
    import torch

    from pipeline.quantize.fp16_nodes import fp16_nodes
    from pipeline.models import build_model
    from pipeline.export.onnx import export_onnx
    from pipeline.quantize.ort import quantize_ort
    from pipeline.quantize.quantizers import float_islands_to_fp16

    torch.manual_seed(0)
    export_onnx(build_model("timm/test_vit", 10, input_size=32).eval(), tmp_path / "vit.onnx", (1, 3, 32, 32), 17)
    images = np.random.default_rng(0).standard_normal((32, 3, 32, 32)).astype(np.float32)
    quantize_ort(tmp_path / "vit.onnx", tmp_path / "vit.int8.onnx", images, "max", per_channel=True)
    shutil.copy(tmp_path / "vit.int8.onnx", tmp_path / "vit.int8.fp16.onnx")
    assert float_islands_to_fp16(tmp_path / "vit.int8.fp16.onnx") > 0
    halves = fp16_nodes(onnx.load(str(tmp_path / "vit.int8.fp16.onnx")))
    assert any("attn" in name and "Softmax" in name for name in halves)

    def logits(path):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return session.run(None, {session.get_inputs()[0].name: images[:8]})[0]

    # An untrained ViT's logits are too flat to compare FP16 with FP32 closely (the trained ViT of test_byom goes
    # through the ladder's accuracy gate); here the graph must run, whole and finite.
    float_islands, fp16_islands = logits(tmp_path / "vit.int8.onnx"), logits(tmp_path / "vit.int8.fp16.onnx")
    assert fp16_islands.shape == float_islands.shape == (8, 10) and np.isfinite(fp16_islands).all()
