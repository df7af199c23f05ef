"""The post-processors a job names (``EvaluationSpec.postprocess``): what the device does with the engine's outputs
on the evaluation set. The job says which; the device never infers the task from which fields are set.

Each is a module loaded by name when a job names it, exposing ``evaluate_job(runner, job, evaluation, chw,
batch_sizes)`` and ``frame_answer(job, evaluation, k)`` (a camera frame's answer, :class:`device.jobs.frame.FrameAnswer`):
the pipeline's code hashes follow import statements, so a classification deploy is not re-measured by
an edit to the detection decoder. A new task adds its module here and its name to :data:`device.scoring.evaluation_schema.Postprocess`.
"""

from __future__ import annotations

import importlib
from typing import Any, Sequence

from device.schema import EvaluationSpec

POSTPROCESSORS: dict[str, str] = {
    "top_k": "device.scoring.evaluation",                 # classes: the k best per image
    "detection": "device.scoring.detection_evaluation",   # the sidecar's decode + NMS per batch, detections per image
    "segmentation": "device.scoring.segmentation_evaluation",  # the argmax over classes per batch, a mask per image
}


def evaluate(evaluation: EvaluationSpec, job: dict[str, Any], runner, chw: Sequence[int],
             batch_sizes: Sequence[int]) -> dict[str, Any]:
    """The evaluation set through ``runner``'s engine and the post-processor the job names.

    Args:
        evaluation: The job's evaluation (its ``postprocess`` set: the schema fills it for an older client).
        job: The executor's job record (the stored files' paths: ``evaluation_path``, ``head_path``).
        runner: The loaded runner whose engine was timed.
        chw: The model's input C×H×W.
        batch_sizes: The batches the job measured.

    Returns:
        ``device.schema.EvaluationResult`` as a dict.
    """
    module = importlib.import_module(POSTPROCESSORS[evaluation.postprocess])
    return module.evaluate_job(runner, job, evaluation, chw, batch_sizes)


def frame_answer(name: str, job: dict[str, Any], evaluation: EvaluationSpec | None, k: int = 5):
    """A camera frame's answer by the post-processor ``name`` (``FrameSpec.postprocess``): its module's
    ``frame_answer`` with the job's stored files (a detection sidecar) and evaluation.

    Returns:
        A :class:`device.jobs.frame.FrameAnswer`.
    """
    module = importlib.import_module(POSTPROCESSORS[name])
    return module.frame_answer(job, evaluation, k)
