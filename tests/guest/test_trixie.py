"""The shared trixie guest (trixie.py): a script runs as root, its exit status, its $OUT and its
progress lines come back, and the guest has what the TLS and RDMA checks rely on."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import trixie  # noqa: E402


@pytest.fixture(scope="module")
def guest_run(tmp_path_factory):
    script = """
echo "@@ step one"
cat /root/given.txt >$OUT/given.txt
stat -c %a /usr/local/bin/tool >$OUT/mode.txt
cat /etc/nvme/hostnqn >$OUT/hostnqn.txt
for m in nvme-tcp nvmet-tcp tls rdma_rxe nvme-rdma nvmet-rdma; do modprobe $m && echo $m; done >$OUT/modules.txt
for b in tlshd nvme fio ibv_devices rdma keyctl; do command -v $b >/dev/null && echo $b; done >$OUT/tools.txt
exit 7
"""
    tool = tmp_path_factory.mktemp("files") / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o750)
    lines: list[str] = []
    try:
        run = trixie.run_script(script, {"/root/given.txt": b"payload\n", "/usr/local/bin/tool": tool},
                                timeout_s=240, progress=lines.append, keep=tmp_path_factory.mktemp("guest"))
    except trixie.GuestUnavailable as e:
        if os.environ.get("NVMFLAB_CONFORMANCE_REQUIRE") == "1":
            raise
        pytest.skip(str(e))
    return run, lines


def test_script_status_out_and_progress_come_back(guest_run):
    run, lines = guest_run
    assert run.finished, run.why
    assert run.rc == 7
    assert (run.out / "given.txt").read_text() == "payload\n"
    assert (run.out / "mode.txt").read_text().strip() == "750"
    assert (run.out / "hostnqn.txt").read_text().strip() == trixie.HOSTNQN
    assert "step one" in lines and "SCRIPT-RC 7" in lines


def test_guest_has_the_tls_and_rdma_pieces(guest_run):
    run, _ = guest_run
    assert (run.out / "modules.txt").read_text().split() == ["nvme-tcp", "nvmet-tcp", "tls", "rdma_rxe", "nvme-rdma", "nvmet-rdma"]
    assert set((run.out / "tools.txt").read_text().split()) == {"tlshd", "nvme", "fio", "ibv_devices", "rdma", "keyctl"}


def test_a_guest_that_never_comes_up_is_booted_once_more(tmp_path, monkeypatch):
    # A stand-in qemu that counts its starts and never prints GUEST-UP (as a kernel oopsing at boot).
    fake = tmp_path / "bin" / "qemu-system-x86_64"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho start >>{tmp_path}/starts\nexec sleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setattr(trixie, "BOOT_LIMIT_S", 2)
    lines: list[str] = []
    finished, why = trixie.boot(tmp_path, Path("k"), Path("i"), Path("d"), 30, 256, lines.append)
    assert not finished and "did not come up" in why
    assert (tmp_path / "starts").read_text().count("start") == 2
    assert any("booting it once more" in line for line in lines)
