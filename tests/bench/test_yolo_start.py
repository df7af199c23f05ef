"""bench/yolo_start.py's photo set, which Ultralytics trains on and EdgeFold scores on: its COCO annotations and
Ultralytics' label files say the same boxes, and EdgeFold's COCO reader takes the set whole. (The bench itself
installs Ultralytics, AGPL-3.0, outside EdgeFold's dependencies: it is run by hand, not here.)"""

import json

import numpy as np
import pytest


def _bench():
    import importlib.util

    from pipeline.core.codehash import PROJECT_ROOT

    spec = importlib.util.spec_from_file_location("yolo_start_bench", PROJECT_ROOT / "bench" / "yolo_start.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_photo_set_says_the_same_boxes_to_both_tools(tmp_path):
    pytest.importorskip("skimage")
    from pipeline.tasks.detection.data import coco_set

    yolo_start = _bench()

    annotations = yolo_start.photo_set(tmp_path / "photos", 12, seed=5)
    coco = json.loads(annotations.read_text())
    assert [c["name"] for c in coco["categories"]] == list(yolo_start.CLASSES)
    assert len(coco["images"]) == 12 and coco["annotations"]
    for image in coco["images"]:
        mine = [a for a in coco["annotations"] if a["image_id"] == image["id"]]
        lines = (tmp_path / "photos" / "labels" / image["file_name"].replace(".jpg", ".txt")).read_text().split("\n")
        theirs = [[float(v) for v in line.split()] for line in lines if line]
        assert len(theirs) == len(mine)
        for annotation, row in zip(mine, theirs):
            x, y, w, h = annotation["bbox"]
            assert row[0] == annotation["category_id"] - 1
            assert np.allclose(row[1:], [(x + w / 2) / 160, (y + h / 2) / 120, w / 160, h / 120], atol=1e-5)
            assert 0 <= x and x + w <= 160 and 0 <= y and y + h <= 120
    data = coco_set(f"{annotations}@{tmp_path / 'photos' / 'images'}", 10, 2, 64, 0, style="ultralytics")
    assert len(data.train.images) + len(data.test.images) == 12
