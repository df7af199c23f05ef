import copy
import re

import pytest
import yaml

from device.errors import ConfigError, UnknownKeyError
from pipeline.core.recipe import available_recipes, load_recipe, parse_recipe


@pytest.fixture
def tiny_raw(repo):
    return yaml.safe_load((repo / "models" / "tiny.yaml").read_text())


def test_every_shipped_recipe_validates(repo):
    names = available_recipes(repo / "models")
    assert {"resnet50", "tiny"} <= set(names)
    for name in names:
        recipe, path, sha = load_recipe(str(repo / "models" / f"{name}.yaml"))
        assert recipe.name == name == path.stem, "a recipe's name must match its file name (run dirs use it)"
        assert len(sha) == 64


def test_resnet50_recipe_targets_a_quarter_of_the_macs(repo):
    recipe, _, _ = load_recipe(str(repo / "models" / "resnet50.yaml"))
    assert recipe.teacher.arch == "resnet50" and recipe.data.source == "fashion-mnist"
    upper = recipe.prune.macs_target * (1 + recipe.prune.tolerance)
    assert upper <= 0.25, "the student must stay ≤ 25% of the teacher's MACs even at the tolerance's edge"


def test_unknown_key_is_named_with_its_path_and_a_suggestion(tiny_raw):
    tiny_raw["prune"]["macs_targt"] = 0.3
    with pytest.raises(ConfigError) as err:
        parse_recipe(tiny_raw, "tiny.yaml")
    text = str(err.value)
    assert "prune.macs_targt: unknown key" in text
    assert "did you mean 'prune.macs_target'" in text


def test_nested_unknown_key(tiny_raw):
    tiny_raw["distill"]["train"]["augment"] = {"hflip": True, "vflip": True}
    with pytest.raises(ConfigError, match=r"distill\.train\.augment\.vflip: unknown key"):
        parse_recipe(tiny_raw)


def test_wrong_type_is_named(tiny_raw):
    tiny_raw["teacher"]["train"]["lr"] = "fast"
    with pytest.raises(ConfigError, match=r"teacher\.train\.lr: .*(number|float)"):
        parse_recipe(tiny_raw)


def test_out_of_range_value(tiny_raw):
    tiny_raw["prune"]["macs_target"] = 1.5
    with pytest.raises(ConfigError, match=r"prune\.macs_target"):
        parse_recipe(tiny_raw)


def test_unknown_architecture_suggests_near_names(tiny_raw):
    tiny_raw["teacher"]["arch"] = "resnet05"
    with pytest.raises(ConfigError, match=r"teacher\.arch: unknown architecture 'resnet05'; did you mean 'resnet50'"):
        parse_recipe(tiny_raw)


def test_unknown_data_source(tiny_raw):
    tiny_raw["data"]["source"] = "fashion_mnist"
    with pytest.raises(ConfigError, match=r"data\.source: unknown data source 'fashion_mnist'; did you mean 'fashion-mnist'"):
        parse_recipe(tiny_raw)


def test_preprocess_mean_must_match_channels(tiny_raw):
    tiny_raw["preprocess"]["mean"] = [0.5]
    with pytest.raises(ConfigError, match=r"preprocess: .*mean and std need 3 values"):
        parse_recipe(tiny_raw)


def test_logit_cache_refuses_random_crops(tiny_raw):
    tiny_raw["distill"]["train"]["augment"] = {"crop_padding": 2}
    with pytest.raises(ConfigError, match="cache_teacher_logits"):
        parse_recipe(tiny_raw)


def test_missing_section_is_reported(tiny_raw):
    del tiny_raw["teacher"]
    with pytest.raises(ConfigError, match=r"teacher: required; the ladder starts from a PyTorch teacher"):
        parse_recipe(tiny_raw)


def test_prune_null_distills_without_pruning_and_the_ladder_loses_its_pruned_rung(tiny_raw):
    """``prune: null`` (or a registry student) skips the prune stage: the rung lists left unwritten lose ``pruned``, a
    written one naming it is refused, and ``distill.student: pruned`` without a prune section names both ways out. A
    prune section left out is still missing, with the null that says "no pruning" in its hint."""
    from pipeline.tasks.classification.recipe import pruning_skipped

    recipe = parse_recipe(tiny_raw, overrides={"prune": None, "distill.student": "mobilenet_v3_small"})
    assert recipe.prune is None and "pruned" not in recipe.export.rungs and "pruned" not in recipe.deploy.rungs
    assert pruning_skipped(recipe) == "prune is null: the teacher is distilled into mobilenet_v3_small without pruning"
    registry = parse_recipe(tiny_raw, overrides={"distill.student": "mobilenet_v3_small"})
    assert registry.prune is not None and "pruned" not in registry.export.rungs
    assert "not the pruned teacher" in pruning_skipped(registry)
    assert pruning_skipped(parse_recipe(tiny_raw)) is None
    with pytest.raises(ConfigError, match=r"distill.student: pruned distills the prune stage's model, and prune is "
                                          r"null: name a student from the registry"):
        parse_recipe(tiny_raw, overrides={"prune": None})
    with pytest.raises(ConfigError, match=r"export.rungs names pruned, but prune is null"):
        parse_recipe(tiny_raw, overrides={"prune": None, "distill.student": "mobilenet_v3_small",
                                          "export.rungs": ["teacher", "pruned", "student"]})
    del tiny_raw["prune"]
    with pytest.raises(ConfigError, match=r"prune: required; .*write prune: null to distill the teacher into "
                                          r"distill.student without pruning"):
        parse_recipe(tiny_raw)


def test_overrides_use_dotted_keys(tiny_raw):
    before = copy.deepcopy(tiny_raw)
    recipe = parse_recipe(tiny_raw, overrides={"data.source": "fashion-mnist", "teacher.train.epochs": 1,
                                               "teacher.weights": None})
    assert recipe.data.source == "fashion-mnist" and recipe.teacher.train.epochs == 1
    assert tiny_raw == before, "overrides must not mutate the raw recipe"


def test_a_null_override_is_the_recipes_null():
    """``--set quantize.qat=null`` turns QAT off (it used to be dropped as if unset); an empty flag changes nothing."""
    from pipeline.cli import _parse_sets
    from pipeline.core.recipe import load_recipe

    shipped, _, _ = load_recipe("tiny-det")
    assert shipped.quantize.qat is not None and shipped.quantize.mixed_precision is not None
    recipe, _, _ = load_recipe("tiny-det", {**_parse_sets(["quantize.qat=null", "quantize.mixed_precision=null"]),
                                            "data.source": ""})
    assert recipe.quantize.qat is None and recipe.quantize.mixed_precision is None
    assert recipe.data.source == shipped.data.source


def test_unknown_model_lists_the_recipes(monkeypatch, repo):
    monkeypatch.setenv("EDGEFOLD_MODELS_DIR", str(repo / "models"))
    with pytest.raises(ConfigError) as err:
        load_recipe("resnet5")
    assert "no recipe for model 'resnet5'" in err.value.message
    assert "did you mean resnet50" in err.value.fix and "tiny" in err.value.fix


def test_not_a_mapping():
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        parse_recipe(["a", "list"])


def test_invalid_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_recipe(str(path))


def test_registry_errors_are_config_errors():
    assert issubclass(UnknownKeyError, ConfigError)


# One value past each bound the deploy section shares with the agent's JobSpec (the recipe's key, JobSpec's field).
PAST_THE_AGENTS_BOUNDS = [
    ("batch_sizes", "batch_sizes", [0, 8]), ("batch_sizes", "batch_sizes", [1, 8192]),
    ("batch_sizes", "batch_sizes", list(range(1, 10))), ("duration_s", "duration_s", 0),
    ("duration_s", "duration_s", 7200), ("duration_s", "duration_s", float("nan")),
    ("warmup_iterations", "warmup_iterations", 10**6), ("idle_s", "idle_s", 61), ("sample_hz", "sample_hz", 0),
    ("job_timeout_s", "timeout_s", 10**6), ("threads", "threads", 1000), ("min_iterations", "min_iterations", 1),
]


def test_deploy_values_the_agent_would_refuse_are_refused_before_any_stage(tiny_raw, tmp_path):
    """The deploy section takes its bounds from the agent's JobSpec (pydantic enforces both): whatever the agent
    refuses, the recipe refuses when it loads, naming the key, before any stage runs."""
    from pydantic import ValidationError

    from device.schema import JobSpec
    from pipeline.runner import run_pipeline

    for key, field, value in PAST_THE_AGENTS_BOUNDS:
        with pytest.raises(ValidationError):
            JobSpec.model_validate({"artifact": "a" * 64, field: value})
        with pytest.raises(ConfigError, match=re.escape(f"deploy.{key}")):
            parse_recipe(copy.deepcopy(tiny_raw), overrides={f"deploy.{key}": value})
    with pytest.raises(ConfigError, match=re.escape("deploy.duration_s")):
        run_pipeline("tiny", runs_dir=tmp_path, overrides={"deploy.duration_s": 0})
    assert not list(tmp_path.rglob("manifest.json")), "no stage ran"


def test_sweep_accelerators_become_the_agents_names_and_are_checked(tiny_raw):
    """deploy.sweep.accelerators: dla is DLA core 0; a core named twice, or an accelerator EdgeFold does not know,
    is refused when the recipe loads, naming the key."""
    from device.schema import SweepSpec
    from pipeline.deploy.jobs import job_spec

    recipe = parse_recipe(copy.deepcopy(tiny_raw), overrides={"deploy.sweep": {"accelerators": ["gpu", "dla"]}})
    assert recipe.deploy.sweep.job_accelerators() == ["gpu", "dla0"]
    spec = job_spec("student_int8", "a" * 64, {"tensorrt": "10.3.0"}, recipe.deploy,
                    {"input_size": 16, "resize": 16, "channels": 1, "mean": [0.5], "std": [0.25]}, "x",
                    sweep=recipe.deploy.sweep)
    assert isinstance(spec.sweep, SweepSpec) and spec.sweep.accelerators == ["gpu", "dla0"] and spec.dla_core is None
    for bad in (["dla", "dla0"], ["gpu", "npu"], []):
        with pytest.raises(ConfigError, match=re.escape("deploy.sweep.accelerators")):
            parse_recipe(copy.deepcopy(tiny_raw), overrides={"deploy.sweep": {"accelerators": bad}})


def test_a_gpu_servers_sweep_varies_nvml_and_a_jetsons_its_modes(tiny_raw):
    """deploy.sweep.power_limits_w / gpu_clocks_mhz: validated when the recipe loads (one knob, each value once,
    within the agent's bounds); a GPU server's job gets them, a Jetson's (it reports an L4T) the power modes."""
    from pipeline.deploy.jobs import sweep_spec

    recipe = parse_recipe(copy.deepcopy(tiny_raw), overrides={"deploy.sweep": {"modes": ["15W"],
                                                                              "power_limits_w": [150, 250]}})
    server = sweep_spec(recipe.deploy.sweep, {"gpu": "NVIDIA H100", "l4t": None})
    jetson = sweep_spec(recipe.deploy.sweep, {"gpu": "ga10b iGPU", "l4t": "36.4.3"})
    assert (server.power_limits_w, server.power_modes) == ([150, 250], None)
    assert (jetson.power_modes, jetson.power_limits_w) == (["15W"], None)
    for bad in ({"power_limits_w": [150], "gpu_clocks_mhz": [990]}, {"power_limits_w": [150, 150]},
                {"power_limits_w": [0]}, {"gpu_clocks_mhz": [99999]}, {"power_limit_w": [150]}):
        with pytest.raises(ConfigError, match=re.escape("deploy.sweep")):
            parse_recipe(copy.deepcopy(tiny_raw), overrides={"deploy.sweep": bad})


def test_a_timm_teacher_may_leave_preprocess_to_its_pretrained_cfg(tiny_raw):
    timm = pytest.importorskip("timm")
    del tiny_raw["preprocess"]
    tiny_raw["teacher"]["arch"] = "timm/resnet10t"
    recipe = parse_recipe(tiny_raw)
    cfg = timm.get_pretrained_cfg("resnet10t")
    assert recipe.preprocess.input_size == cfg.input_size[1] and recipe.preprocess.interpolation == cfg.interpolation
    assert recipe.preprocess.mean == list(cfg.mean) and recipe.preprocess.resize == int(176 / cfg.crop_pct)
    assert recipe._preprocess_from.startswith("timm/resnet10t's pretrained_cfg (timm ")
    tiny_raw["preprocess"] = {"input_size": 32, "mean": [0.5] * 3, "std": [0.5] * 3}  # written: the recipe's wins
    written = parse_recipe(tiny_raw)
    assert written.preprocess.input_size == 32 and written._preprocess_from is None


def test_preprocess_left_out_says_which_teachers_supply_it(tiny_raw):
    del tiny_raw["preprocess"]
    with pytest.raises(ConfigError, match=r"preprocess: required; only a teacher.arch that states how it was trained "
                                          r"\(timm/<name>"):
        parse_recipe(tiny_raw)


def test_an_unknown_timm_teacher_is_named_at_its_key_with_timms_near_names(tiny_raw):
    pytest.importorskip("timm")
    tiny_raw["teacher"]["arch"] = "timm/resnet10"
    with pytest.raises(ConfigError, match=r"teacher.arch: unknown architecture 'timm/resnet10'.*did you mean "
                                          r"'timm/resnet10t'"):
        parse_recipe(tiny_raw)


def test_keys_a_recipe_writes_win_over_the_pretrained_cfgs(tiny_raw):
    pytest.importorskip("timm")
    tiny_raw["teacher"]["arch"] = "timm/resnet10t"
    tiny_raw["preprocess"] = {"input_size": 64}
    recipe = parse_recipe(tiny_raw)
    assert recipe.preprocess.input_size == 64 and recipe.preprocess.resize is None  # not the 176 px crop's 201
    assert recipe.preprocess.mean == [0.485, 0.456, 0.406] and recipe.preprocess.interpolation == "bicubic"
    assert recipe._preprocess_from.endswith("with input_size from the recipe")
