"""The recipe's forms of two agent jobs (``deploy.frame``, ``deploy.sustained``): the job's own spec, and what the
deploy stage fills in or chooses (the uploads a frame job names, the rung a sustained job runs)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from device.frame_schema import FrameSpec
from device.sustain_schema import SustainedSpec
from pipeline.core.rungs import DEPLOYED


class FrameRecipe(FrameSpec):
    """``deploy.frame``: a job's frame (:class:`FrameSpec`), and whether each rung is also sent with the preprocessing
    written into its graph (:mod:`pipeline.frame_prefix`); the uploads a job names are the deploy stage's to fill."""

    in_graph: bool = Field(True, description="also time each rung with the preprocessing inside its graph (a uint8 "
                                             "frame in), against the CPU path")
    images: None = Field(None, description="filled by the deploy stage (source: images)")
    needs_artifacts: ClassVar[bool] = False


class SustainedRecipe(SustainedSpec):
    """``deploy.sustained``: a sustained job (:class:`SustainedSpec`) for one rung on every device."""

    rung: str = Field(DEPLOYED, description="the rung to run (one of deploy.rungs; default: the deployed student)")
