"""The detection stages' registry (``task: detection``), apart from :mod:`pipeline.stages.base` so that adding a
detection stage leaves every classification stage's code hash, and so its cached results, alone.

Detection stages register under the classification stages' names (``--until``/``--force`` take the same words);
the runner picks the registry by the recipe's task.
"""

from __future__ import annotations

from device.registry import Registry
from pipeline.stages.base import Stage

DETECTION_STAGES: Registry[Stage] = Registry("detection stage")
