"""scripts/install-deps.sh runs one at a time: `make -j2 build venv spdk` on a fresh machine starts it
twice, and apt refuses the second while the first holds apt's lock, failing the make."""
import fcntl
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_second_run_waits_for_the_first_and_then_finishes(tmp_path):
    lock = tmp_path / "deps.lock"
    env = dict(os.environ, NVMFLAB_DEPS_LOCK=str(lock))
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # the first run, still installing
        proc = subprocess.Popen(["bash", str(ROOT / "scripts/install-deps.sh"), "--for", "run"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(1.5)
            assert proc.poll() is None, "install-deps.sh went on while another run held the lock"
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert "another install-deps run holds" in out
    assert proc.returncode == 0, out
