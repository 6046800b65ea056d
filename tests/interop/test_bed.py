"""The test bed leaves nothing behind: processes it started and its namespace are gone after close,
and a namespace left by a killed run is removed by the next one."""

import subprocess
import time
from pathlib import Path

from initramfs import BootFiles
from vm import TestBed, remove_stale_namespaces


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_close_kills_processes_and_deletes_the_namespace(tmp_path: Path):
    bed = TestBed(BootFiles(Path("/nonexistent"), Path("/nonexistent"), "none"), tmp_path)
    bed.create_netns()
    try:
        assert bed.netns in _namespaces()
        sleeper = bed.spawn_in_ns(["sleep", "120"], "sleep.log")
        time.sleep(0.2)
        assert sleeper.poll() is None
    finally:
        bed.close()
    assert sleeper.poll() is not None, "process started in the namespace outlived close()"
    assert bed.netns not in _namespaces()


def test_stale_namespace_of_a_dead_run_is_removed():
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = f"nvmflab-interop-{dead.pid}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        remove_stale_namespaces()
        assert name not in _namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
