"""The energy–latency front of a rung on a device: which power mode, batch and accelerator to ship.

A sweep measures a rung at every setting — power mode × jetson_clocks × batch size ×
accelerator — in every interleaved round. Each setting becomes one estimate per figure (the median over
its windows, with a 95% interval): p50 latency, energy per image, throughput and mean power. The front
is the set of settings no other setting beats on both latency and energy. A setting whose energy is degraded
(the telemetry fell short) is drawn but never on the front and never chosen; the choice is the setting
of least energy per image whose latency meets the budget, said in words against the fastest setting.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from pipeline import stats


def setting_label(setting: dict[str, Any]) -> str:
    """``15W, jetson_clocks on, batch 8, GPU`` (what a product team would write in a spec)."""
    clocks = setting.get("jetson_clocks")
    return ", ".join(part for part in (
        setting.get("mode") or "current mode",
        None if clocks is None else f"jetson_clocks {'on' if clocks else 'off'}",
        f"batch {setting['batch_size']}", (setting.get("accelerator") or "gpu").upper()) if part)


def settings_from_windows(windows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One setting per (mode, jetson_clocks, batch, accelerator) from its windows, each figure the median over
    the windows with its 95% interval; ``degraded`` when any window's energy was.

    Args:
        windows: One dict per measured window: ``mode``, ``mode_id``, ``jetson_clocks``, ``batch_size``,
            ``accelerator``, ``latency_p50_ms``, ``energy_mj_per_image``, ``throughput_images_per_s``,
            ``power_mean_w``, ``energy_degraded``.
    """
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for window in windows:
        key = (window.get("mode"), window.get("mode_id"), window.get("jetson_clocks"), window["batch_size"],
               window.get("accelerator") or "gpu")
        groups.setdefault(key, []).append(window)
    settings = []
    for (mode, mode_id, clocks, batch, accelerator), members in groups.items():
        setting: dict[str, Any] = {"mode": mode, "mode_id": mode_id, "jetson_clocks": clocks, "batch_size": batch,
                                 "accelerator": accelerator, "windows": len(members),
                                 "degraded": any(m.get("energy_degraded") for m in members)}
        for figure in ("latency_p50_ms", "energy_mj_per_image", "throughput_images_per_s", "power_mean_w"):
            estimate, low, high = stats.median_interval([m.get(figure) for m in members])
            finite = estimate == estimate
            setting.update({figure: estimate if finite else None, f"{figure}_low": low if finite else None,
                          f"{figure}_high": high if finite else None})
        setting["label"] = setting_label(setting)
        settings.append(setting)
    return settings


def energy_front(settings: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The settings no other beats on both p50 latency and energy per image, fastest first; degraded or
    unmeasured energy is never on it."""
    usable = [p for p in settings if p.get("energy_mj_per_image") is not None and p.get("latency_p50_ms") is not None
              and not p.get("degraded")]
    front = [p for p in usable if not any(
        q["latency_p50_ms"] <= p["latency_p50_ms"] and q["energy_mj_per_image"] <= p["energy_mj_per_image"]
        and (q["latency_p50_ms"] < p["latency_p50_ms"] or q["energy_mj_per_image"] < p["energy_mj_per_image"])
        for q in usable)]
    return sorted(front, key=lambda p: p["latency_p50_ms"])


def choose(settings: Sequence[dict[str, Any]], budget_ms: float | None) -> dict[str, Any]:
    """The most efficient front setting whose p50 latency meets ``budget_ms`` (all of the front without one),
    and how it compares with the fastest setting.

    Returns:
        ``chosen`` (a setting or None), ``fastest`` (the front's fastest setting), ``reason`` when none qualifies,
        and ``text``: "15W, batch 8, GPU: 2.10 mJ/image [2.00, 2.20], 3.40 ms p50 [3.30, 3.50]; MAXN, batch 8,
        GPU costs 38% more energy per image for 1.60× lower latency".
    """
    front = energy_front(settings)
    if not front:
        return {"chosen": None, "fastest": None, "reason": "no setting with undegraded energy was measured",
                "text": "no setting with undegraded energy was measured: nothing to choose"}
    within = [p for p in front if budget_ms is None or p["latency_p50_ms"] <= budget_ms]
    fastest = front[0]
    if not within:
        return {"chosen": None, "fastest": fastest,
                "reason": f"no setting meets the {budget_ms:g} ms budget",
                "text": f"no setting meets the {budget_ms:g} ms budget; the fastest is {fastest['label']} at "
                        f"{fastest['latency_p50_ms']:.2f} ms p50"}
    chosen = min(within, key=lambda p: (p["energy_mj_per_image"], p["latency_p50_ms"]))
    text = (f"{chosen['label']}: {_with_interval(chosen, 'energy_mj_per_image', '.2f', 'mJ/image')}, "
            f"{_with_interval(chosen, 'latency_p50_ms', '.2f', 'ms p50')}")
    if fastest is not chosen:
        more = fastest["energy_mj_per_image"] / chosen["energy_mj_per_image"] - 1
        faster = chosen["latency_p50_ms"] / fastest["latency_p50_ms"]
        text += (f"; {fastest['label']} costs {100 * more:.0f}% more energy per image for {faster:.2f}× lower "
                 "latency")
    return {"chosen": chosen, "fastest": fastest, "reason": None, "text": text}


def _with_interval(setting: dict[str, Any], figure: str, spec: str, unit: str) -> str:
    """``2.10 mJ/image [2.00, 2.20]``."""
    low, high = setting.get(f"{figure}_low"), setting.get(f"{figure}_high")
    value = f"{setting[figure]:{spec}} {unit}"
    return value if low is None or high is None or low == high else f"{value} [{low:{spec}}, {high:{spec}}]"
