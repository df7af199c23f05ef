"""The device's numpy decode + NMS against torchvision's own post-processing on the same raw head outputs.

The device module is torch-free; this test is not: torchvision's ``postprocess_detections`` (with its box coders and
``batched_nms``) and its transform's rescaling are the reference, fed exactly the outputs the numpy path gets.
"""

import copy

import numpy as np
import pytest
import torch

from device.scoring.detection_post import HeadSpecError, head_spec_from_dict, nms, postprocess
from pipeline.tasks.detection.export import head_sidecar
from pipeline.tasks.detection.models import TinyBackbone, build_detector

SIZE = 64
ORIGINAL = [(48, 80), (64, 64)]  # boxes scaled back to another size per image, as torchvision's transform does


def _tiny_retinanet(num_classes: int):
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.retinanet import RetinaNet

    anchors = AnchorGenerator(sizes=((8, 12), (16, 24)), aspect_ratios=((0.5, 1.0, 2.0),) * 2)
    return RetinaNet(TinyBackbone(), num_classes, min_size=SIZE, max_size=SIZE, anchor_generator=anchors,
                     score_thresh=0.05)


def _reference(model, raw: torch.Tensor, sidecar: dict, per_level: bool) -> list[dict]:
    """torchvision's post-processing of ``raw`` (N×A×K) with the sidecar's anchors and layout."""
    anchors = torch.tensor(sidecar["anchors"], dtype=torch.float32)
    heads = {key: raw[..., start:end] for key, (start, end) in sidecar["layout"].items()}
    shapes = [tuple(sidecar["image_size"])] * len(raw)
    if per_level:  # FCOS and RetinaNet split outputs and anchors per level before post-processing
        counts = sidecar["anchors_per_level"]
        heads = {key: list(value.split(counts, dim=1)) for key, value in heads.items()}
        found = model.postprocess_detections(heads, [list(anchors.split(counts))] * len(raw), shapes)
    else:
        found = model.postprocess_detections(heads, [anchors] * len(raw), shapes)
    return model.transform.postprocess(found, shapes, ORIGINAL)


def _random_raw(sidecar: dict, positive_boxes: bool, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    width = max(end for _, end in sidecar["layout"].values())
    raw = torch.randn(len(ORIGINAL), len(sidecar["anchors"]), width, generator=generator)
    start, end = sidecar["layout"]["cls_logits"]
    raw[..., start:end] = raw[..., start:end] * 2 - 1  # spread scores across the threshold
    if positive_boxes:  # FCOS's head puts its distances through a ReLU
        start, end = sidecar["layout"]["bbox_regression"]
        raw[..., start:end] = raw[..., start:end].abs()
    return raw


@pytest.mark.parametrize("arch", ["tiny_fcos", "ssdlite320_mobilenet_v3_large", "tiny_retinanet"])
def test_numpy_postprocess_matches_torchvision(arch):
    torch.manual_seed(0)
    if arch == "tiny_retinanet":
        model, offset, per_level = _tiny_retinanet(3).eval(), 0, True
    else:
        model = build_detector(arch, 3).eval()
        offset, per_level = (1, False) if arch.startswith("ssdlite") else (0, True)
    sidecar = head_sidecar(model, arch, 320 if arch.startswith("ssdlite") else SIZE, offset)  # SSDlite: 320 only
    raw = _random_raw(sidecar, positive_boxes=arch == "tiny_fcos")
    spec = head_spec_from_dict(sidecar)
    with torch.no_grad():
        expected = _reference(model, raw, sidecar, per_level)
    got = postprocess(spec, raw.numpy(), ORIGINAL)
    for mine, theirs in zip(got, expected):
        assert len(theirs["boxes"]) > 10, "the reference keeps detections: the comparison has something to compare"
        assert len(mine["boxes"]) == len(theirs["boxes"])
        assert np.array_equal(mine["labels"] + offset, theirs["labels"].numpy())
        np.testing.assert_allclose(mine["scores"], theirs["scores"].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(mine["boxes"], theirs["boxes"].numpy(), rtol=1e-4, atol=1e-3)


def test_nms_matches_torchvision_on_crowded_boxes():
    from torchvision.ops import nms as tv_nms

    rng = np.random.default_rng(1)
    corners = rng.uniform(0, 50, (300, 2)).astype(np.float32)
    boxes = np.concatenate([corners, corners + rng.uniform(5, 30, (300, 2)).astype(np.float32)], axis=1)
    scores = rng.random(300).astype(np.float32)
    for threshold in (0.3, 0.5, 0.7):
        expected = tv_nms(torch.from_numpy(boxes), torch.from_numpy(scores), threshold).numpy()
        got = nms(boxes, scores, threshold)
        assert 10 < len(got) < 300 and np.array_equal(got, expected)


def test_a_sidecar_that_contradicts_itself_is_refused_with_a_fix():
    sidecar = head_sidecar(build_detector("tiny_fcos", 3).eval(), "tiny_fcos", SIZE, 0)
    broken = copy.deepcopy(sidecar)
    broken["anchors"] = broken["anchors"][:-1]
    with pytest.raises(HeadSpecError, match="anchors_per_level sums to 80 but 79 anchors") as err:
        head_spec_from_dict(broken)
    assert "export" in err.value.fix
    with pytest.raises(HeadSpecError, match="schema"):
        head_spec_from_dict({**sidecar, "schema": "edgefold.detection_head/0"})
    spec = head_spec_from_dict(sidecar)
    with pytest.raises(HeadSpecError, match="does not fit"):
        postprocess(spec, np.zeros((1, 80, spec.width + 1), np.float32))
