"""Backing files made on the host that opens them (files.place_file)."""

from pathlib import Path

import pytest

from nvmflab.files import place_file
from nvmflab.topology.base import HostError
from nvmflab.topology.local import LocalHost


def test_a_harness_file_is_made_with_data_and_remade_at_another_size(tmp_path):
    host, work = LocalHost(workdir=tmp_path / "host"), tmp_path / "results" / "work"
    path = str(work / "ns.img")
    assert place_file(host, path, 1 << 20, work) == path
    data = Path(path).read_bytes()
    assert len(data) == 1 << 20 and data.count(0) == 0  # written blocks, not holes or zeros
    place_file(host, path, 4096, work)
    assert Path(path).stat().st_size == 4096


def test_a_path_the_user_gave_is_never_overwritten(tmp_path):
    host, work = LocalHost(workdir=tmp_path / "host"), tmp_path / "results" / "work"
    mine = tmp_path / "mine.img"
    mine.write_bytes(b"x" * 8192)
    assert place_file(host, str(mine), 4096, work) == str(mine)
    assert mine.read_bytes() == b"x" * 8192  # bigger than needed: used as it is
    with pytest.raises(HostError, match=r"holds 8192 bytes, fewer than the backend size 16384"):
        place_file(host, str(mine), 16384, work)
    assert mine.read_bytes() == b"x" * 8192
    assert place_file(host, "/dev/null", 1 << 30, work) == "/dev/null"  # not a regular file: left alone
    missing = tmp_path / "new" / "made.img"
    place_file(host, str(missing), 4096, work)
    assert missing.stat().st_size == 4096


def test_on_a_remote_host_harness_files_move_into_its_work_directory(tmp_path):
    class Remote(LocalHost):
        remote = True

    host, work = Remote(workdir=tmp_path / "remote-workdir"), tmp_path / "results" / "work"
    there = place_file(host, str(work / "ns.img"), 4096, work)
    assert there == f"{host.workdir()}/files/ns.img" and Path(there).stat().st_size == 4096
    assert not (work / "ns.img").exists()
    mine = tmp_path / "given.img"
    assert place_file(host, str(mine), 4096, work) == str(mine)  # a given path stays where it is
