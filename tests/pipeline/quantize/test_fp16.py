"""pipeline.quantize.fp16: FP16 ONNX with float32 I/O, run for real under ONNX Runtime on CPU, with both converters."""

import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from device.errors import ConfigError, MissingDependencyError
from pipeline.quantize.fp16 import AUTOCAST, CONVERTERS, DEFAULT_CONVERTER, ONNXCONVERTER, graph_facts, to_fp16
from tests.device.agent_process import tiny_onnx

UNIT_ROUNDOFF = 2.0 ** -11  # FP16 keeps 11 significant bits: rounding moves a value by at most this, relatively


def _logits(path, images):
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: images})[0]


def _magnitude(path, tmp_path, images):
    """Each logit's sum of absolute terms: the network with |weights| and |biases| run on |inputs|.

    tiny_onnx is Conv → Relu → average pool → Gemm; Relu and averaging never enlarge a difference, so a
    first-order bound on a logit's rounding error is (roundings on one path) × u × this magnitude."""
    model = onnx.load(str(path))
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(np.abs(numpy_helper.to_array(init)), init.name))
    onnx.save(model, str(tmp_path / "abs.onnx"))
    return _logits(tmp_path / "abs.onnx", np.abs(images))


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).standard_normal((64, 3, 16, 16)).astype(np.float32)


@pytest.mark.parametrize("converter", CONVERTERS)
def test_fp16_model_matches_fp32_with_float32_io(tmp_path, images, converter):
    src = tiny_onnx(tmp_path / "fp32.onnx")
    facts = to_fp16(src, tmp_path / "fp16.onnx", converter)
    model = onnx.load(str(tmp_path / "fp16.onnx"))
    assert [v.type.tensor_type.elem_type for v in list(model.graph.input) + list(model.graph.output)] == [
        onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT]
    assert {init.data_type for init in model.graph.initializer} == {onnx.TensorProto.FLOAT16}
    assert facts["converter"] == converter and facts["casts_inserted"] == 2 and facts["fp32_nodes_left"] == 0
    assert facts["size_mb"] == pytest.approx((tmp_path / "fp16.onnx").stat().st_size / 1e6)

    reference, got = _logits(src, images), _logits(tmp_path / "fp16.onnx", images)
    # Each path through the network is a product of the input, a conv weight and an fc weight (biases add a
    # shorter path), each rounded to FP16 once; a runtime computing in FP16 rounds the conv, pool and fc
    # outputs too: at most 6 roundings of relative size u on any path, so |Δlogit| ≤ 6 u Σ|terms| (first
    # order). ONNX Runtime's CPU provider computes FP16 ops in FP32, so here only the first 3 happen.
    bound = 6 * UNIT_ROUNDOFF * _magnitude(src, tmp_path, images)
    assert np.all(np.abs(got - reference) <= bound), float(np.max(np.abs(got - reference) - bound))
    assert np.abs(got - reference).max() > 0  # the weights really were rounded
    # Where the top two logits are further apart than twice the bound, FP16 cannot change the top-1.
    top2 = np.sort(reference, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * bound.max(axis=1)
    assert clear.sum() > len(images) // 2
    assert np.array_equal(got[clear].argmax(1), reference[clear].argmax(1))


def test_the_default_is_autocast():
    """bench/results/fp16-converters-20261201.md: AutoCast keeps a node that would overflow FP16 in FP32."""
    assert DEFAULT_CONVERTER == AUTOCAST


def test_autocast_keeps_an_overflowing_layer_in_fp32(tmp_path, images):
    """Logits past 65504 (FP16's largest value): AutoCast's reference run keeps the Gemm in FP32;
    onnxconverter-common converts it and a runtime computing in FP16 would return inf."""
    src = tiny_onnx(tmp_path / "fp32.onnx")
    model = onnx.load(str(src))
    for init in model.graph.initializer:
        if init.name in ("fc_w", "fc_b"):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1e6, init.name))
    onnx.save(model, str(src))
    assert np.abs(_logits(src, images)).max() > 65504
    assert to_fp16(src, tmp_path / "autocast.onnx", AUTOCAST)["fp32_nodes_left"] >= 1
    assert to_fp16(src, tmp_path / "occ.onnx", ONNXCONVERTER)["fp32_nodes_left"] == 0


def test_graph_facts_counts_casts_and_fp32_nodes(tmp_path):
    model = onnx.load(str(tiny_onnx(tmp_path / "fp32.onnx")))
    facts = graph_facts(model)
    assert {k: facts[k] for k in ("casts", "nodes", "fp32_nodes")} == {"casts": 0, "nodes": 5, "fp32_nodes": 5}
    assert len(facts["fp32_node_names"]) == 5 and any("(Conv)" in name for name in facts["fp32_node_names"])


def test_an_unknown_converter_is_refused_with_the_choices(tmp_path):
    with pytest.raises(ConfigError, match="unknown FP16 converter 'tf2onnx'") as err:
        to_fp16(tiny_onnx(tmp_path / "m.onnx"), tmp_path / "out.onnx", "tf2onnx")
    assert "autocast" in err.value.fix and "onnxconverter-common" in err.value.fix


@pytest.mark.parametrize("converter, module", [(AUTOCAST, "modelopt.onnx.autocast"),
                                                (ONNXCONVERTER, "onnxconverter_common")])
def test_a_missing_converter_says_what_to_install(tmp_path, monkeypatch, converter, module):
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    with pytest.raises(MissingDependencyError) as err:
        to_fp16(tiny_onnx(tmp_path / "m.onnx"), tmp_path / "out.onnx", converter)
    assert "edgefold[modelopt]" in err.value.fix and not (tmp_path / "out.onnx").exists()


def _range_plant(path):
    """x → Relu(x − 1.5) × 300 × 300 → spatial mean → × 1/90000 → MatMul. AutoCast's own reference run feeds random
    values in [-1, 1], where the Relu is 0 everywhere; real images above 1.5 drive the products past FP16's 65504."""
    from onnx import TensorProto, helper

    weight = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    nodes = [helper.make_node("Sub", ["x", "shift"], ["s"], name="shift"),
             helper.make_node("Relu", ["s"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "k"], ["big0"], name="scale"),
             helper.make_node("Mul", ["big0", "k"], ["big"], name="scale2"),
             helper.make_node("ReduceMean", ["big"], ["m"], axes=[2, 3], keepdims=0, name="pool"),
             helper.make_node("Mul", ["m", "inv"], ["m2"], name="unscale"),
             helper.make_node("MatMul", ["m2", "w"], ["y"], name="fc")]
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
             (("shift", 1.5), ("k", 300.0), ("inv", 1 / 90000))] + [numpy_helper.from_array(weight, "w")]
    graph = helper.make_graph(nodes, "plant", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_layers_past_fp16s_range_on_the_calibration_images_stay_fp32_and_are_named(tmp_path):
    """The FP16 rung decides its FP32 layers on real images (the calibration slice), not on AutoCast's random [-1, 1]
    inputs, which miss a range only real images reach; the kept layers are named and the outputs compared."""
    src = _range_plant(tmp_path / "plant.onnx")
    images = np.random.default_rng(1).uniform(0, 3, size=(32, 3, 8, 8)).astype(np.float32)
    blind = to_fp16(src, tmp_path / "blind.onnx", AUTOCAST)
    assert blind["fp32_nodes_left"] == 0  # the random reference never sees the overflow
    seen = to_fp16(src, tmp_path / "seen.onnx", AUTOCAST, calibration=images)
    assert {"scale2 (Mul)", "pool (ReduceMean)"} <= set(seen["fp32_nodes"])
    parity = seen["calibration_parity"]
    assert parity["images"] == 32 and parity["nonfinite"] == 0 and parity["top1_agreement"] == 1.0
    assert parity["max_relative_diff"] < 4 * UNIT_ROUNDOFF
