"""What the deploy stage writes for a frame job (:mod:`pipeline.deploy.frames`): each rung with its
preprocessing in the graph, checked against the CPU path; the evaluation images as an image set; and what it says
when either cannot be made."""

from __future__ import annotations

import numpy as np

from device.client import AgentError
from device.preprocess import Preprocess
from pipeline.core.recipe import FrameRecipe
from pipeline.deploy.frames import image_set, write_frame_files
from tests.device.agent_process import tiny_onnx

PREPROCESS = Preprocess(16, 18, 3, (0.5,) * 3, (0.25,) * 3)


class Uploads:
    """A client that stores uploads by name and can be told to refuse one (the agent's own refusal)."""

    def __init__(self, refuse: str | None = None):
        self.refuse, self.sent = refuse, []

    def upload(self, path):
        if self.refuse and self.refuse in str(path):
            raise AgentError("upload exceeds the agent's limit of 1 MiB", status=413)
        self.sent.append(path.name)
        return f"{len(self.sent):064x}"


def test_each_rung_gets_its_in_graph_form_and_each_job_names_its_uploads(tmp_path):
    said = []
    artifacts = {"student": tiny_onnx(tmp_path / "student.onnx"), "teacher": tiny_onnx(tmp_path / "teacher.onnx", seed=1)}
    images = [np.full((20, 20, 3), value, np.uint8) for value in (10, 200, 90)]
    files = write_frame_files(FrameRecipe(width=64, height=48, format="nv12", source="images"), tmp_path, artifacts,
                              dict.fromkeys(artifacts, PREPROCESS.to_dict()), lambda: images, said.append)
    assert sorted(p.name for p in files.in_graph.values()) == ["frame-student.onnx", "frame-teacher.onnx"]
    assert 0 <= files.in_graph_difference <= 3 / 255 / 0.25 and files.image_count == 3
    spec = files.spec(Uploads(), "student")
    assert spec.in_graph is not None and spec.images.count == 3 and spec.source == "images" and spec.format == "nv12"
    refused = files.spec(Uploads(refuse="images"), "teacher")
    assert refused.source == "synthetic" and refused.images is None and refused.in_graph is not None
    assert said == ["the frame image set was not uploaded (upload exceeds the agent's limit of 1 MiB): synthetic "
                    "frames instead"]
    record = files.record("deploy")
    assert record["in_graph"] == {"student": "deploy/frame-student.onnx", "teacher": "deploy/frame-teacher.onnx"}


def test_an_interpolation_the_graph_cannot_carry_is_said_and_the_cpu_path_still_timed(tmp_path):
    area = Preprocess(16, 18, 3, (0.5,) * 3, (0.25,) * 3, "area")
    files = write_frame_files(FrameRecipe(), tmp_path, {"student": tiny_onnx(tmp_path / "s.onnx")},
                              {"student": area.to_dict()}, None, print)
    assert files.in_graph == {} and "interpolation 'area' has no ONNX Resize mode" in files.in_graph_note
    assert files.spec(Uploads(), "student").in_graph is None
    off = write_frame_files(FrameRecipe(in_graph=False), tmp_path, {"student": tmp_path / "s.onnx"},
                            {"student": PREPROCESS.to_dict()}, None, print)
    assert off.in_graph_note == "the in-graph form was not timed: deploy.frame.in_graph is false"


def test_images_of_one_size_go_as_taken_and_of_many_as_centre_squares():
    grey = [np.arange(28 * 28, dtype=np.uint8).reshape(28, 28)] * 2
    same, note = image_set(grey)
    assert same.shape == (2, 28, 28, 3) and note is None and (same[0, :, :, 1] == grey[0]).all()
    mixed, note = image_set([np.zeros((40, 60, 3), np.uint8), np.zeros((80, 50, 3), np.uint8),
                             np.zeros((30, 30, 3), np.uint8)])
    assert mixed.shape == (3, 40, 40, 3) and note == ("the evaluation images differ in size: each was sent as its "
                                                      "centre square at 40×40")


def test_a_scored_tasks_rungs_each_get_their_own_prefix_and_every_job_names_its_post_processor(tmp_path):
    """Detection and segmentation feed plain pixels (their graphs normalize): each rung's prefix is written from its
    own preprocessing, and each job's frame names the task's post-processor (top_k stays off the wire)."""
    from pipeline.deploy.frames import tensor_preprocess

    artifacts = {"student": tiny_onnx(tmp_path / "student.onnx"), "teacher": tiny_onnx(tmp_path / "teacher.onnx")}
    plain = tensor_preprocess(16)
    assert Preprocess.from_dict(plain) == Preprocess(16, 16, 3, (0.0,) * 3, (1.0,) * 3, "bilinear")
    assert Preprocess.from_dict(tensor_preprocess(16, "bgr", "0-255")).std == (1 / 255,) * 3
    files = write_frame_files(FrameRecipe(width=40, height=30), tmp_path, artifacts, dict.fromkeys(artifacts, plain),
                              None, print, postprocess="segmentation")
    assert sorted(files.in_graph) == ["student", "teacher"] and files.in_graph_difference <= 3 / 255
    spec = files.spec(Uploads(), "teacher")
    assert spec.postprocess == "segmentation" and spec.model_dump()["postprocess"] == "segmentation"
    classifier = write_frame_files(FrameRecipe(in_graph=False), tmp_path, {"student": artifacts["student"]},
                                   {"student": plain}, None, print).spec(Uploads(), "student")
    assert classifier.postprocess == "top_k" and "postprocess" not in classifier.model_dump()
