"""Detection recipes: validated like classification ones, unknown keys rejected, and stopped before any stage."""

import copy

import pytest
import yaml

from device.errors import ConfigError, StageError
from pipeline.tasks.detection.recipe import DetectionRecipe
from pipeline.core.recipe import load_recipe, parse_recipe
from pipeline.tasks.classification.recipe import Recipe


@pytest.fixture
def det_raw(repo):
    return yaml.safe_load((repo / "models" / "tiny-det.yaml").read_text())


@pytest.mark.parametrize("name,arch,source", [("ssdlite", "ssdlite320_mobilenet_v3_large", "fmnist-det"),
                                              ("tiny-det", "tiny_fcos", "digits-det")])
def test_shipped_detection_recipes_validate(repo, name, arch, source):
    recipe, path, _ = load_recipe(str(repo / "models" / f"{name}.yaml"))
    assert isinstance(recipe, DetectionRecipe) and recipe.task == "detection" and recipe.name == path.stem
    assert recipe.teacher.arch == arch and recipe.data.source == source
    assert recipe.teacher.size() == (320 if arch.startswith("ssdlite") else 64)


def test_classification_recipes_stay_classification(repo):
    recipe, _, _ = load_recipe(str(repo / "models" / "tiny.yaml"))
    assert isinstance(recipe, Recipe) and recipe.task == "classification"


def test_coco_source_is_accepted_with_a_path(det_raw):
    recipe = parse_recipe(det_raw, overrides={"data.source": "coco:/data/annotations/instances_val2017.json"})
    assert recipe.data.source.startswith("coco:")
    with pytest.raises(ConfigError, match="annotations file"):
        parse_recipe(copy.deepcopy(det_raw), overrides={"data.source": "coco:"})


def test_unknown_detection_key_is_named_with_a_suggestion(det_raw):
    det_raw["prune"]["macs_targt"] = 0.3
    with pytest.raises(ConfigError) as err:
        parse_recipe(det_raw, "tiny-det.yaml")
    assert "prune.macs_targt: unknown key" in str(err.value)
    assert "did you mean 'prune.macs_target'" in str(err.value)


def test_a_classification_section_is_refused_in_a_detection_recipe(det_raw):
    det_raw["preprocess"] = {"resize": 72}  # the detector resizes itself: refused, never silently ignored
    with pytest.raises(ConfigError, match="preprocess: unknown key"):
        parse_recipe(det_raw)


@pytest.mark.parametrize("section, key, value, message", [
    ("quantize", "box_head", "bf16", "quantize.box_head"),          # fp16 | float | int8 only
    ("quantize", "quantizer", "tensorrt", "quantize.quantizer"),   # ort | modelopt, as for a classifier
    ("quantize", "float_islands", "fp16", "quantize.float_islands: unknown key"),  # the box head says it here
    ("postprocess", "iou_threshold", 1.5, "postprocess.iou_threshold"),
    ("export", "opset", 11, "export.opset"),
])
def test_detection_export_quantize_and_postprocess_keys_are_validated(det_raw, section, key, value, message):
    det_raw.setdefault(section, {})[key] = value
    with pytest.raises(ConfigError, match=message):
        parse_recipe(det_raw)


def test_box_head_defaults_to_fp16_and_takes_float_and_int8(det_raw):
    del det_raw["quantize"]["box_head"]  # the shipped recipe names it; the default is what a user's recipe gets
    assert parse_recipe(copy.deepcopy(det_raw)).quantize.box_head == "fp16"
    for setting in ("float", "int8"):
        assert parse_recipe(copy.deepcopy(det_raw), overrides={"quantize.box_head": setting}).quantize.box_head == setting


def test_bad_detector_key_names_the_near_keys(det_raw):
    det_raw["teacher"]["arch"] = "ssdlite320_mobilenet"
    with pytest.raises(ConfigError) as err:
        parse_recipe(det_raw)
    assert "teacher.arch" in str(err.value) and "ssdlite320_mobilenet_v3_large" in str(err.value)


def test_a_classifier_key_is_not_a_detector(det_raw):
    det_raw["teacher"]["arch"] = "resnet50"
    with pytest.raises(ConfigError, match="unknown detection architecture 'resnet50'"):
        parse_recipe(det_raw)


def test_bad_detection_source_names_the_near_keys(det_raw):
    det_raw["data"]["source"] = "fmnist-dt"
    with pytest.raises(ConfigError) as err:
        parse_recipe(det_raw)
    assert "data.source" in str(err.value) and "'fmnist-det'" in str(err.value)


def test_ssdlite_refuses_another_input_size(det_raw):
    with pytest.raises(ConfigError, match="320"):
        parse_recipe(det_raw, overrides={"teacher.arch": "ssdlite320_mobilenet_v3_large", "teacher.input_size": 256})


@pytest.mark.parametrize("canvas,message", [({"objects": [3, 1]}, "fewest"), ({"scale": [0.6, 0.2]}, "smallest"),
                                            ({"size": 8}, "greater than or equal to 16")])
def test_an_undrawable_canvas_is_refused_when_loaded(det_raw, canvas, message):
    det_raw["data"]["canvas"].update(canvas)
    with pytest.raises(ConfigError, match=message):
        parse_recipe(det_raw)


def test_an_unknown_task_names_the_tasks(det_raw):
    det_raw["task"] = "detect"
    with pytest.raises(ConfigError) as err:
        parse_recipe(det_raw)
    assert "'detection'" in err.value.fix


def test_detection_has_every_stage_and_a_missing_one_is_still_refused(repo):
    from device.registry import Registry
    from pipeline.runner import _refuse_unbuilt_stage, _stages_for
    from pipeline.core.stage import STAGE_ORDER

    recipe, _, _ = load_recipe(str(repo / "models" / "tiny-det.yaml"))
    registry = _stages_for(recipe)
    assert set(registry.names()) == set(STAGE_ORDER)
    partial = Registry("detection stage")
    for name in STAGE_ORDER[:-1]:
        partial.add(name, registry.get(name))
    _refuse_unbuilt_stage(recipe, "deploy", partial)  # built: passes
    with pytest.raises(StageError) as err:
        _refuse_unbuilt_stage(recipe, "report", partial)
    assert "report stage is not built for task detection" in err.value.message and "--until deploy" in err.value.fix


def test_a_bad_coco_file_is_named_by_the_data_stage(repo, tmp_path):
    from device.errors import DataError
    from pipeline.runner import run_pipeline

    (tmp_path / "ann.json").write_text('{"images": [], "annotations": []}')
    with pytest.raises(DataError, match="categories"):
        run_pipeline(str(repo / "models" / "tiny-det.yaml"), runs_dir=tmp_path / "runs",
                     overrides={"data.source": f"coco:{tmp_path / 'ann.json'}"})


def test_missing_detector_weights_are_named_before_the_data_stage(repo, tmp_path):
    from device.errors import CheckpointError
    from pipeline.runner import run_pipeline

    with pytest.raises(CheckpointError, match="does not exist"):
        run_pipeline(str(repo / "models" / "tiny-det.yaml"), runs_dir=tmp_path,
                     overrides={"teacher.weights": str(tmp_path / "nope.pth")})
    assert not list(tmp_path.glob("tiny-det/*/data"))
