"""Every nvmflab command in the shell blocks of README.md and docs/*.md runs (issue 25, item 1).

The blocks are read from the documents themselves, so a documented command that breaks fails here.
The commands of a block run in order in one directory, as a reader types them. A study or run on our
own stack whose results a later command reads (`report`, `compare`) measures for real on the fake
binaries, with `--quick` (the same spec, shorter); any other runs with `--plan` (every command each
host would run, nothing run); the ones that need remote hosts run with `--plan`
against the sshd test bed (network namespaces, root only) with the inventory's hosts pointed at it. Everything else in those blocks is listed in
EXCLUDED with the reason, and a command of a kind this file does not know fails the test, so a new
block cannot slip past unnoticed. The usage synopsis of docs/harness.md is checked flag by flag
against the CLI, both ways.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import sshbed
from conftest import NVMFLAB, REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL = ("sh", "bash", "shell", "console")
# First words of commands these tests do not run, and why.
EXCLUDED = {
    "make": "builds, installs and runs the suites themselves (CI runs `make test`; `make run` is test_cli's "
            "`study all --quick` on the fakes)",
    "cargo": "Rust builds and tests: the Rust suites and CI run them",
    "target/release/nvmf-target": "the Rust target: crates/nvmf-target/tests and tests/ run it",
    "target/release/nvmf-perf": "the Rust load generator: crates/nvmf-host/tests and tests/ run it",
    "nvmf-perf": "the Rust load generator: crates/nvmf-host/tests run it",
    "nvmf-target": "the Rust target started by hand: crates/nvmf-target/tests run it (control.rs with --control)",
    "nvmf-target-ctl": "the control client: crates/nvmf-target/tests/it/control.rs runs it against a live target",
    "ssh-copy-id": "installs a key on a real server",
    "curl": "reads the stats endpoint of the target the block started by hand",
    "bash": "fuzz/run.sh: the fuzzing campaign (minutes per target; make fuzz-smoke is its short form)",
    "cd": "fuzz/: cargo fuzz on a nightly toolchain (docs/fuzzing.md)",
    "python3": "tests/blktests/run.py: the conformance suite in a qemu guest (make conformance; minutes)",
}
# `KEY=value` alone on a line sets a shell variable for the block's later commands: nothing to run.
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")
# nvmflab subcommands that measure: they run with --plan here.
MEASURING = ("study", "run")


@dataclass
class Command:
    doc: Path
    line: int
    text: str
    files: dict[str, str]  # heredoc files written earlier in the same block: name -> content
    block: int  # the line its block starts on

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def shell_blocks(doc: Path) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each fenced block labelled as shell."""
    lines, out, i = doc.read_text().splitlines(), [], 0
    while i < len(lines):
        fence = re.match(r"^\s*```(\S*)", lines[i])
        if fence:
            end = i + 1
            while end < len(lines) and not re.match(r"^\s*```", lines[end]):
                end += 1
            if fence.group(1) in SHELL:
                out.append((i + 2, lines[i + 1:end]))
            i = end
        i += 1
    return out


def commands(doc: Path) -> list[Command]:
    """Each command of the doc's shell blocks, continuation lines joined, heredocs kept as files."""
    found = []
    for first, lines in shell_blocks(doc):
        files: dict[str, str] = {}
        i = 0
        while i < len(lines):
            line, number = lines[i], first + i
            heredoc = re.match(r"^\s*cat\s*>\s*(\S+)\s*<<\s*'?(\w+)'?\s*$", line)
            if heredoc:
                end = lines.index(heredoc.group(2), i + 1)
                files[heredoc.group(1)] = "\n".join(lines[i + 1:end]) + "\n"
                i = end + 1
                continue
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            text = line.split(" #", 1)[0].strip() if not line.strip().startswith("#") else ""
            if text:
                found.append(Command(doc, number, text, dict(files), first))
            i += 1
    return found


ALL = [c for doc in DOCS for c in commands(doc)]


def is_nvmflab(command: Command) -> bool:
    return Path(shlex.split(command.text)[0]).name == "nvmflab"


def needs_hosts(command: Command) -> bool:
    """True when the command reads an SSH inventory (a heredoc of its block makes an ssh topology)."""
    return any('kind = "ssh"' in content for content in command.files.values())


def test_every_command_is_run_or_excluded_with_a_reason():
    assert len([c for c in ALL if is_nvmflab(c)]) >= 6, "the docs' nvmflab commands were not found"
    unknown = [f"{c.where}: {c.text}" for c in ALL if not is_nvmflab(c) and shlex.split(c.text)[0] not in EXCLUDED
               and not ASSIGNMENT.match(c.text)]
    assert not unknown, "commands neither run nor excluded (add them to EXCLUDED with the reason): " + \
        "; ".join(unknown)


def results_dir(argv: list[str]) -> str:
    return argv[argv.index("--results") + 1] if "--results" in argv[:-1] else "results"


def measures_for_real(argv: list[str], later: list[Command]) -> bool:
    """A local study or run on our own stack whose results a later command of the block reads
    (`report results/quick`, `compare before after`): measured for real on the fake binaries.
    Others run with --plan (another stack: the fakes are ours; nothing reads their results)."""
    stacks = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--stack", "--host-stack", "--target-stack")]
    if not all(s == "ours" for s in stacks):
        return False
    where = results_dir(argv)
    return any(where in shlex.split(c.text)[2:] for c in later if shlex.split(c.text)[1] not in MEASURING)


def argv_for(command: Command, later: list[Command] = ()) -> list[str]:
    argv = shlex.split(command.text)[1:]
    if not argv or argv[0] not in MEASURING or "--plan" in argv:
        return argv
    if not measures_for_real(argv, list(later)):
        return argv + ["--plan"]  # every command each host would run: the plan checks all the rest
    if argv[0] == "study" and "--quick" not in argv:
        argv.append("--quick")  # the full study takes minutes even on the fakes; the same spec, quick
    return argv


def run(argv: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(NVMFLAB + argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


BLOCKS: dict[str, list[Command]] = {}
for _command in ALL:
    if is_nvmflab(_command) and not needs_hosts(_command):
        BLOCKS.setdefault(f"{_command.doc.relative_to(REPO)}:{_command.block}", []).append(_command)


def block_id(commands: list[Command]) -> str:
    return commands[0].where


LOCAL = list(BLOCKS.values())


@pytest.mark.parametrize("block", LOCAL, ids=[block_id(b) for b in LOCAL])
def test_documented_commands_run_in_order(block, tmp_path, fake_env):
    """Each block's nvmflab commands, in order in one directory, as a reader would type them (a
    later command may read what an earlier one wrote: `report results/quick`)."""
    # A small deterministic spread in IOPS and latency, as real repeats have: compare's gate passes
    # only what an interval shows within its threshold (identical repeats have none).
    env = fake_env | {"FAKE_PERF_SLEEP": "0", "FAKE_PERF_JITTER": "0.005", "FAKE_PERF_JITTER_LATENCY": "1"}
    for i, command in enumerate(block):
        for name, content in command.files.items():
            (tmp_path / name).write_text(content)
        done = run(argv_for(command, block[i + 1:]), tmp_path, env)
        assert done.returncode == 0, f"{command.where}: `{command.text}` exited {done.returncode}: {done.stderr[-2000:]}"
        assert "internal error" not in done.stderr


REMOTE = [c for c in ALL if is_nvmflab(c) and needs_hosts(c)]


@pytest.mark.skipif(sshbed.unavailable() is not None, reason=f"ssh test bed: {sshbed.unavailable()}")
def test_documented_commands_on_ssh_hosts_run_against_the_test_bed(tmp_path, fake_env):
    assert REMOTE, "the README's two-server quickstart was not found"
    with sshbed.SshBed(tmp_path / "bed", count=2) as bed:
        for command in REMOTE:
            for name, content in command.files.items():
                (tmp_path / name).write_text(_on_bed(content, bed))
            done = run(argv_for(command), tmp_path, fake_env)  # planned: the bed has no nvmet
            assert done.returncode == 0, f"{command.where}: `{command.text}`: {done.stderr[-2000:]}"
            assert "internal error" not in done.stderr


def _on_bed(content: str, bed) -> str:
    """An inventory's hosts pointed at the bed's: ssh destinations and data addresses in order."""
    ssh = iter(bed.aliases)
    ips = iter(bed.ips)
    content = re.sub(r'^ssh = "[^"]*"', lambda m: f'ssh = "{next(ssh)}"\nssh_options = ["-F", "{bed.ssh_config}"]',
                     content, flags=re.M)
    content = re.sub(r'^data_ip = "[^"]*"', lambda m: f'data_ip = "{next(ips)}"', content, flags=re.M)
    return re.sub(r"^cores = \[[^\]]*\]", "cores = [0, 1]", content, flags=re.M)


def test_the_harness_synopsis_names_every_flag_of_the_cli_and_no_other():
    import typer

    from nvmflab.cli import app

    text = (REPO / "docs" / "harness.md").read_text()
    synopsis = text.split("```\nnvmflab study", 1)[1].split("```", 1)[0]
    group = typer.main.get_command(app)
    documented: dict[str, set[str]] = {}
    current = None
    for line in ("nvmflab study" + synopsis).splitlines():
        words = line.split()
        if line.startswith("nvmflab "):
            current = words[1]
        documented.setdefault(current, set()).update(re.findall(r"--[a-z][a-z-]*", line.split("#")[0]))
    documented["results"] |= set(re.findall(r"--[a-z][a-z-]*", synopsis.split("nvmflab results", 1)[1]
                                            .split("\n", 1)[0]))
    for name, flags in documented.items():
        command = group.commands[name]
        if hasattr(command, "commands"):  # a group: `results list|show|export`
            have = {o for sub in command.commands.values() for p in sub.params for o in p.opts if o.startswith("--")}
        else:
            have = {o for p in command.params for o in p.opts if o.startswith("--")}
        have.discard("--help")
        assert flags <= have, f"docs/harness.md names flags `nvmflab {name}` lacks: {sorted(flags - have)}"
        assert have <= flags, f"`nvmflab {name}` has flags docs/harness.md does not name: {sorted(have - flags)}"
