#!/usr/bin/env python3
"""Runs blktests' nvme tests in a qemu guest against nvmf-target (and the kernel's nvmet as the
control column) and records every test's result. docs/conformance.md says how and what was found.

    run.py --tests "nvme/004 nvme/010"   the named tests
    run.py --all                         every test of tests/nvme in blktests
    run.py ... --expect FILE             fail (exit 1) unless every test in FILE ends as it says there
    run.py ... --trtype rdma             both columns over NVMe/RDMA on Soft-RoCE (rdma_rxe) instead of TCP

The guest (tests/blktests/build-guest.sh) is Debian trixie's 6.12 kernel with a root filesystem of
trixie packages, cached in ~/.cache/nvmflab/blktests; blktests' source is unpacked from
../shared/peers/blktests-a608cb5.tar.gz (checked against its sha256) on every run, with
nvmf-target (target/release) and tests/blktests/nvmf-target-control beside it. Everything runs
inside the guest: the target listens on the guest's 127.0.0.1:4420, so no traffic leaves it
(qemu has no network device at all). Results come back as a tar stream on a second virtio disk.
With --trtype rdma the guest makes a veth pair with rxe on it (10.77.0.1) and both columns use it;
nvmf-target is then the build with the rdma feature (target/release/rdma, tests/rdma/check.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "tests/guest"))
import trixie  # noqa: E402  (the shared guest: build, pack, boot)

BLKTESTS_SHA256 = "2487327cc076c2cf176bcdda9ffa0f62a3552dc067e780ef044854bfb303bd96"
BLKTESTS_TAR = "blktests-a608cb5.tar.gz"
CACHE = Path(os.environ.get("NVMFLAB_BLKTESTS_CACHE", Path.home() / ".cache/nvmflab/blktests"))
COLUMNS = ("nvmf-target", "nvmet")
# "nvme/010 (tr=tcp bd=file) (run data verification fio job)   [passed]"
STATUS = re.compile(r"^(nvme/\d{3})(?: => \S+)?\s+(?:\(([^)]*=[^)]*)\)\s+)?(?:\((.*)\))?\s*\[(passed|failed|not run)\]\s*$")
TIMEOUT_LINE = re.compile(r"^(nvme/\d{3}) \[timeout after (\d+) s\]$")


def log(msg: str) -> None:
    print(f"blktests: {msg}", flush=True)


def find_tarball() -> Path:
    for d in [os.environ.get("NVMFLAB_BLKTESTS_SRC", ""), ROOT.parent / "shared/peers", ROOT / "../shared/peers"]:
        if d and (Path(d) / BLKTESTS_TAR).is_file():
            return (Path(d) / BLKTESTS_TAR).resolve()
        if d and Path(d).is_file():
            return Path(d).resolve()
    raise SystemExit(f"blktests: {BLKTESTS_TAR} not found in ../shared/peers (or NVMFLAB_BLKTESTS_SRC)")


def check_sha(path: Path) -> None:
    h = hashlib.sha256(path.read_bytes()).hexdigest()
    if h != BLKTESTS_SHA256:
        raise SystemExit(f"blktests: {path} has sha256 {h}, expected {BLKTESTS_SHA256}")


def all_tests(src: Path) -> list[str]:
    with tarfile.open(src) as tf:
        names = {m.name.split("/", 1)[-1] for m in tf.getmembers()}
    return sorted(n.removeprefix("tests/") for n in names if re.fullmatch(r"tests/nvme/\d{3}", n))


def build_guest() -> tuple[Path, Path]:
    try:
        return trixie.build()
    except trixie.GuestUnavailable as e:
        if os.environ.get("NVMFLAB_CONFORMANCE_REQUIRE") == "1":
            raise SystemExit(f"blktests: {e}") from None
        # As the interop suite without its kernel: no network, no guest; said, not hidden.
        log(f"SKIPPED: {e}; NVMFLAB_CONFORMANCE_REQUIRE=1 makes this an error")
        raise SystemExit(0) from None
    except RuntimeError as e:
        raise SystemExit(f"blktests: {e}") from None


def pack_transport_overlay(work: Path, trtype: str, kernel: Path, rdma_bin: Path) -> Path:
    """A third cpio, unpacked after the others: /etc/nvmflab/transport.conf (TRTYPE) and, for rdma,
    the RDMA build of nvmf-target in place of the TCP-only one and veth.ko.xz (the guest's module
    tree has no drivers/net; guest-init loads it with insmod)."""
    tree = work / "transport-overlay"
    (tree / "etc/nvmflab").mkdir(parents=True)
    (tree / "etc/nvmflab/transport.conf").write_text(f"TRTYPE={trtype}\n")
    if trtype == "rdma":
        kver = kernel.name.removeprefix("vmlinuz-")
        veth = trixie.CACHE / f"kernel-{kver}/usr/lib/modules/{kver}/kernel/drivers/net/veth.ko.xz"
        if not veth.is_file():
            raise SystemExit(f"blktests: {veth} missing (the guest's kernel package unpacked by build-guest.sh)")
        (tree / "root").mkdir()
        shutil.copy2(veth, tree / "root/veth.ko.xz")
        (tree / "usr/local/bin").mkdir(parents=True)
        shutil.copy2(rdma_bin, tree / "usr/local/bin/nvmf-target")
    return trixie.pack_cpio(tree, work / "transport-overlay.cpio")


def pack_overlay(work: Path, src: Path, target_bin: Path, tests: list[str], columns: list[str],
                 per_test_timeout: int, img_size: str) -> Path:
    tree = work / "overlay"
    (tree / "blktests").mkdir(parents=True)
    subprocess.run(["tar", "-xzf", str(src), "-C", str(tree / "blktests"), "--strip-components=1"], check=True)
    for d in ["usr/local/bin", "etc/nvmflab"]:
        (tree / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(target_bin, tree / "usr/local/bin/nvmf-target")
    shutil.copy2(HERE / "nvmf-target-control", tree / "usr/local/bin/nvmf-target-control")
    shutil.copy2(target_bin.parent / "nvmf-target-ctl", tree / "usr/local/bin/nvmf-target-ctl")
    shutil.copy2(HERE / "configfs-shim", tree / "usr/local/bin/configfs-shim")
    shutil.copy2(HERE / "guest-init", tree / "init")
    # configfs's mkdir/rmdir semantics on the shim's tmpfs, ahead of coreutils on PATH.
    for name in ["mkdir", "rmdir"]:
        shutil.copy2(HERE / "configfs-dirops", tree / "usr/local/bin" / name)
    shutil.copy2(trixie.BOOT_COMMON, tree / "etc/nvmflab/boot-common.sh")
    for f in ["usr/local/bin/nvmf-target-control", "usr/local/bin/configfs-shim", "init",
              "usr/local/bin/mkdir", "usr/local/bin/rmdir"]:
        (tree / f).chmod(0o755)
    (tree / "etc/nvmflab/run.conf").write_text(
        f'TESTS="{" ".join(tests)}"\nCOLUMNS="{" ".join(columns)}"\n'
        f"PER_TEST_TIMEOUT_S={per_test_timeout}\nIMG_SIZE={img_size}\n"
    )
    return trixie.pack_cpio(tree, work / "overlay.cpio")


def parse_check_log(text: str) -> dict[str, dict]:
    """Test (with its condition) -> {status, detail}: blktests' own lines and what follows them
    (skip reasons, the output diff of a failure)."""
    results: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        line = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line).rstrip()
        if m := STATUS.match(line):
            name = m.group(1) + (f" ({m.group(2)})" if m.group(2) else "")
            status = {"passed": "pass", "failed": "fail", "not run": "skip"}[m.group(4)]
            current = results[name] = {"test": m.group(1), "cond": m.group(2) or "", "status": status,
                                       "description": m.group(3) or "", "detail": []}
        elif m := TIMEOUT_LINE.match(line):
            name = m.group(1)
            hits = [k for k in results if results[k]["test"] == name] or [name]
            for k in hits:
                results.setdefault(k, {"test": name, "cond": "", "status": "fail", "description": "", "detail": []})
                results[k]["status"] = "fail"
                results[k]["detail"].append(f"timeout: killed after {m.group(2)} s")
            current = None
        elif current is not None and line.startswith("    "):
            s = line.strip()
            if current["status"] == "skip" and not s.startswith("runtime"):
                current["detail"].append(s)  # blktests' skip reasons
            elif current["status"] == "fail" and re.match(r"^[-+](?![-+]{2} )", s):
                current["detail"].append(s)  # the diff of the output against tests/nvme/NNN.out
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--tests", help="tests to run, e.g. 'nvme/004 nvme/010'")
    g.add_argument("--all", action="store_true", help="every test in tests/nvme")
    ap.add_argument("--columns", default="nvmf-target", help="nvmf-target, nvmet or both ('nvmf-target nvmet')")
    ap.add_argument("--results", default="results/blktests", help="where results.json, results.md and logs go")
    ap.add_argument("--expect", help="file of 'nvme/NNN STATUS' lines (pass, fail, skip) the nvmf-target column must "
                    "match; without --tests or --all, runs exactly those tests")
    ap.add_argument("--timeout", type=int, default=3600, help="whole guest run, seconds")
    ap.add_argument("--per-test-timeout", type=int, default=300)
    ap.add_argument("--img-size", default="64M", help="NVME_IMG_SIZE (the namespace size; nvme/012 wants 350M)")
    ap.add_argument("--memory-mb", type=int, default=3072)
    ap.add_argument("--target-bin", default=str(ROOT / "target/release/nvmf-target"))
    ap.add_argument("--trtype", choices=("tcp", "rdma"), default="tcp",
                    help="NVMET_TRTYPES of both columns; rdma: Soft-RoCE in the guest and --rdma-bin as nvmf-target")
    ap.add_argument("--rdma-bin", default=str(ROOT / "target/release/rdma/nvmf-target"),
                    help="nvmf-target built with the rdma feature (tests/rdma/check.py builds it there)")
    a = ap.parse_args()

    columns = a.columns.split()
    if bad := [c for c in columns if c not in COLUMNS]:
        ap.error(f"unknown column {bad}; choose from {COLUMNS}")
    src = find_tarball()
    check_sha(src)
    if not (a.all or a.tests or a.expect):
        ap.error("name --tests, --all or --expect")
    target_bin = Path(a.target_bin)
    if not target_bin.is_file() or not (target_bin.parent / "nvmf-target-ctl").is_file():
        raise SystemExit(f"blktests: {target_bin} or nvmf-target-ctl beside it missing (make build)")
    rdma_bin = Path(a.rdma_bin)
    if a.trtype == "rdma" and not rdma_bin.is_file():
        raise SystemExit(f"blktests: {rdma_bin} missing (make conformance-rdma builds it)")
    expect: dict[str, str] = {}
    if a.expect:
        for line in Path(a.expect).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                t, st = line.split(None, 1)
                expect[t] = st.strip()
    tests = all_tests(src) if a.all else a.tests.replace(",", " ").split() if a.tests else list(expect)
    if expect:
        if missing := [t for t in expect if t not in tests]:
            ap.error(f"--expect names tests not run: {missing}")

    kernel, base = build_guest()
    results_dir = (ROOT / a.results) if not Path(a.results).is_absolute() else Path(a.results)
    shutil.rmtree(results_dir, ignore_errors=True)
    results_dir.mkdir(parents=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="blktests-", dir=CACHE) as tmp:
        work = Path(tmp)
        overlay = pack_overlay(work, src, target_bin, tests, columns, a.per_test_timeout, a.img_size)
        transport = pack_transport_overlay(work, a.trtype, kernel, rdma_bin)
        initrd = trixie.concat([base, overlay, transport], work / "initrd.cpio")
        disk = work / "results.img"
        with open(disk, "wb") as f:
            f.truncate(256 << 20)
        log(f"booting {kernel.name}: {len(tests)} test(s), columns {' '.join(columns)}, {a.trtype}, limit {a.timeout} s")
        finished, why = trixie.boot(work, kernel, initrd, disk, a.timeout, a.memory_mb, log)
        shutil.copy2(work / "console.log", results_dir / "console.log")
        raw = results_dir / "guest"
        raw.mkdir()
        if subprocess.run(["tar", "-xf", str(disk), "-C", str(raw)], capture_output=True).returncode != 0:
            log(f"no results came back ({why}); console: {results_dir / 'console.log'}")
            return 2
    elapsed = time.monotonic() - t0

    table: dict[str, dict[str, dict]] = {}
    for col in columns:
        log_file = raw / col / "check.log"
        table[col] = parse_check_log(log_file.read_text(errors="replace")) if log_file.exists() else {}
    # A test named but with no line at all (the guest stopped before it) is a failure.
    for col in columns:
        for t in tests:
            if not any(r["test"] == t for r in table[col].values()):
                table[col][t] = {"test": t, "cond": "", "status": "fail", "description": "",
                                 "detail": [f"no result ({why})"]}
    doc = {"blktests": "a608cb56341e0f4cacf473f5e0ac6052f1f12de9", "kernel": kernel.name.removeprefix("vmlinuz-"),
           "img_size": a.img_size, "trtype": a.trtype, "elapsed_s": round(elapsed), "finished": finished, "columns": table}
    (results_dir / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    keys = sorted({k for col in columns for k in table[col]})
    lines = ["| test | " + " | ".join(columns) + " | detail (" + columns[0] + ") |", "|---|" + "---|" * len(columns) + "---|"]
    for k in keys:
        cells = [table[c].get(k, {}).get("status", "-") for c in columns]
        det = "; ".join(table[columns[0]].get(k, {}).get("detail", [])[:3]).replace("|", "\\|")
        lines.append(f"| {k} | " + " | ".join(cells) + f" | {det[:200]} |")
    (results_dir / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    log(f"{elapsed:.0f} s in all; results in {results_dir}")

    rc = 0 if finished else 1
    if not finished:
        log(f"the guest did not finish: {why}")
    if expect:
        got = {}
        for r in table["nvmf-target"].values() if "nvmf-target" in table else []:
            got.setdefault(r["test"], set()).add(r["status"])
        for t, want in expect.items():
            have = got.get(t, {"missing"})
            if have != {want}:
                log(f"UNEXPECTED {t}: {'/'.join(sorted(have))}, expected {want}")
                rc = 1
        if rc == 0:
            log(f"all {len(expect)} expected results matched")
    return rc


if __name__ == "__main__":
    sys.exit(main())
