"""Which rung to ship: named, or ``best`` by a stated rule.

``best`` is the fastest rung on the device (its median latency at the batch it was measured at) whose accuracy drop
against the teacher, both as that device scored them (a rung scored only on the host is not compared with a teacher
scored on the device, and is named), stays within ``max_drop`` points, where its latency interval clears the others';
where it does not (no measurable difference: an FP16 form 2 µs from its FP32 one), the one of those closest to the
teacher. A rung the report judged unfit (collapsed, at chance) is never ``best``, and ships by name only with
``force``. The default, 1 point, is the
loss INT8 deployment is usually held to: MLPerf Inference's closed division requires 99% of the FP32 reference's
accuracy, 0.76 top-1 points for ResNet-50 (76.46%) and 0.37 mAP points for RetinaNet (37.55), so 1 point is at that
scale. It is not ``quantize.accuracy_budget_points``, which measures INT8 against the FP32 student, not the teacher.
"""

from __future__ import annotations

from device.errors import ConfigError
from pipeline.ship.task import ShipRow

DEFAULT_MAX_DROP = 1.0
TEACHER = "teacher"


def devices_of(rows: list[ShipRow]) -> list[str]:
    return list(dict.fromkeys(row.device for row in rows))


def pick_device(rows: list[ShipRow], device: str | None) -> str:
    """The device to ship for: the one named, or the run's only one.

    Raises:
        ConfigError: A device the run did not measure on, or several to choose from.
    """
    known = devices_of(rows)
    if device is None:
        if len(known) == 1:
            return known[0]
        raise ConfigError(f"the run measured on {len(known)} devices ({', '.join(known)}): say which one the rung is "
                          "shipped for", fix=f"--device {known[0]} (make ship DEVICE={known[0]})")
    if device not in known:
        raise ConfigError(f"the run did not measure on device {device!r}; it measured on {', '.join(known)}",
                          fix="pass one of those to --device, or deploy to that device first (make edge EDGE=URL)")
    return device


def drop_points(row: ShipRow, teacher: ShipRow) -> float | None:
    """The rung's accuracy loss against the teacher on the same device, in points (positive: lost)."""
    if row.accuracy is None or teacher.accuracy is None:
        return None
    return round(100 * (teacher.accuracy - row.accuracy), 3)


def choose(rows: list[ShipRow], device: str, rung: str, max_drop: float = DEFAULT_MAX_DROP,
           metric: str = "top-1", force: bool = False) -> tuple[ShipRow, str]:
    """The row to ship and why, in words.

    Raises:
        ConfigError: A rung the device did not measure, one the report judged unfit (collapsed, at chance) unless
            ``force``, no teacher to compare with, or (``best``) no rung within ``max_drop``: the closest is named
            with its drop.
    """
    on_device = {row.rung: row for row in rows if row.device == device}
    measured = {name: row for name, row in on_device.items() if row.measured and row.latency_p50_ms is not None}
    if rung != "best":
        if rung not in on_device:
            raise ConfigError(f"the run has no rung {rung!r} on {device}; it has {', '.join(on_device)}",
                              fix="pass one of those to --rung, or --rung best")
        if rung not in measured:
            raise ConfigError(f"{rung} was not measured on {device} (deploy recorded no latency for it)",
                              fix="deploy it to that device first (make edge EDGE=URL), or choose another rung")
        if measured[rung].verdict and not force:
            raise ConfigError(f"{rung} is not fit to ship: the report says {measured[rung].verdict}",
                              fix=f"ship another rung (--rung best), or this one anyway: --rung {rung} --force "
                                  "(the card then says so)")
        said = f"; shipped with --force though the report says {measured[rung].verdict}" if measured[rung].verdict \
            else ""
        return measured[rung], f"{rung}, as asked{said}"
    teacher = on_device.get(TEACHER)
    if teacher is None or teacher.accuracy is None:
        raise ConfigError(f"--rung best compares each rung's {metric} with the teacher's on {device}, and the run has "
                          "no teacher score there", fix="name the rung: --rung student_int8")
    candidates = [row for row in measured.values() if row.rung != TEACHER and not row.verdict]
    # A drop is taken between two scores of one source: a host score against the device's teacher would mix the
    # host's runtime with the device's.
    elsewhere = [row.rung for row in candidates if row.accuracy is not None
                 and row.accuracy_source != teacher.accuracy_source]
    scored = [(drop_points(row, teacher), row) for row in candidates if row.accuracy_source == teacher.accuracy_source]
    scored = [(drop, row) for drop, row in scored if drop is not None]
    within = [(row.latency_p50_ms, drop, row) for drop, row in scored if drop <= max_drop]
    unlike = (f"; not compared, scored on the {'host' if teacher.accuracy_source == 'device' else 'device'} while "
              f"the teacher was scored on the {teacher.accuracy_source}: {', '.join(elsewhere)}" if elsewhere else "")
    if not within:
        closest = min(scored, key=lambda pair: pair[0], default=None)
        named = (f"; the closest is {closest[1].rung} at {closest[0]:.2f} points" if closest else "") + unlike
        raise ConfigError(f"no rung on {device} is within {max_drop:g} {metric} points of the teacher "
                          f"({100 * teacher.accuracy:.2f}){named}",
                          fix=f"raise --max-drop (MAX_DROP=), or name the rung (--rung {closest[1].rung})"
                              if closest else "raise --max-drop, or name the rung")
    within.sort(key=lambda item: item[0])
    fastest = within[0][2]
    # The rule: the fastest, where its latency interval clears every other's; among those whose intervals it does
    # not clear (no measurable difference), the one closest to the teacher, then the faster.
    tied = [(lat, d, r) for lat, d, r in within if r is fastest or not _clears(fastest, r)]
    latency, drop, row = min(tied, key=lambda item: (item[1], item[0]))
    rule = (f"the fastest rung on {device} within {max_drop:g} {metric} points of the teacher, its p50 interval "
            "clear of the next" if len(tied) == 1 else
            f"of the rungs within {max_drop:g} {metric} points of the teacher on {device} whose p50 intervals overlap "
            f"the fastest's ({', '.join(r.rung for _, _, r in tied)}: no measurable difference), the one closest to "
            "the teacher")
    others = [r for _, _, r in within if r is not row]
    faster_outside = [r for d, r in scored if d > max_drop and r.latency_p50_ms < latency]
    versus = f"{drop:.2f} points lost" if drop >= 0 else f"{-drop:.2f} points above it"
    why = (f"{row.rung}: {rule} ({versus}; p50 {latency:.3f} ms{_interval(row)} at batch {row.batch}"
           + (f"; next {others[0].rung} at {others[0].latency_p50_ms:.3f} ms{_interval(others[0])}" if others else "")
           + (f"; faster but outside: {', '.join(r.rung for r in faster_outside)}" if faster_outside else "")
           + unlike + ")")
    return row, why


def _clears(fast: ShipRow, slow: ShipRow) -> bool:
    """Whether ``fast``'s p50 interval lies wholly below ``slow``'s (a row without intervals: its medians differ)."""
    high = fast.figures.get("latency_p50_high_ms")
    low = slow.figures.get("latency_p50_low_ms")
    if high is None or low is None:
        return fast.latency_p50_ms < slow.latency_p50_ms
    return high < low


def _interval(row: ShipRow) -> str:
    low, high = row.figures.get("latency_p50_low_ms"), row.figures.get("latency_p50_high_ms")
    return f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
