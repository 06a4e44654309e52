"""How the local Spark server's supervisor is judged alive when stopping it (real processes)."""

import subprocess
import time

from cdc_assets.io.spark_server import _alive


def test_an_exited_child_is_not_alive_though_it_still_takes_signals_until_reaped():
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    # Exited but not reaped: a zombie, which os.kill(pid, 0) still reaches.
    while subprocess.run(["ps", "-o", "stat=", "-p", str(child.pid)], capture_output=True,
                         text=True).stdout.strip()[:1] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.05)
    assert not _alive(child.pid)


def test_a_running_child_and_a_process_that_is_not_ours_are_alive():
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert _alive(child.pid)
        assert _alive(1)
    finally:
        child.kill()
        child.wait()
