"""A native crash names itself: a teacher whose training step dies of SIGSEGV (planted: the architecture, installed
as a package of its own, kills its own process in training, as PyTorch 2.14.1 does training timm's fastvit_t8 in
channels_last on a CPU) ends ``edgefold run`` with the stage, the step and the setting to change, not a bare exit
139. In channels_last the trial step in a forked child finds it first; where no trial runs, the supervising
``edgefold`` reads what the dying process last recorded."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests.arch_plugin import install

CRASHING = '''
import os, signal
from torch import nn


class Crashing(nn.Module):
    """Dies of SIGSEGV on a training forward: always, or only on channels_last inputs (EDGEFOLD_TEST_CRASH)."""

    def __init__(self, num_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        import torch

        mode = os.environ.get("EDGEFOLD_TEST_CRASH", "")
        nhwc = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        if self.training and (mode == "always" or (mode == "channels_last" and nhwc)):
            os.kill(os.getpid(), signal.SIGSEGV)
        return self.fc(self.body(x))


def build(num_classes, in_channels=3):
    return Crashing(num_classes)


CRASH_NET = {"build": build, "classifier": "fc"}
'''


@pytest.fixture(scope="module")
def crashing(tmp_path_factory):
    """A package registering ``crash_net`` under ``edgefold.architectures``, installed into a directory of its own."""
    from tests import arch_plugin

    folder = tmp_path_factory.mktemp("crash-plugin")
    original = dict(arch_plugin.PACKAGE)
    arch_plugin.PACKAGE["{module}/__init__.py"] = CRASHING.replace("{", "{{").replace("}", "}}")
    try:
        return install(folder, "edgefold-crash-arch", 'crash_net = "edgefold_crash_arch:CRASH_NET"')
    finally:
        arch_plugin.PACKAGE.clear()
        arch_plugin.PACKAGE.update(original)


def _edgefold_run(site, tmp_path, mode: str, *sets: str) -> subprocess.CompletedProcess:
    """``edgefold run tiny`` through the console script's entry (supervised), teacher ``crash_net``, to the teacher."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.getcwd()]), "EDGEFOLD_TEST_CRASH": mode,
           "EDGEFOLD_PROGRESS": "0"}
    env.pop("EDGEFOLD_BREADCRUMB", None)
    args = ["run", "tiny", "--runs-dir", str(tmp_path / "runs"), "--until", "teacher",
            "--set", "teacher.arch=crash_net", "--set", "teacher.train.epochs=1",
            *[item for pair in sets for item in ("--set", pair)]]
    code = f"import sys; from pipeline.cli import console; sys.exit(console({args!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_a_planted_crash_in_the_first_training_step_ends_with_the_stage_step_and_setting(crashing, tmp_path):
    result = _edgefold_run(crashing, tmp_path, "always")
    assert result.returncode == 2, result.stderr[-2000:]
    error = next(line for line in result.stderr.splitlines() if line.startswith("error:"))
    assert "the teacher stage, training step 1 of epoch 1" in error and "died of SIGSEGV (signal 11)" in error
    assert "memory format contiguous" in error
    fix = next(line for line in result.stderr.splitlines() if line.strip().startswith("fix:"))
    assert "OMP_NUM_THREADS=1" in fix and "channels_last" not in fix, "contiguous already: not the trigger"


@pytest.mark.slow
def test_channels_last_that_crashes_is_found_by_a_trial_step_in_a_child(crashing, tmp_path):
    """Asked for channels_last, the run stops before its first step with the key; left to the engine, it trains
    contiguous and says so."""
    asked = _edgefold_run(crashing, tmp_path, "channels_last", "teacher.train.channels_last=true")
    assert asked.returncode == 2, asked.stderr[-2000:]
    assert "a trial training step in channels_last died of SIGSEGV in a child process" in asked.stderr
    assert "SET='teacher.train.channels_last=false'" in asked.stderr
    assert not (tmp_path / "runs" / "tiny" / "latest" / "teacher" / "model.pt").exists()


def test_the_engine_falls_back_to_contiguous_when_its_own_channels_last_choice_crashes(monkeypatch):
    """The engine chose channels_last itself (64 px and up on a CPU): the trial's crash makes it train contiguous."""
    import torch

    from pipeline.core.recipe import TrainConfig
    from pipeline.train import engine
    from pipeline.train.engine import InputBatches, Step, fit

    class NoChannelsLast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)

        def forward(self, x):
            if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
                os.kill(os.getpid(), 11)
            return self.conv(x).mean()

    def step(model, batch, device, memory_format):
        return Step(model(batch.to(device).contiguous(memory_format=memory_format)), len(batch))

    formats = []
    original = engine._Trainer._update

    def recording(self, batch):
        formats.append(self.channels_last)
        return original(self, batch)

    monkeypatch.setattr(engine._Trainer, "_update", recording)
    model = NoChannelsLast()
    history = fit(model, InputBatches(torch.randn(8, 3, 64, 64), 4, 0), TrainConfig(epochs=1, batch_size=4, lr=0.01),
                  step, torch.device("cpu"), "teacher")
    assert history and formats == [False, False], "trained contiguous after the trial"


def test_the_report_of_a_crash_names_what_was_recorded():
    from pipeline.core.crash import crash_report

    message, fix = crash_report(6, {"stage": "distill", "train_key": "distill.train", "step": 3, "epoch": 2,
                                    "desc": "distill", "memory_format": "channels_last", "autocast": "fp32"})
    assert message.startswith("the distill stage, training step 3 of epoch 2 (distill) died of SIGABRT (signal 6)")
    assert "SET='distill.train.channels_last=false'" in fix
    message, fix = crash_report(11, {"stage": "export"})
    assert message.startswith("the export stage died of SIGSEGV") and "OMP_NUM_THREADS=1" in fix
    assert textwrap.dedent(fix) == fix


@pytest.mark.slow
def test_timm_fastvit_in_channels_last_with_avx2_kernels_trains_after_the_trial(tmp_path):
    """The crash the issue met, for real: PyTorch 2.14.1's AVX2 kernels corrupt the heap training timm's fastvit_t8
    in channels_last (SIGSEGV or SIGABRT, 3 of 3 here). With the engine's own channels_last choice (64 px on a CPU)
    the trial step takes the crash in its child and the run trains contiguous; without the trial it dies."""
    script = textwrap.dedent("""
        import timm, torch
        from pipeline.core.recipe import TrainConfig
        from pipeline.train.engine import InputBatches, Step, fit

        model = timm.create_model("fastvit_t8", num_classes=10)

        def step(model, batch, device, memory_format):
            logits = model(batch.to(device).contiguous(memory_format=memory_format))
            return Step(logits.logsumexp(1).mean(), len(batch))

        history = fit(model, InputBatches(torch.randn(16, 3, 64, 64), 8, 0),
                      TrainConfig(epochs=1, batch_size=8, lr=0.001), step, torch.device("cpu"), "teacher")
        print("trained", len(history))
        """)
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "EDGEFOLD_PROGRESS": "0",
           "PYTHONPATH": os.getcwd()}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "trained 1" in result.stdout
    if "trial training step in channels_last died" in result.stderr:
        assert "training contiguous instead (teacher.train.channels_last: false" in result.stderr
