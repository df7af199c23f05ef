"""The energy–latency front: settings from windows with intervals, the front, the choice under a budget."""

import pytest

from pipeline.tasks.classification.front import choose, energy_front, settings_from_windows


def _windows(mode, batch, latency, energy, degraded=False, rounds=3, clocks=False):
    return [{"mode": mode, "mode_id": {"MAXN_SUPER": 2, "15W": 0, "7W": 1}[mode], "jetson_clocks": clocks,
             "batch_size": batch, "accelerator": "gpu", "latency_p50_ms": latency * (1 + 0.01 * r),
             "energy_mj_per_image": energy * (1 + 0.01 * r), "throughput_images_per_s": batch / latency * 1e3,
             "power_mean_w": energy * batch / latency, "energy_degraded": degraded} for r in range(rounds)]


# A planted sweep: MAXN fastest and hungriest, 15W batch 8 the most efficient, 7W slow and no better,
# one setting cheaper than all but with degraded energy (it must never be chosen).
PLANTED = (_windows("MAXN_SUPER", 8, 1.0, 3.0) + _windows("15W", 8, 1.6, 2.1) + _windows("7W", 8, 3.0, 2.2)
           + _windows("15W", 1, 0.4, 4.0) + _windows("7W", 1, 0.9, 1.0, degraded=True))


def test_points_carry_the_median_and_interval_of_their_windows():
    settings = {(p["mode"], p["batch_size"]): p for p in settings_from_windows(PLANTED)}
    assert len(settings) == 5
    maxn = settings[("MAXN_SUPER", 8)]
    assert maxn["windows"] == 3 and maxn["latency_p50_ms"] == pytest.approx(1.01)
    assert maxn["latency_p50_ms_low"] <= maxn["latency_p50_ms"] <= maxn["latency_p50_ms_high"]
    assert settings[("7W", 1)]["degraded"] and not maxn["degraded"]
    assert maxn["label"] == "MAXN_SUPER, jetson_clocks off, batch 8, GPU"


def test_the_planted_front_is_recovered_and_degraded_energy_never_on_it():
    front = [(p["mode"], p["batch_size"]) for p in energy_front(settings_from_windows(PLANTED))]
    assert front == [("15W", 1), ("MAXN_SUPER", 8), ("15W", 8)], "7W batch 8 is dominated; 7W batch 1 degraded"


def test_the_choice_is_the_least_energy_within_the_budget_said_against_the_fastest():
    settings = settings_from_windows(PLANTED)
    choice = choose(settings, budget_ms=2.0)
    assert choice["chosen"]["mode"] == "15W" and choice["chosen"]["batch_size"] == 8
    assert choice["text"].startswith("15W, jetson_clocks off, batch 8, GPU: 2.12 mJ/image [")
    assert "15W, jetson_clocks off, batch 1, GPU costs 90% more energy per image for 4.00× lower latency" in choice["text"]
    tight = choose(settings, budget_ms=0.9)
    assert tight["chosen"]["batch_size"] == 1 and tight["chosen"]["mode"] == "15W"
    none = choose(settings, budget_ms=0.1)
    assert none["chosen"] is None and "no setting meets the 0.1 ms budget" in none["text"]
    assert choose([p for p in settings if p["degraded"]], None)["chosen"] is None
