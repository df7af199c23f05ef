"""timm's re-parameterisable and two-headed families as teachers, through every stage to evaluate on digits at 32 px
(a few hundred images: the plumbing, not the method). Apart from ``test_byom.py`` so that the two files, each a few
minutes, run on different workers."""

import pytest

pytestmark = pytest.mark.slow

FOLDED_LADDER = {"preprocess.input_size": 32, "data.train_size": 512, "data.test_size": 192, "data.calib_size": 64,
                 "teacher.train.epochs": 3, "teacher.train.lr": 0.002, "distill.train.epochs": 1,
                 "distill.train.lr": 0.001, "prune.round_to": 8, "export.parity_images": 64}


@pytest.mark.parametrize("name, changes", [
    # pruned in its folded form (before, its pruned copy failed to run and no student was reached); with the
    # Torch-TensorRT road, whose device checkpoints are then rebuilt folded, teacher and student alike
    ("fastvit_t8", {"deploy.runtimes": ["tensorrt", "torch_tensorrt"]}),
    ("repvit_m0_9", {}),  # two heads, folded into one: before, refused before any stage
    ("fastvit_t8", {"prune": None, "distill.student": "mobilenet_v3_small"}),  # distilled without pruning
])
def test_a_reparameterisable_or_two_headed_timm_teacher_reaches_an_int8_student(tmp_path, name, changes):
    """timm's FastViT and RepViT as teachers, on digits at 32 px (a few hundred images: the plumbing, not the method):
    every stage to evaluate runs; the pruned rung is pruned in the folded form and exported without folding twice
    (parity checked by the export stage), and a teacher distilled without pruning has no pruned rung."""
    pytest.importorskip("timm")
    from pipeline.runner import run_pipeline

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the other worker's timing tests keep a core
    try:
        ctx = run_pipeline("tiny", runs_dir=tmp_path, until="evaluate",
                           overrides={**FOLDED_LADDER, "teacher.arch": f"timm/{name}", **changes})
    finally:
        torch.set_num_threads(threads)
    stages = ctx.manifest.data["stages"]
    rungs = stages["evaluate"]["metrics"]["rungs"]
    assert rungs["teacher"]["top1"] > 0.4 and rungs["student_int8"]["top1"] > 0.3, "well above chance (10%)"
    exported = stages["export"]["metrics"]["rungs"]
    assert exported["teacher"]["branches_folded"], "the teacher is exported folded"
    if "prune" in changes:
        assert "prune" not in stages and "pruned" not in rungs and "pruned" not in exported
        assert set(rungs) == {"teacher", "student", "student_fp16", "student_int8"}
    else:
        assert stages["prune"]["metrics"]["folded"]
        assert abs(stages["prune"]["metrics"]["macs_fraction"] - 0.5) <= 0.1 * 0.5
        assert exported["student"]["branches_folded"], "the student, pruned folded, is exported so (not folded twice)"
        if "deploy.runtimes" in changes:
            from device.uploads.torch_checkpoint import read_payload

            for rung in ("teacher", "student"):
                payload = read_payload(ctx.manifest.output("export", f"{rung}_device_checkpoint"))
                assert payload["folded"] and exported[rung]["device_checkpoint"]["parity"]["top1_agreement"] == 1.0
        whole = [w["layer"] for w in stages["prune"]["metrics"]["kept_whole"]]
        assert any("downsample" in layer for layer in whole) == (name == "fastvit_t8")
