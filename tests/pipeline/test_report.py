"""deploy and report: real loopback agents, the tiny recipe's real models, the report's files."""

import csv
import json
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from pipeline.report.profile_report import NOT_MEASURED
from pipeline.tasks.classification.report import build_report
from pipeline.tasks.classification.report_data import COLUMNS, pareto_front
from pipeline.runner import run_pipeline
from tests.browser import render_probe
from tests.device.agent_process import AgentProcess


def test_pareto_front_on_a_hand_made_set():
    candidates = [("a", 1.0, 0.90), ("b", 2.0, 0.95), ("c", 3.0, 0.94),  # c: slower and worse than b
              ("d", 0.5, 0.80), ("e", 2.0, 0.93), ("f", 4.0, 0.99), ("g", 1.0, 0.90)]  # g ties a
    assert pareto_front(candidates) == {"a", "b", "d", "f", "g"}
    assert pareto_front([]) == set()


def test_report_from_the_tiny_run(tiny_run):
    stages = tiny_run.manifest.data["stages"]
    assert stages["deploy"]["metrics"]["jobs_succeeded"] == 5
    report = stages["report"]["outputs"]
    html = (tiny_run.run_dir / report["html"]).read_text()
    # accuracy/latency and per-class accuracy drawn; no device reported power: energy and power are a line each
    assert html.count('src="data:image/png;base64,') == 2 and "<script" not in html
    assert "Energy per inference: not measured" in html and "Power over each job&#x27;s window: not measured" in html
    data = json.loads((tiny_run.run_dir / report["json"]).read_text())
    assert data["schema"] == "edgefold.results/4" and data["task"] == "classification" and data["model"] == "tiny"
    assert set(data) >= {"rungs", "rows", "headline", "power_traces", "provenance", "generated"}
    assert [r["rung"] for r in data["rows"]] == ["teacher", "pruned", "student", "student_fp16", "student_int8"]
    for row in data["rows"]:
        assert row["status"] == "measured" and row["device"] == "loopback"
        assert 0 < row["latency_p50_ms"] <= row["latency_p99_ms"] and row["throughput_images_per_s"] > 0
        assert row["power_mean_w"] is None and "no power telemetry" in row["reason"], "never estimated"
    teacher = data["rows"][0]
    assert teacher["latency_ratio_vs_dc_teacher"] == pytest.approx(1.0)
    headline = data["headline"]
    assert headline["status"] == "measured" and "no data-center device" in headline["note"]
    # The headline leads with the INT8 student where the device's profile shows INT8 compute; ONNX Runtime's CPU
    # provider fuses the Q/DQ graph into INT8 kernels on some CPUs and not on others (this one's AVX-512 host did not),
    # and then the headline leads with the student form the device really ran, and says why.
    lead = headline["lead_rung"]
    assert lead == "student_int8" or (lead in ("student", "student_fp16")
                                      and "no compute layer ran in INT8" in headline["int8_not_measured"]["reason"])
    assert headline["accuracy_lost_points"] == pytest.approx(100 * (data["rungs"]["teacher"]["top1"]
                                                                    - data["rungs"][lead]["top1"]))
    with open(tiny_run.run_dir / report["csv"]) as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(COLUMNS) and len(rows) == 5
    markdown = (tiny_run.run_dir / report["md"]).read_text()
    assert "## Headline" in markdown and "| student_int8 | loopback |" in markdown and "## Provenance" in markdown
    provenance = data["provenance"]["devices"][0]
    assert provenance["onnxruntime"] and provenance["status"] == "ok"


@pytest.fixture
def run_copy(tiny_run, tmp_path):
    target = tmp_path / "runs" / "tiny" / "shared"
    shutil.copytree(tiny_run.run_dir, target)
    shutil.rmtree(target / "deploy-cache")
    return target


@pytest.mark.slow
def test_two_agents_one_killed_mid_run_and_one_never_there(run_copy, tmp_path, capsys):
    from pipeline.deploy.devices import load_devices

    with AgentProcess(tmp_path / "a") as good, AgentProcess(tmp_path / "b") as doomed:
        devices = load_devices(edge=f"{good.url},{doomed.url},http://127.0.0.1:9", token_file=str(good.token_file))

        def kill_when_busy():
            with doomed.client() as client:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    if any(j["state"] == "running" for j in client.jobs()):
                        doomed.kill(signal.SIGKILL)
                        return
                    time.sleep(0.05)

        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        two_rungs = {"deploy.rungs": ["teacher", "student_int8"]}  # the float and INT8 ends of the ladder
        ctx = run_pipeline("tiny", runs_dir=run_copy.parent.parent, run_id="shared", devices=devices,
                           overrides=two_rungs)
        killer.join()
        deploy = ctx.manifest.stage("deploy")["metrics"]
        assert deploy["devices"] == {"edge-1": "ok", "edge-2": "lost", "edge-3": "unreachable"}
        data = json.loads((ctx.run_dir / "report" / "results.json").read_text())
        by_device = {}
        for row in data["rows"]:
            by_device.setdefault(row["device"], []).append(row)
        measured = sorted(r["rung"] for r in by_device["edge-1"] if r["status"] == "measured")
        assert measured == ["student_int8", "teacher"]
        assert all(r["status"] == NOT_MEASURED and "unreachable" in r["reason"] for r in by_device["edge-3"])
        assert any(r["status"] == NOT_MEASURED for r in by_device["edge-2"])
        html = (ctx.run_dir / "report" / "report.html").read_text()
        assert "edge-3" in html and "unreachable" in html

        # A re-run against the surviving agent reuses every result: no new job reaches it.
        with good.client() as client:
            jobs_before = len(client.jobs())
        again = run_pipeline("tiny", runs_dir=run_copy.parent.parent, run_id="shared",
                             devices=load_devices(edge=good.url, token_file=str(good.token_file)), overrides=two_rungs)
        metrics = again.manifest.stage("deploy")["metrics"]
        assert metrics["jobs_reused"] == 2 * 2 and metrics["devices"] == {"edge": "ok"}, "2 rungs × 2 rounds"
        with good.client() as client:
            assert len(client.jobs()) == jobs_before


@pytest.mark.slow
def test_report_command_rebuilds_and_chromium_renders_the_figures(tiny_run, tmp_path, repo):
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    result = subprocess.run([sys.executable, "-m", "pipeline.cli", "report", str(run)], cwd=repo, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "html: " in result.stdout and (run / "report" / "report.html").is_file()
    # Every figure loaded, and at a laptop's 1366 px the ladder's ratio columns and its status column are in view,
    # the headline is the page's first table, every headline row fits and nothing scrolls sideways.
    check = ("const imgs=[...document.images];"
             "const heads=[...document.querySelectorAll('table.ladder th')];"
             "const inView=h=>h.getBoundingClientRect().right<=window.innerWidth;"
             "const lead=document.querySelector('table');"
             "document.title=[window.innerWidth,imgs.length,imgs.filter(i=>i.complete&&i.naturalWidth>300).length,"
             "heads.filter(h=>h.classList.contains('ratio')).map(inView).join('+'),inView(heads[heads.length-1]),"
             "lead.className,[...lead.querySelectorAll('td')].every(inView),"
             "document.documentElement.scrollWidth<=window.innerWidth].join(':')")
    assert render_probe(run / "report" / "report.html", check, 1366) == "1366:2:2:true+true:true:headline:true:true"


def test_report_without_deploy_says_not_measured(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    manifest = json.loads((run / "manifest.json").read_text())
    del manifest["stages"]["deploy"], manifest["stages"]["report"]
    (run / "manifest.json").write_text(json.dumps(manifest))
    paths = build_report(run, tmp_path / "out")
    data = json.loads(paths["json"].read_text())
    assert data["rows"] == [] and data["headline"]["status"] == NOT_MEASURED
    # Only the per-class plot has something to draw; the others are one line of text each.
    assert NOT_MEASURED in paths["md"].read_text() and paths["html"].read_text().count("data:image/png") == 1
    assert "Accuracy against latency: not measured" in paths["html"].read_text()


@pytest.mark.slow
def test_fleet_groups_bounded_parallelism_and_a_dead_device(run_copy, tmp_path):
    from pipeline.deploy.devices import load_devices

    agents = [AgentProcess(tmp_path / name).start() for name in ("n1", "n2", "g1")]
    try:
        devices_file = tmp_path / "devices.yaml"
        devices_file.write_text(
            f"token_file: {agents[0].token_file}\ngroups:\n"
            f"  orin-nano: {{role: edge, urls: [{agents[0].url}, {agents[1].url}, http://127.0.0.1:9]}}\n"
            f"  dc: {{role: dc, urls: [{agents[2].url}]}}\n")
        ctx = run_pipeline("tiny", runs_dir=run_copy.parent.parent, run_id="shared",
                           devices=load_devices(devices_file=devices_file),
                           overrides={"deploy.parallel_devices": 2, "deploy.rungs": ["teacher", "student_int8"]})
        spans = []
        for agent in agents:
            with agent.client() as client:
                spans += [(j["started_at"], j["finished_at"]) for j in client.jobs() if j["state"] == "succeeded"]
    finally:
        for agent in agents:
            agent.stop()
    assert len(spans) == 24, "2 rungs, each with its nvinfer form (deploy.nvinfer), × 2 rounds on 3 live devices"
    overlap = max(sum(1 for s, f in spans if s <= t < f) for t, _ in spans)
    assert overlap <= 2, f"{overlap} devices ran at once with parallel_devices=2"
    data = json.loads((ctx.run_dir / "report" / "results.json").read_text())
    nano = {g["rung"]: g for g in data["groups"] if g["group"] == "orin-nano"}
    assert nano["teacher"]["devices"] == 3 and nano["teacher"]["measured"] == 2
    measured = [r["latency_p50_ms"] for r in data["rows"] if r["group"] == "orin-nano" and r["rung"] == "teacher"
                and r["status"] == "measured"]
    assert nano["teacher"]["latency_p50_ms_median"] == pytest.approx(sum(measured) / 2)
    assert nano["teacher"]["latency_p50_ms_min"] == min(measured)
    headline = data["headline"]
    assert headline["dc_device"] == "dc" and headline["edge_device"] == "orin-nano-1" and headline["note"] is None
    markdown = (ctx.run_dir / "report" / "report.md").read_text()
    assert "## Fleet" in markdown and "| orin-nano | teacher | 2/3 |" in markdown


@pytest.mark.slow
def test_results_of_another_version_are_refused_with_the_fix(tiny_run, tmp_path):
    from device.errors import SchemaVersionError
    from pipeline.tasks.classification.report import build_report

    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run, symlinks=True)
    path = run / "deploy" / "results.json"
    data = json.loads(path.read_text())
    data["schema"] = "edgefold.deploy/1"
    path.write_text(json.dumps(data))
    with pytest.raises(SchemaVersionError, match="edgefold.deploy/1.*this EdgeFold reads 'edgefold.deploy/2'") as err:
        build_report(run)
    assert "--force deploy" in err.value.fix
    data["schema"] = "edgefold.deploy/2"
    data["devices"][0]["rungs"]["teacher"]["result"]["schema"] = "edgefold.result/1"
    path.write_text(json.dumps(data))
    with pytest.raises(SchemaVersionError, match="edgefold.result/1"):
        build_report(run)


def test_report_reads_typed_results_only(repo):
    """No result key is sliced by name in the report: it reads device.schema's models."""
    text = (repo / "pipeline" / "tasks" / "classification" / "report.py").read_text()
    for sliced in ('startswith("peak_temp_', '["runs"]', '["summary"]', 'rung == "student_int8"', "split(\"## Provenance"):
        assert sliced not in text, sliced


# ---------------------------------------------------------------- a rebuild replaces the report whole
def _run_with_a_recorded_report(tmp_path):
    """A run whose report stage recorded its four files (an older version's, by their bytes) in the manifest."""
    from device.files import sha256_file
    from pipeline.core.manifest import Manifest

    run = tmp_path / "runs" / "tiny" / "r"
    manifest = Manifest.open(run, "tiny")
    manifest.data["stages"]["evaluate"] = {"metrics": {"rungs": {}}, "outputs": {}, "sha256": {}}
    (run / "report").mkdir(parents=True)
    outputs = {}
    for kind, name in (("md", "report.md"), ("html", "report.html"), ("json", "results.json"),
                       ("csv", "results.csv")):
        (run / "report" / name).write_text(f"the previous report's {kind}\n")
        outputs[kind] = f"report/{name}"
    manifest.record("report", {"outputs": outputs, "sha256": {rel: sha256_file(run / rel) for rel in outputs.values()},
                               "metrics": {"headline": {"status": "old"}}})
    return run


def test_a_report_rebuild_that_fails_changes_nothing_and_one_that_succeeds_keeps_the_manifest_true(tmp_path,
                                                                                                   monkeypatch):
    from pipeline import cli
    from pipeline.tasks.classification import report
    from device.files import sha256_file
    from pipeline.core.manifest import Manifest

    run = _run_with_a_recorded_report(tmp_path)
    before = {path.name: path.read_bytes() for path in (run / "report").iterdir()}

    def plots_fail(data):
        raise RuntimeError("matplotlib could not render")  # after results.json/.csv and report.md were rendered

    monkeypatch.setattr(report, "plots", plots_fail)
    with pytest.raises(RuntimeError, match="matplotlib"):
        cli.main(["report", str(run)])
    assert {path.name: path.read_bytes() for path in (run / "report").iterdir()} == before, \
        "a failed rebuild left new files beside the old ones"
    assert sorted(path.name for path in run.iterdir()) == ["manifest.json", "report"], "no staging folder left"

    monkeypatch.undo()
    assert cli.main(["report", str(run)]) == 0
    entry = Manifest.load(run).stage("report")
    assert set(entry["sha256"]) == set(entry["outputs"].values())
    for rel, digest in entry["sha256"].items():
        assert sha256_file(run / rel) == digest, f"{rel} is not as the manifest records it"
    assert Manifest.load(run).outputs_intact("report")
    assert entry["metrics"]["headline"] == json.loads((run / "report" / "results.json").read_text())["headline"]
    assert sorted(path.name for path in run.iterdir()) == ["manifest.json", "report"]


def test_a_value_json_cannot_hold_fails_the_report_instead_of_becoming_text(tmp_path, monkeypatch):
    from pipeline.tasks.classification import report

    run = _run_with_a_recorded_report(tmp_path)
    collect = report.collect
    monkeypatch.setattr(report, "collect", lambda manifest, run_dir: {**collect(manifest, run_dir), "slip": object()})
    with pytest.raises(TypeError, match="not JSON serializable"):  # default=str wrote "<object object at 0x…>"
        build_report(run, tmp_path / "out")


@pytest.mark.slow
def test_make_edge_fails_when_no_edge_device_measured(run_copy, capsys):
    """EDGE=<a dead URL> writes the report ("not measured") and then exits non-zero,
    naming the URL and the fix, so a script or CI job does not read the run as a success."""
    from pipeline.cli import main

    dead = "http://127.0.0.1:9"
    code = main(["run", "tiny", "--runs-dir", str(run_copy.parent.parent), "--run-id", "shared", "--edge", dead])
    captured = capsys.readouterr()
    assert code == 3
    assert f"no edge device measured any rung: {dead} (unreachable" in captured.err
    assert "make agent" in captured.err and "report:" in captured.out  # the report came first
    data = json.loads((run_copy / "report" / "results.json").read_text())
    assert all(r["status"] == NOT_MEASURED for r in data["rows"])


def test_auto_runtime_fallback_is_said_in_the_headline_and_the_ladder(tiny_run):
    """No TensorRT on this machine, so `auto` ran ONNX Runtime; the report says so in words."""
    stages = tiny_run.manifest.data["stages"]
    data = json.loads((tiny_run.run_dir / stages["report"]["outputs"]["json"]).read_text())
    why = data["headline"]["runtime_fallbacks"]["loopback"]
    assert why.startswith("ONNX Runtime ran instead of TensorRT: no module named 'tensorrt'")
    assert all(row["runtime_fallback"] == why for row in data["rows"])
    markdown = (tiny_run.run_dir / stages["report"]["outputs"]["md"]).read_text()
    assert f"| runtime | on loopback: {why} |" in markdown and "onnxruntime fp32 (fallback) [1]" in markdown


@pytest.mark.parametrize("recipe", ["tiny", "tiny-det"])
def test_tensorrt_runtime_without_tensorrt_fails_before_any_stage(tmp_path, recipe):
    """`--set deploy.runtime=tensorrt` against an agent without TensorRT (here: the loopback agent) is refused
    before the data stage, with the agent's reason and the fix, in every task (one preflight, shared)."""
    from device.errors import ConfigError

    with pytest.raises(ConfigError, match="deploy.runtime is tensorrt but TensorRT is not available on the "
                                          "loopback agent") as err:
        run_pipeline(recipe, runs_dir=tmp_path, run_id="r", overrides={"deploy.runtime": "tensorrt"})
    assert "--system-site-packages" in err.value.fix and "deploy.runtime=auto" in err.value.fix
    assert not (tmp_path / recipe / "r" / "data").exists()


def test_every_rung_is_scored_by_the_engine_that_was_timed(tiny_run):
    """On the loopback agent (ONNX Runtime on this machine, the host's own program) each rung's device
    predictions on the evaluation set equal the host's; the FP16 student is a rung of its own, its host figure
    labelled an emulation; the INT8-vs-FP16 verdict is in the headline with its evidence."""
    stages = tiny_run.manifest.data["stages"]
    data = json.loads((tiny_run.run_dir / stages["report"]["outputs"]["json"]).read_text())
    assert data["evaluation"]["images"] == 355 and not data["evaluation"]["stratified"]  # tiny: all test images
    for row in data["rows"]:
        assert row["device_images"] == 355 and row["agreement"] == 1.0 and not row["device_deviates"], row["rung"]
        assert row["device_top1_correct"] == row["host_top1_correct_same_images"]
    fp16 = next(r for r in data["rows"] if r["rung"] == "student_fp16")
    assert fp16["precision"] == "fp16" and fp16["runtime"] == "onnxruntime"
    markdown = (tiny_run.run_dir / stages["report"]["outputs"]["md"]).read_text()
    assert "| student_fp16 | loopback | " in markdown and "emulated" in markdown
    assert "## Accuracy on the device" in markdown and "same within noise" in markdown
    verdict = data["headline"]["int8_vs_fp16"][0]
    assert verdict["device"] == "loopback" and verdict["top1_source"] == "device-measured"
    assert verdict["latency_low"] <= verdict["latency_ratio"] <= verdict["latency_high"]
    assert "INT8 vs FP16 on loopback: ×" in markdown and "(device-measured, McNemar p = " in markdown
    # Whichever way this host's timing fell: the verdict follows the recorded ratio, and says why only when it fails.
    assert verdict["pays_off"] == (verdict["latency_significant"] and verdict["latency_ratio"] < 1)
    assert bool(verdict.get("reasons")) == ("INT8 does not pay off here: " in markdown) == (not verdict["pays_off"])
    # The pass is outside the timed windows and short against them.
    assert 0 < data["evaluation"]["seconds_total"]


def _profile(*layers):
    """A planted per-layer profile of one batch: (precision, overhead kind or None, share) per layer."""
    table = [{"name": f"l{i}", "kind": "Conv", "precision": precision, "ms": share, "share": share,
              "overhead": overhead} for i, (precision, overhead, share) in enumerate(layers)]
    return {"batches": [{"batch_size": 1, "iterations": 1, "total_ms": 1.0, "layers": table,
                         "share_by_precision": {}, "int8_share": 0.0, "overhead_share": 0.0}]}


def test_the_headline_leads_with_a_rung_the_device_really_ran():
    """INT8 leads only where a compute layer ran in INT8; else the fastest student form that computed in its own
    precision (an FP16 graph that a CPU ran in FP32 is passed over), with why and how to measure INT8."""
    from pipeline.tasks.classification.report_data import DEPLOYED, _lead_rung

    rows = [{"device": "orin", "rung": rung, "status": "measured", "latency_p50_ms": ms, "verdict": ""}
            for rung, ms in (("student", 2.0), ("student_fp16", 1.0), ("student_int8", 3.0))]
    unfused = {"device": "orin", "rung": DEPLOYED, "status": "measured", "runtime": "onnxruntime",
               "profile": _profile(("int8", "qdq", 0.6), ("fp32", None, 0.4))}
    fp16_as_fp32 = {"device": "orin", "rung": "student_fp16", "status": "measured",
                    "profile": _profile(("fp16", "cast", 0.2), ("fp32", None, 0.8))}
    lead, missing = _lead_rung(rows, {"name": "orin"}, [unfused, fp16_as_fp32])
    assert lead == "student" and missing["device"] == "orin" and "onnxruntime" in missing["reason"]
    assert "EDGE=" in missing["fix"] and "DC=" in missing["fix"]
    fp16_ran = {**fp16_as_fp32, "profile": _profile(("fp16", None, 1.0))}
    assert _lead_rung(rows, {"name": "orin"}, [unfused, fp16_ran])[0] == "student_fp16"
    fused = {**unfused, "profile": _profile(("int8", None, 0.9), ("fp16", "reformat", 0.1))}
    assert _lead_rung(rows, {"name": "orin"}, [fused, fp16_ran]) == (DEPLOYED, None)
    assert _lead_rung(rows, {"name": "orin"}, []) == (DEPLOYED, None)  # no profile: nothing to say otherwise


def test_the_int8_verdict_counts_the_layers_kept_in_fp16():
    from pipeline.tasks.classification.headline import int8_vs_fp16_text

    verdict = {"device": "orin", "latency_ratio": 0.61, "latency_low": 0.58, "latency_high": 0.64,
               "latency_significant": True, "pays_off": True}
    assert int8_vs_fp16_text(verdict).startswith("INT8 vs FP16 on orin: ×0.61 latency [0.58, 0.64]")
    assert int8_vs_fp16_text({**verdict, "int8_kept_layers": 3}).startswith("INT8 (3 layers kept in FP16) vs FP16")
    assert int8_vs_fp16_text({**verdict, "int8_kept_layers": 1}).startswith("INT8 (1 layer kept in FP16) vs FP16")
    assert int8_vs_fp16_text({**verdict, "int8_kept_layers": 2, "int8_kept_precision": "fp32"}).startswith(
        "INT8 (2 layers kept in FP32) vs FP16")


def test_the_kept_layers_are_priced_from_the_int8_rungs_per_layer_profile():
    """A kept layer alone (or fused with other kept layers) is priced by its profiled time; a fusion with an INT8 layer
    cannot be split and is counted apart; a profile that names none of them says so."""
    from pipeline.quantize.report import kept_time_text

    layers = [{"name": "conv3 + relu3", "time_ms": 0.25}, {"name": "conv7", "time_ms": 0.5},
              {"name": "conv9 + add9", "time_ms": 1.0}, {"name": "conv1", "time_ms": 0.25}]
    entry = {"device": "orin", "runtime": "tensorrt",
             "profile": {"batches": [{"batch_size": 8, "total_ms": 9.0, "layers": layers},
                                     {"batch_size": 1, "total_ms": 2.0, "layers": layers}]}}
    text = kept_time_text(["conv3", "relu3", "conv7", "conv9"], entry)
    assert text == ("orin (tensorrt, batch 1): 0.750 ms of 2.000 ms per inference (37.5%) in 3 of the 4 kept layers; "
                    "1 fusion(s) of kept and INT8 layers not priced")
    assert "none of the kept layers is named" in kept_time_text(["conv5"], entry)
    assert kept_time_text([], entry) is None and kept_time_text(["conv3"], {"device": "x", "profile": None}) is None


def test_a_ladder_distilled_without_pruning_says_why_it_has_no_pruned_rung():
    """The report names an absent pruned rung with its reason (beside the ladder); a ladder that pruned, or whose
    student is the pruned teacher, names nothing absent."""
    from pipeline.tasks.classification.report_data import _absent_rungs

    rungs = {"teacher": {}, "student": {}, "student_int8": {}}
    distilled = {"distill": {"config": {"distill": {"student": "mobilenet_v3_small"}}}, "export": {"config": {}}}
    absent = _absent_rungs(distilled, rungs)
    assert list(absent) == ["pruned"] and "distilled into mobilenet_v3_small without pruning" in absent["pruned"]
    assert _absent_rungs({**distilled, "prune": {}}, {**rungs, "pruned": {}}) == {}
    assert _absent_rungs({"distill": {"config": {"distill": {"student": "pruned"}}}}, rungs) == {}
