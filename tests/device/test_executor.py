from device.service.executor import describe_exit


def test_exit_descriptions_name_the_signal_and_its_usual_cause():
    assert describe_exit(1) == "exit status 1"
    assert describe_exit(-9).startswith("killed by SIGKILL") and "out of memory" in describe_exit(-9)
    assert "crashed" in describe_exit(-11)
