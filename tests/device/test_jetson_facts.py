"""L4T → JetPack (jetson-stats 7.2.2's table, exact), the board model, and the engine fingerprint."""

# the engine cache and describe_device use it
from device.runners.engine import (fingerprint, fingerprint_key, jetpack_for)
from device.power.jetson import board_model, module_id


def test_jetpack_is_looked_up_exactly_not_guessed_from_the_prefix():
    assert jetpack_for("36.4.7") == "6.2.1"  # the old prefix guess said 6.1
    assert jetpack_for("36.4.4") == "6.2.1" and jetpack_for("36.4.3") == "6.2" and jetpack_for("36.4.0") == "6.1"
    assert jetpack_for("38.2.0") == "7.0" and jetpack_for("38.4.0") == "7.1"  # r38: the old table said nothing
    assert jetpack_for("35.6.1") == "5.1.5" and jetpack_for("32.5") == "4.5" and jetpack_for("R35.4.1") == "5.1.2"
    assert jetpack_for("36.4.9") is None and jetpack_for(None) is None  # unknown: no JetPack, not a wrong one


def test_board_model_tells_orin_boards_apart(tmp_path):
    nano, agx = tmp_path / "nano", tmp_path / "agx"
    nano.write_bytes(b"NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super\0")
    agx.write_bytes(b"Jetson AGX Orin Developer Kit\0")
    assert board_model((str(tmp_path / "absent"), str(nano))) == "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super"
    compatible = tmp_path / "compatible"
    compatible.write_bytes(b"nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234\0")
    assert module_id(str(compatible)) == "p3701-0005"
    # Same TensorRT, GPU, compute capability and L4T: only the board separates their engines.
    on_nano = fingerprint("10.3.0", "tegra234 iGPU", "8.7", "36.4.3", board=board_model((str(nano),)))
    on_agx = fingerprint("10.3.0", "tegra234 iGPU", "8.7", "36.4.3", board=board_model((str(agx),)))
    assert fingerprint_key(on_nano) != fingerprint_key(on_agx) and on_agx["jetpack"] == "6.2"
