"""The job request schema: typed, bounded, finite, and exactly what the pipeline sends."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from device.preprocess import Preprocess
from device.service.problems import describe_problems, field_problems, safe_text
from device.schema import JobSpec

SHA = "a" * 64


@st.composite
def preprocessings(draw):
    channels = draw(st.sampled_from([1, 3]))
    size = draw(st.integers(1, 1024))
    finite = st.floats(-5, 5, allow_nan=False, allow_infinity=False) | st.integers(-5, 5)
    return Preprocess(input_size=size, resize=draw(st.integers(size, size + 512)), channels=channels,
                      mean=tuple(draw(st.lists(finite, min_size=channels, max_size=channels))),
                      std=tuple(draw(st.lists(st.floats(1e-3, 100), min_size=channels, max_size=channels))),
                      interpolation=draw(st.sampled_from(["bilinear", "area", "nearest", "bicubic"])))


@settings(max_examples=200, deadline=None)
@given(preprocessings())
def test_every_preprocess_to_dict_is_a_valid_spec_and_keeps_its_shape(prep):
    data = prep.to_dict()
    spec = JobSpec.model_validate({"artifact": SHA, "preprocess": data})
    assert spec.model_dump()["preprocess"] == data
    # Through JSON and back (the wire, then the agent's database): the same spec.
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec
    assert json.loads(spec.model_dump_json())["preprocess"] == json.loads(json.dumps(data))


def test_the_deploy_stages_job_validates():
    # The shape classification's deploy hooks build (a raw dict, preprocess from export's preprocess.json).
    prep = json.loads(json.dumps(Preprocess(input_size=28, resize=28, channels=1, mean=(0.286,), std=(0.353,))
                                 .to_dict()))
    spec = {"artifact": SHA, "runtime": "onnxruntime", "precision": "fp32", "batch_sizes": [1, 32], "duration_s": 3.0,
            "warmup_iterations": 10, "idle_s": 1.0, "sample_hz": 20.0, "telemetry": "auto", "timeout_s": 1800.0,
            "preprocess": prep, "label": "run/student_int8"}
    assert JobSpec.model_validate(spec).model_dump(exclude_unset=True) == spec


@pytest.mark.parametrize("tensorrt", ["0", "10.3.0", "11.0"])
def test_the_deploy_stages_own_job_spec_validates(tensorrt):
    pytest.importorskip("torch", reason="the pipeline (build side) needs torch")
    from pipeline.core.recipe import DeployConfig
    from pipeline.deploy.jobs import job_spec

    prep = json.loads(json.dumps(Preprocess(input_size=32, resize=36, channels=3, mean=(0.485, 0.456, 0.406),
                                            std=(0.229, 0.224, 0.225)).to_dict()))
    for rung in ("teacher", "student_int8"):
        spec = job_spec(rung, SHA, {"tensorrt": tensorrt}, DeployConfig(), prep, f"run/{rung}")
        assert isinstance(spec, JobSpec), "the deploy stage builds the agent's own schema, not a dict"
        # As the client sends it: JSON on the wire.
        wire = spec.model_dump(mode="json", exclude_none=True)
        assert JobSpec.model_validate_json(json.dumps(wire)) == spec


@pytest.mark.parametrize("tensorrt", ["10.3.0", "10.16.0", "11.1.0"])
def test_the_deploy_stage_sends_each_rungs_own_precision(tensorrt):
    """No rung is relabelled: an FP32 rung is an FP32 job on TensorRT 10 too (it was sent as fp16 and
    timed in FP16 while scored in FP32); FP16 is its own rung, whose artifact says FP16."""
    pytest.importorskip("torch", reason="the pipeline (build side) needs torch")
    from pipeline.core.recipe import DeployConfig
    from pipeline.deploy.jobs import job_spec

    prep = json.loads(json.dumps(Preprocess(input_size=32, resize=32, channels=3, mean=(0.5,) * 3,
                                            std=(0.25,) * 3).to_dict()))
    sent = {rung: job_spec(rung, SHA, {"tensorrt": tensorrt}, DeployConfig(), prep, rung).precision
            for rung in ("teacher", "teacher_fp16", "student", "student_fp16", "student_int8")}
    assert sent == {"teacher": "fp32", "teacher_fp16": "fp16", "student": "fp32", "student_fp16": "fp16",
                    "student_int8": "int8"}


# One case per rule of the job schema: pydantic applies the model-wide ones (strict types, finite floats, no
# unknown keys) and each Field's bounds alike, so one field stands for each; the cross-field and text rules are
# the schema's own. Each must name its field, and the answer must stay JSON.
BAD = [
    ("duration_s", math.nan), ("idle_s", -math.inf), ("iterations", "5"), ("threads", True),
    ("warmup_iterations", 10**400), ("label", "\ud800"), ("telemetry", ["host", "host"]),
    ("preprocess", {"input_size": 16, "resize": math.nan, "channels": 3, "mean": [0.5] * 3, "std": [0.25] * 3}),
    ("preprocess", {"input_size": 16, "resize": 16, "channels": True, "mean": [0.5], "std": [0.25]}),
    ("preprocess", {"input_size": 16, "resize": 16, "channels": 1, "mean": [math.inf], "std": [0.25]}),
    ("preprocess", {"input_size": 16, "resize": 8, "channels": 1, "mean": [0.5], "std": [0.25]}),
    ("preprocess", {"input_size": 16, "resize": 16, "channels": 1, "mean": [0.5], "std": [0.25], "extra": 1}),
]


@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}={v!a}"[:40] for f, v in BAD])
def test_non_finite_out_of_range_and_mistyped_values_are_refused(field, value):
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate({"artifact": SHA, field: value})
    problems = field_problems(err.value.errors())
    assert field in describe_problems(problems)  # the refusal names the field
    # What the agent answers with must always be JSON, whatever the input was.
    json.dumps({"detail": describe_problems(problems), "errors": problems}, allow_nan=False).encode("utf-8")


def test_safe_text_escapes_lone_surrogates_and_cuts():
    assert safe_text("a\ud800b") == "a\\ud800b" and safe_text("héllo") == "héllo"
    assert safe_text("x" * 50, limit=10) == "x" * 10 + "…"


def test_the_client_refuses_what_the_agent_would_refuse_before_sending():
    from device.client import AgentClient, AgentError

    with AgentClient("http://127.0.0.1:9", "token-never-sent") as client:  # nothing listens: nothing is sent
        for bad in ({"duration_s": math.nan}, {"iterations": "5"}, {"label": "\ud800"}, {"bogus": 1}):
            with pytest.raises(AgentError) as err:
                client.submit({"artifact": SHA, **bad})
            assert err.value.status == 422 and "invalid job spec" in err.value.message
        with pytest.raises(AgentError) as err:  # a tuple is a list on the wire: valid, so it is sent
            client.submit({"artifact": SHA, "batch_sizes": (1, 8)})
        assert err.value.status == 0


def test_a_job_names_its_post_processor_and_an_older_clients_job_reads_as_before():
    """2.13: ``evaluation.postprocess`` names what the device runs on the outputs; a job without it (a client before
    2.13) reads as it did (a sidecar: detection, else top-k), and a name that contradicts the fields is refused."""
    from device.schema import EvaluationSpec

    assert EvaluationSpec(artifact=SHA, images=3).postprocess == "top_k"
    assert EvaluationSpec(artifact=SHA, images=3, head=SHA).postprocess == "detection"
    assert EvaluationSpec(artifact=SHA, images=3, head=SHA, postprocess="detection").head == SHA
    with pytest.raises(ValidationError, match="postprocess detection needs head"):
        EvaluationSpec(artifact=SHA, images=3, postprocess="detection")
    with pytest.raises(ValidationError, match="takes no head"):
        EvaluationSpec(artifact=SHA, images=3, head=SHA, postprocess="top_k")
    with pytest.raises(ValidationError, match="postprocess"):
        EvaluationSpec(artifact=SHA, images=3, postprocess="masks")
    # On the wire without the name where head implies it: what an agent or reader before 2.13 accepts (extra=forbid).
    for spec in (EvaluationSpec(artifact=SHA, images=3, postprocess="top_k"),
                 EvaluationSpec(artifact=SHA, images=3, head=SHA, postprocess="detection")):
        sent = JobSpec(artifact=SHA, evaluation=spec).model_dump(mode="json", exclude_none=True)
        assert "postprocess" not in sent["evaluation"]
        assert JobSpec.model_validate(sent).evaluation.postprocess == spec.postprocess
