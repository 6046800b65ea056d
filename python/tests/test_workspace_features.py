"""`cargo build` and `cargo test` resolve the same features for every crate both build
(crates/workspace-hack), so the test build reuses the release build's libraries and binaries instead
of compiling openssl, tracing-subscriber and our crates a second time (issue 41 item 6: `make test`
builds both). A dev-dependency that turns on a feature of a shared crate shows up here."""

import shutil
import subprocess

import pytest

from conftest import REPO


def features(edges: str) -> dict[str, str]:
    done = subprocess.run(["cargo", "tree", "--workspace", "--offline", "-e", edges, "--prefix", "none",
                           "-f", "{p}|{f}"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return dict(line.rsplit("|", 1) for line in done.stdout.splitlines() if "|" in line and "(*)" not in line)


@pytest.mark.skipif(shutil.which("cargo") is None, reason="no cargo on PATH")
def test_tests_turn_on_no_feature_the_build_lacks():
    built, tested = features("normal,build"), features("normal,build,dev")
    differ = {crate: (built[crate], tested[crate]) for crate in built if built[crate] != tested.get(crate)}
    assert differ == {}, f"add these features to crates/workspace-hack/Cargo.toml: {differ}"
