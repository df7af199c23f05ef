"""The recipe's forms of two agent jobs (``deploy.frame``, ``deploy.sustained``): the job's own spec, and what the
deploy stage fills in or chooses (the uploads a frame job names, the rung a sustained job runs); and the deploy
section of the tasks whose rungs the device scores through their own post-processor (:class:`ScoredDeployConfig`)."""

from __future__ import annotations

from typing import ClassVar, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from device.jobs.frame_schema import FrameSpec
from device.schema import IdleSeconds
from device.jobs.sustain_schema import ALLOWANCE_S, SustainedSpec
from pipeline.core.rungs import DEPLOYED


class FrameRecipe(FrameSpec):
    """``deploy.frame``: a job's frame (:class:`FrameSpec`), and whether each rung is also sent with the preprocessing
    written into its graph (:mod:`pipeline.deploy.frame_prefix`); the uploads a job names are the deploy stage's to fill."""

    in_graph: bool = Field(True, description="also time each rung with the preprocessing inside its graph (a uint8 "
                                             "frame in), against the CPU path")
    images: None = Field(None, description="filled by the deploy stage (source: images)")
    postprocess: None = Field(None, description="filled by the deploy stage: the task's post-processor")
    needs_artifacts: ClassVar[bool] = False


# The settings a sweep of "all" modes is budgeted for before the board says (the recipe's limit on named modes).
ALL_MODES_BUDGETED = 16


class SustainedRecipe(SustainedSpec):
    """``deploy.sustained``: a sustained job (:class:`SustainedSpec`) for one rung on every device."""

    rung: str = Field(DEPLOYED, description="the rung to run (one of deploy.rungs; default: the deployed student)")
    swept: bool = Field(False, description="run under each setting of deploy.sweep, one result each, the device "
                                           "restored after (its first accelerator only); false: the mode found")

    def job_spec(self) -> SustainedSpec:
        """The agent's part of it."""
        return SustainedSpec(**self.model_dump(exclude={"rung", "swept"}))

    def settings(self, sweep) -> int:
        """The most runs a job makes under the recipe's ``deploy.sweep`` on any device (``all`` modes: budgeted at
        :data:`ALL_MODES_BUDGETED`; a GPU server's knob, or a Jetson's modes × jetson_clocks, whichever is more):
        the recipe's check against the agent's largest timeout. A job counts its own device's
        (:func:`pipeline.deploy.jobs.job_spec`)."""
        if not self.swept or sweep is None:
            return 1
        modes = ALL_MODES_BUDGETED if sweep.modes == "all" else len(sweep.modes)
        jetson = modes * (len(sweep.jetson_clocks) if sweep.jetson_clocks else 1)
        return max(jetson, len(sweep.power_limits_w or sweep.gpu_clocks_mhz or []))

    def check(self, deploy, timeout_key: str = "job_timeout_s") -> None:
        """Against the rest of ``deploy``: a deployed rung, one of its batch sizes, a sweep to follow when swept,
        and within the agent's largest timeout with the build's timeout.

        Args:
            timeout_key: The section's key for one job's limit, the build's (``job_timeout_s``, ``timeout_s``).

        Raises:
            ValueError: Naming the key and the fix (the recipe's validation reports it with its path).
        """
        rungs = tuple(deploy.rungs)
        sweep, timeout_s = getattr(deploy, "sweep", None), getattr(deploy, timeout_key)
        if self.rung not in rungs:
            raise ValueError(f"deploy.sustained.rung {self.rung!r} is not deployed: one of {list(rungs)}")
        if self.batch_size not in deploy.batch_sizes:
            raise ValueError(f"deploy.sustained.batch_size {self.batch_size} is not one of deploy.batch_sizes "
                             f"{deploy.batch_sizes}")
        if self.swept and sweep is None:
            raise ValueError("deploy.sustained.swept follows deploy.sweep's settings: give deploy.sweep (edgefold "
                             "sustain --swept --set 'deploy.sweep.modes=[15W, MAXN_SUPER]'), or set swept false")
        if timeout_s < ALLOWANCE_S:
            raise ValueError(f"deploy.{timeout_key} {timeout_s:g} s is under the {ALLOWANCE_S:g} s a sustained job "
                             "needs to load, build and write its result: raise it")
        settings = self.settings(sweep)
        if timeout_s + self.runs_s(settings, sweep.settle_timeout_s if self.swept else None) > 86_400:
            every = (f" (a sweep of all modes counted as {ALL_MODES_BUDGETED}: name them in deploy.sweep.modes)"
                     if self.swept and sweep.modes == "all" else "")
            raise ValueError(f"deploy.sustained.minutes {self.minutes:g} × {settings} setting(s){every} and "
                             f"deploy.{timeout_key} {timeout_s:g} s (its build) exceed the agent's largest "
                             "timeout, 24 h")


# Classification's deploy keys a scored task's section does not take, and why (refused by name, not as unknown).
NOT_SCORED = {
    "sweep": "a power-mode sweep (nvpmodel × jetson_clocks on a Jetson, NVML limits on a GPU server) is built for "
             "classification runs only so far: measure each mode with make edge EDGE=… at that mode",
    "latency_budget_ms": "the latency budget chooses among a classification sweep's points: no sweep here",
    "runtimes": "the Torch-TensorRT road sends classification's torch programs: this task deploys ONNX only",
    "torch_programs": "the Torch-TensorRT road sends classification's torch programs: this task deploys ONNX only",
    "job_timeout_s": "here the key is deploy.timeout_s",
    "duration_s": "here each window runs deploy.iterations calls",
    "min_iterations": "here each window runs deploy.iterations calls",
    "rungs": "every rung of the ladder is deployed here",
}


class ScoredDeployConfig(BaseModel):
    """Every rung to each device's agent (a loopback agent without EDGE=/DC=/DEVICES=): timed in interleaved rounds,
    then scored on the device by the post-processor its task names (detection: decode + NMS; segmentation: the
    argmax). Detection's and segmentation's deploy section; classification's is
    :class:`pipeline.core.recipe.DeployConfig`."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # a recipe section (pipeline.core.recipe.Strict)

    runtime: Literal["auto", "onnxruntime", "tensorrt"] = Field(
        "auto", description="tensorrt where the agent has TensorRT 10+, else onnxruntime (said so in the report)")
    batch_sizes: list[int] = Field([1], min_length=1, description="engine batches timed")
    iterations: int = Field(50, ge=2, description="timed calls per batch")
    rounds: int = Field(3, ge=1, le=50, description="interleaved timing rounds: every rung once per round, so a busy "
                                                    "spell hits all of them; the network p50's interval and each "
                                                    "rung's ratio to the FP32 student are over rounds")
    warmup_iterations: int = Field(5, ge=0)
    idle_s: IdleSeconds = Field(1.0, description="idle power baseline before each job")
    evaluate_images: Optional[int] = Field(None, ge=1, description="test images the device scores (null = all)")
    profile: bool = Field(True, description="the per-layer profile after the timed windows")
    timeout_s: int = Field(1800, ge=10, description="the agent's limit for one job (the wait is 2 minutes longer); "
                                                    "a job past it fails its rung, and the others are measured")
    retries: int = Field(1, ge=0, le=5, description="resubmissions of a job that failed or was interrupted")
    parallel_devices: int = Field(8, ge=1, le=256, description="devices measured at once")
    resamples: int = Field(200, ge=10, description="bootstrap resamples for the device-measured score's interval")
    frame: FrameRecipe | None = Field(None, description="camera frames (width, height, bgr | nv12 | jpeg) each rung "
                                                        "is timed on, from bytes to the task's answer (decode + NMS; "
                                                        "the argmax), on the ONNX road")
    nvinfer: bool = Field(True, description="also measure, after each rung in every round, the graph DeepStream's "
                                            "nvinfer runs where it differs from the rung's (a Softmax at the end, a "
                                            "per-channel 1/std in front): edgefold ship then ships the engine that "
                                            "was timed for it")
    sustained: SustainedRecipe | None = Field(None, description="one rung run without pause for minutes on each "
                                                                "device after the ladder (edgefold sustain): burst "
                                                                "against settled latency, throttling, temperatures")
    # What a scored task's ladder deploys (every rung it has; an ONNX start has no teacher).
    rungs: ClassVar[tuple[str, ...]] = ("teacher", "student", DEPLOYED)

    @model_validator(mode="before")
    @classmethod
    def _not_here(cls, data):
        for key in sorted(set(data) & set(NOT_SCORED) if isinstance(data, dict) else ()):
            raise ValueError(f"deploy.{key} is not taken by this task: {NOT_SCORED[key]}")
        return data

    @model_validator(mode="after")
    def _jobs(self) -> "ScoredDeployConfig":
        if self.frame is not None and self.frame.source == "images":
            raise ValueError("deploy.frame.source: images scores each frame's top-k classes against the labels, a "
                             "classifier's answer; here frames are timed, not scored: source: synthetic")
        if self.sustained is not None:
            if self.sustained.swept:
                raise ValueError("deploy.sustained.swept follows a power sweep, which this task does not run yet "
                                 "(deploy.sweep is classification's): set swept false")
            self.sustained.check(self, timeout_key="timeout_s")
        return self

    @field_validator("batch_sizes")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(b < 1 for b in value) or len(set(value)) != len(value):
            raise ValueError("batch sizes are distinct positive integers")
        return value
