"""The detection stages' registry (``task: detection``), apart from :mod:`pipeline.stages.base` so that adding a
detection stage leaves every classification stage's code hash, and so its cached results, alone.

Detection stages register under the classification stages' names (``--until``/``--force`` take the same words),
as far as they are built; the runner picks the registry by the recipe's task.
"""

from __future__ import annotations

from device.registry import Registry
from pipeline.stages.base import Stage

DETECTION_STAGES: Registry[Stage] = Registry("detection stage")

NOT_BUILT = {
    "evaluate": "the evaluate stage (every rung's mAP with intervals and per-class changes in one table; the export and "
                "quantize stages already record the teacher's, student's and INT8 student's mAP through the device's "
                "decode)",
    "deploy": "the deploy stage: a detection job for the agent (the sidecar uploaded with the ONNX, decode + NMS timed "
              "apart from the network, and the evaluation set's detections returned for device-measured mAP; "
              "device.detection_post is the decode it would run)",
    "report": "the report's detection section (mAP per rung, the box head's INT8 cost, network vs post-processing "
              "latency)",
}
"""What a detection run still lacks, stage by stage: the runner's StageError names it (issue 28)."""

