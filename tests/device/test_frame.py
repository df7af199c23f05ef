"""From camera frame to answer (:mod:`device.frame`): frames made in each format, each part of their path timed with
real OpenCV and ONNX Runtime, the pipelined frame rate, the part that bounds it, and the job that carries it through
a real agent on loopback (a bad frame spec a 422 with its reason)."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from pydantic import ValidationError

from device.frame import FramePath, bound_words, decoder, synthetic_frames, time_frames, to_nv12
from device.frame_schema import FRAME_STAGES, FrameSpec
from device.preprocess import Preprocess
from device.runners import make_runner
from device.schema import JobSpec
from tests.device.agent_process import TOKEN, AgentProcess, tiny_onnx
from tests.slow import slow_fixture

AUTH = {"Authorization": f"Bearer {TOKEN}"}
PREPROCESS = Preprocess(input_size=16, resize=18, channels=3, mean=(0.5,) * 3, std=(0.25,) * 3)


@pytest.mark.parametrize("fmt", ["bgr", "nv12", "jpeg"])
def test_each_format_decodes_to_the_frame_it_was_made_from(fmt):
    spec = FrameSpec(width=64, height=48, format=fmt, frames=4)
    made = synthetic_frames(spec, 2)
    reference = synthetic_frames(FrameSpec(width=64, height=48, format="bgr", frames=4), 2)
    for frame, bgr in zip(made, reference):
        decoded = decoder(fmt)(frame)
        assert decoded.shape == (48, 64, 3) and decoded.dtype == np.uint8
        # NV12 halves the chroma, JPEG quantizes: close to the source, not equal
        tolerance = {"bgr": 0, "nv12": 12, "jpeg": 12}[fmt]
        assert np.abs(decoded.astype(int) - bgr.astype(int)).mean() <= tolerance
    if fmt == "nv12":
        assert made[0].shape == (72, 64)  # H·3/2 rows of W bytes


def test_nv12_is_the_layout_opencv_reads_as_nv12():
    bgr = np.full((4, 4, 3), (30, 120, 200), np.uint8)
    import cv2

    assert np.abs(cv2.cvtColor(to_nv12(bgr), cv2.COLOR_YUV2BGR_NV12).astype(int) - bgr).max() <= 3


@pytest.mark.parametrize("changes, said", [
    ({"width": 0}, "width"),
    ({"format": "yuyv"}, "format"),
    ({"format": "nv12", "height": 1079}, "an NV12 frame has even width and height"),
    ({"rounds": 1}, "rounds"),
])
def test_a_bad_frame_spec_is_refused_with_its_reason(changes, said):
    with pytest.raises(ValidationError, match=said):
        FrameSpec(**changes)


def test_a_frame_job_needs_the_models_preprocessing():
    with pytest.raises(ValidationError, match="frame needs the model's preprocess"):
        JobSpec(artifact="0" * 64, frame=FrameSpec())


def test_the_path_answers_what_the_tensor_path_answers(tmp_path):
    """The frame's top-1 through decode and preprocess equals the model's on the same image preprocessed by the
    project's definition: the path adds time, never a different answer."""
    spec = FrameSpec(width=96, height=64, format="bgr", frames=4)
    with make_runner("onnxruntime", str(tiny_onnx(tmp_path / "tiny.onnx"))) as runner:
        path = FramePath(runner, PREPROCESS, spec)
        for frame in synthetic_frames(spec, 3):
            times, answer = path.timed(frame)
            assert len(times) == len(FRAME_STAGES) and all(t >= 0 for t in times)
            expected = runner.infer(PREPROCESS(frame[:, :, ::-1].copy()))[0].argmax()
            assert answer[0] == expected and len(answer) == 5


class SlowEngine:
    """A loaded ONNX Runtime runner whose calls take at least ``seconds`` (a planted slow engine: a mock of nothing
    but the time, which a real runner cannot be told to take)."""

    def __init__(self, runner, seconds: float):
        self.runner, self.seconds, self.batch_sizes = runner, seconds, None

    def infer(self, batch):
        started = time.perf_counter()
        out = self.runner.infer(batch)
        time.sleep(max(0.0, self.seconds - (time.perf_counter() - started)))
        return out


def test_a_planted_slow_stage_is_named_as_the_bound(tmp_path):
    """A large JPEG into a tiny network: decoding and preprocessing bound the frame rate. Small frames into a network
    planted to take 40 ms a call: the engine bounds it, and the pipelined rate follows the slower thread."""
    with make_runner("onnxruntime", str(tiny_onnx(tmp_path / "tiny.onnx"))) as runner:
        large = time_frames(runner, PREPROCESS, FrameSpec(width=1920, height=1080, format="jpeg", frames=6, rounds=2))
        # decode + preprocess, in their thread, set the rate; the engine is not what bounds it
        assert large["bound"] in ("decode", "preprocess") and " bounds the frame rate: " in large["bound_text"]
        stages = {s["stage"]: s["median_ms"] for s in large["stages"]}
        assert stages["decode"] + stages["preprocess"] > stages["engine"] + stages["postprocess"]
        assert large["top1_agreement"] == 1.0
        small = FrameSpec(width=64, height=48, format="bgr", frames=8, rounds=2)
        slow = time_frames(SlowEngine(runner, 0.04), PREPROCESS, small)
    assert slow["bound"] == "engine" and slow["bound_text"].startswith("the engine bounds the frame rate: ")
    engine = next(s["median_ms"] for s in slow["stages"] if s["stage"] == "engine")
    assert 40 <= engine < 200
    # two threads, the engine the slower: the pipeline runs at the engine's pace, not faster
    assert max(slow["pipelined_fps_rounds"]) <= 1000 / 40 * 1.05
    assert slow["total"]["median_ms"] >= engine


def test_the_bound_sentence_gives_the_measured_rate_and_the_ceilings():
    bound, text = bound_words({"decode": 1.0, "preprocess": 20.0, "engine": 5.0, "postprocess": 0.1}, 41.2)
    assert bound == "preprocess" and text == ("preprocess bounds the frame rate: 41 fps pipelined (its thread alone "
                                              "would allow 48, the engine alone 200)")
    bound, text = bound_words({"decode": 0.0, "preprocess": 1.0, "engine": 9.0, "postprocess": 1.0}, 99.0)
    assert bound == "engine" and text.startswith("the engine bounds the frame rate: 99 fps pipelined (the engine's "
                                                 "thread alone would allow 100")


def test_a_runner_built_for_larger_batches_gets_the_frame_repeated(tmp_path):
    with make_runner("onnxruntime", str(tiny_onnx(tmp_path / "tiny.onnx"))) as runner:
        measured = time_frames(runner, PREPROCESS, FrameSpec(width=64, height=48, frames=4, rounds=2), accepted=[8, 32])
    assert measured["batch_size"] == 8 and "the frame repeated" in measured["note"]


@pytest.fixture(scope="module")
@slow_fixture
def agent(tmp_path_factory):
    with AgentProcess(tmp_path_factory.mktemp("agent")) as process:
        yield process


def test_the_agent_times_the_frame_path_and_refuses_a_bad_spec_with_422(agent, tmp_path):
    model = tiny_onnx(tmp_path / "tiny.onnx")
    quick = {"batch_sizes": [1], "iterations": 5, "warmup_iterations": 1, "idle_s": 0.0, "profile": False,
             "preprocess": PREPROCESS.to_dict()}
    with agent.client() as client:
        sha = client.upload(model)
        job = client.wait(client.submit({"artifact": sha, **quick, "frame": {"width": 320, "height": 240,
                                                                            "format": "nv12", "frames": 4,
                                                                            "rounds": 2}})["id"], timeout_s=120)
        assert job["state"] == "succeeded", job["error"]
        frame = job["result"]["frame"]
        assert [s["stage"] for s in frame["stages"]] == list(FRAME_STAGES)
        assert all(len(s["round_medians_ms"]) == 2 for s in frame["stages"])
        assert frame["bound"] in FRAME_STAGES and len(frame["pipelined_fps_rounds"]) == 2
    for frame, said in (({"width": 0}, "width"), ({"format": "yuyv"}, "format"),
                        ({"format": "nv12", "height": 1079}, "even width and height")):
        response = httpx.post(f"{agent.url}/v1/jobs", json={"artifact": sha, **quick, "frame": frame}, headers=AUTH)
        assert response.status_code == 422 and said in response.text, response.text
