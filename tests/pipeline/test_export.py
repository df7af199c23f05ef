import numpy as np
import onnx
import pytest
import torch

from device.errors import StageError
from device.runners.onnxruntime import OnnxRuntimeRunner
from pipeline.checkpoint import load_checkpoint
from pipeline.models import build_model
from pipeline.runner import run_pipeline
from pipeline.tasks.classification import exported as export_stage
from pipeline.tasks.classification.exported import check_parity, export_onnx


def test_export_folds_batchnorm_and_keeps_a_dynamic_batch(tmp_path):
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    path = tmp_path / "m.onnx"
    facts = export_onnx(model, path, (1, 3, 16, 16), opset=17)
    assert facts["batchnorm_nodes"] == 0
    assert facts["conv_nodes"] == sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    graph = onnx.load(str(path))
    assert graph.opset_import[0].version == 17
    assert graph.graph.input[0].name == "input" and graph.graph.output[0].name == "logits"
    assert graph.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    with OnnxRuntimeRunner(path) as runner:
        for batch in (1, 5):
            x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16), dtype=np.float32)
            np.testing.assert_allclose(runner.infer(x), model(torch.from_numpy(x)).detach().numpy(), atol=1e-4)


def _corrupt_first_conv(path):
    graph = onnx.load(str(path))
    weight = next(t for t in graph.graph.initializer if len(t.dims) == 4)
    array = onnx.numpy_helper.to_array(weight) * -3.0
    weight.CopyFrom(onnx.numpy_helper.from_array(array, weight.name))
    onnx.save(graph, str(path))


def test_parity_check_catches_a_broken_export(tmp_path):
    model = build_model("tiny_resnet", 10).eval()
    path = tmp_path / "m.onnx"
    export_onnx(model, path, (1, 3, 16, 16), opset=17)
    images = np.random.default_rng(0).standard_normal((32, 3, 16, 16), dtype=np.float32)
    assert check_parity(model, path, images)["max_abs_diff"] < 1e-4
    _corrupt_first_conv(path)
    assert check_parity(model, path, images)["max_abs_diff"] > 1e-2


@pytest.mark.slow
def test_export_stage_records_parity_and_fails_on_a_broken_export(tiny_run, tmp_path, monkeypatch):
    entry = tiny_run.manifest.stage("export")
    assert set(entry["outputs"]) == {"teacher", "pruned", "student", "student_fp16", "student_fp16_predictions",
                                     "preprocess"}
    for rung in ("teacher", "pruned", "student"):
        facts = entry["metrics"]["rungs"][rung]
        assert facts["batchnorm_nodes"] == 0
        assert facts["parity"]["top1_agreement"] == 1.0 and facts["parity"]["max_abs_diff"] < 1e-3
    student, _ = load_checkpoint(tiny_run.run_dir / "distill" / "model.pt")
    assert facts["conv_nodes"] == sum(isinstance(m, torch.nn.Conv2d) for m in student.modules())

    real_export = export_stage.export_onnx

    def broken_export(model, path, shape, opset):
        facts = real_export(model, path, shape, opset)
        _corrupt_first_conv(path)
        return facts

    monkeypatch.setattr(export_stage, "export_onnx", broken_export)
    import shutil

    shutil.copytree(tiny_run.run_dir, tmp_path / "tiny" / "shared")
    with pytest.raises(StageError, match="ONNX export of teacher disagrees with torch"):
        run_pipeline("tiny", runs_dir=tmp_path, run_id="shared", force=["export"])


def test_the_fp16_rung_is_fp16_in_its_graph_with_float32_io(tiny_run):
    """The FP16 student's precision is written in its weights (ModelOpt AutoCast), its inputs and
    outputs stay float32 (the client does not change), and its host score is labelled an emulation."""
    import onnx

    from device.runners.engine import artifact_precision

    entry = tiny_run.manifest.stage("export")
    path = tiny_run.run_dir / entry["outputs"]["student_fp16"]
    graph = onnx.load(str(path)).graph
    assert artifact_precision(path) == "fp16"
    assert {v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]} == {onnx.TensorProto.FLOAT}
    facts = entry["metrics"]["rungs"]["student_fp16"]
    assert facts["converter"] == "autocast" and facts["top1_agreement_with_fp32"] >= 0.99
    assert "emulates FP16" in facts["host_note"] and facts["scores"]["images"] == 355


def test_a_timm_model_with_train_time_branches_is_exported_in_its_inference_form(tmp_path):
    """MobileOne trains with parallel convolution branches that timm folds into one for inference: the export
    writes the folded graph (fewer convolutions), and it agrees with the trained model it came from."""
    pytest.importorskip("timm")
    from device.models.architectures import ARCHITECTURES
    from pipeline.export.onnx import check_parity, export_onnx

    torch.manual_seed(0)
    model = build_model("timm/mobileone_s0", 10)
    with torch.no_grad():  # BatchNorm statistics away from their initial values, so folding them is not trivial
        for _ in range(3):
            model(torch.randn(8, 3, 32, 32))
    model.eval()
    folded = ARCHITECTURES.get("timm/mobileone_s0").inference_form(model)
    names = lambda m: {name.rsplit(".", 1)[-1] for name, _ in m.named_modules()}  # noqa: E731
    assert "conv_kxk" in names(model) and "reparam_conv" not in names(model)  # the trained form is kept
    assert "conv_kxk" not in names(folded) and "reparam_conv" in names(folded)
    trained = export_onnx(model, tmp_path / "trained.onnx", (1, 3, 32, 32), 17)
    inference = export_onnx(folded, tmp_path / "folded.onnx", (1, 3, 32, 32), 17)
    assert inference["conv_nodes"] < trained["conv_nodes"]
    images = torch.randn(16, 3, 32, 32)
    parity = check_parity(model, tmp_path / "folded.onnx", images.numpy())
    with torch.no_grad():  # an untrained MobileOne's logits run to 1e8: the folding error is judged relative to them
        scale = float(model(images).abs().max())
    assert parity["max_abs_diff"] < 1e-5 * scale and parity["top1_agreement"] == 1.0
    plain = build_model("timm/resnet10t", 10).eval()  # nothing to fold: the same module back
    assert ARCHITECTURES.get("timm/resnet10t").inference_form(plain) is plain
