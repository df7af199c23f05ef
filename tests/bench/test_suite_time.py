"""The suite-time bench reads pytest's own output: the wall time, the counts, each file's summed phases."""

import importlib.util
import json

import pytest

from tests.conftest import REPO

SAMPLE = """\
.venv/bin/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder -q --durations=0
........................................................................ [ 50%]
.......s                                                                 [100%]
============================= slowest durations ==============================
30.50s call     tests/pipeline/test_a.py::test_one
12.25s setup    tests/pipeline/test_a.py::test_two
4.00s call     tests/device/test_b.py::test_three[x-1]
0.01s teardown tests/device/test_b.py::test_three[x-1]
=========================== short test summary info ============================
SKIPPED [1] tests/device/test_b.py:9: needs a GPU
============ 79 passed, 1 skipped, 3 warnings in 61.25s (0:01:01) ============
"""


def _bench():
    spec = importlib.util.spec_from_file_location("suite_time_bench", REPO / "bench" / "suite_time.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_run_is_read_from_pytests_output_and_summarized():
    bench = _bench()
    run = bench.parse_log(SAMPLE)
    assert run["seconds"] == 61.25 and run["counts"] == {"passed": 79, "skipped": 1} and run["workers"] == 3
    assert run["files"] == {"tests/pipeline/test_a.py": 42.75, "tests/device/test_b.py": 4.01}
    assert run["slowest"][0] == {"seconds": 30.5, "phase": "call", "test": "tests/pipeline/test_a.py::test_one"}
    faster = {**run, "seconds": 50.0}
    record = bench.summarize([run, faster, {**run, "seconds": 700.0}], "test", {"cpu": "x", "cores": 2,
                             "kernels": "AVX2"}, "abc123")
    assert record["median_s"] == 61.25 and record["max_s"] == 700.0 and not record["goal_met"]
    assert record["files"] == run["files"], "the median run's profile"
    text = bench.markdown(record)
    assert "**Median 1.0 min**" in text and "goal NOT met" in text and "| tests/pipeline/test_a.py | 43 |" in text
    assert "| 1 | 61 | 3 | 79 passed, 1 skipped |" in text, "each run names its workers"
    assert bench.parse_log(SAMPLE.split("\n", 1)[1])["workers"] is None, "a log without make's echo does not say"


def test_the_quiet_summary_line_is_read_too():
    """Under -q pytest ends with the counts alone, without the rules around them."""
    quiet = SAMPLE.replace("============ 79 passed, 1 skipped, 3 warnings in 61.25s (0:01:01) ============",
                           "2 failed, 1175 passed, 8 skipped, 32 warnings in 1176.96s (0:19:36)")
    run = _bench().parse_log(quiet)
    assert run["seconds"] == 1176.96 and run["counts"] == {"failed": 2, "passed": 1175, "skipped": 8}


def test_an_unfinished_run_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="did not finish"):
        _bench().parse_log("....F\nKeyboardInterrupt\n")


def test_the_files_run_longest_first_by_the_newest_record(tmp_path):
    from tests.conftest import SUITE_RECORDS, longest_first, recorded_file_seconds

    seconds = {"tests/a.py": 30.0, "tests/b.py": 5.0, "tests/c.py": 10.0}
    # A file the record does not know counts as its median one (10 s): after a, tied with c and ordered by name.
    assert longest_first(["tests/b.py", "tests/new.py", "tests/a.py", "tests/c.py", "tests/a.py"], seconds) == \
        ["tests/a.py", "tests/c.py", "tests/new.py", "tests/b.py"]
    assert longest_first(["tests/b.py", "tests/a.py"], {}) == ["tests/a.py", "tests/b.py"]
    for name, files in (("suite-time-test-20260101-000000.json", {"tests/old.py": 1.0}),
                        ("suite-time-test-20260102-000000.json", {"tests/new.py": 2.0}),
                        ("suite-time-test-fast-20260103-000000.json", {"tests/fast.py": 3.0})):
        (tmp_path / name).write_text(json.dumps({"files": files}))
    assert recorded_file_seconds(tmp_path) == {"tests/new.py": 2.0}, "the newest make test record, never -fast"
    assert recorded_file_seconds(tmp_path / "none") == {}
    recorded = recorded_file_seconds(SUITE_RECORDS)
    assert recorded and all(path.startswith("tests/") and path.endswith(".py") for path in recorded)


def test_each_slow_test_says_what_it_guards_in_its_own_words(tmp_path):
    bench = _bench()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(
        'def test_with_words():\n    """A killed run resumes. Then more.\n\n    Details."""\n\n\n'
        'def test_a_killed_run_resumes_from_its_last_epoch():\n    pass\n')
    assert bench.guards("tests/test_a.py::test_with_words[x-1]", tmp_path) == "A killed run resumes."
    assert bench.guards("tests/test_a.py::test_a_killed_run_resumes_from_its_last_epoch", tmp_path) == \
        "a killed run resumes from its last epoch"
    assert bench.guards("tests/gone.py::test_old_name", tmp_path) == "old name", "a file since moved: its name"
    record = bench.summarize([bench.parse_log(SAMPLE)], "test", {"cpu": "x", "cores": 2, "kernels": "AVX2"}, "abc")
    assert "| 30.5 | call | tests/pipeline/test_a.py::test_one | one |" in bench.markdown(record)
