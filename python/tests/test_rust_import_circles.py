"""Issue 38 item 6: no Rust crate of ours has an import circle between its top-level modules. A
top-level module (a file or folder under src/) imports another when its non-test code names
`crate::other`; comments and `mod tests` do not count. The circles the issue named are checked by
name as well, so that a failure says which one came back."""

import re
from pathlib import Path

import pytest

CRATES = Path(__file__).resolve().parents[2] / "crates"

GONE = [
    ("nvmf-target", "core", "wire"),  # PortTlsStats lives in port_stats.rs
    ("nvmf-target", "backend", "config"),  # BackendConfig and ModelParams in backend/, parse_size in nvmf_proto::units
    ("nvmf-host", "connection", "tls"),  # the Link trait lives in link.rs
    ("nvmf-tls", "channel", "session"),  # TlsError lives in error.rs
    ("nvmf-host", "queue", "rdma"),  # QueueTransport lives in queue_transport.rs
    ("nvmf-target", "command", "transport"),  # Capabilities and TransportKind live in capabilities.rs
    ("nvmf-target", "core", "transport"),
]

CRATES_OF_OURS = sorted(p.parent.name for p in CRATES.glob("*/src") if p.parent.name.startswith("nvmf-"))


def imports(crate: str, crates: Path = CRATES) -> dict[str, set[str]]:
    """The top-level modules each top-level module of `crate` names with `crate::`."""
    src = crates / crate / "src"
    found: dict[str, set[str]] = {}
    for path in src.rglob("*.rs"):
        module = path.relative_to(src).parts[0].removesuffix(".rs")
        code = re.split(r"#\[cfg\(test\)\]\s*mod tests", path.read_text(encoding="utf-8"))[0]
        code = re.sub(r"//.*", "", code)
        names = set(re.findall(r"crate::(\w+)", code))
        for group in re.findall(r"crate::\{([^;]*?)\};", code):
            names |= set(re.findall(r"(?:^|,)\s*(\w+)", group))
        found.setdefault(module, set()).update(names - {module})
    return found


def test_the_scan_sees_imports_and_ignores_comments_and_tests(tmp_path):
    src = tmp_path / "demo" / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "inner.rs").write_text("use crate::{b, c::X};\n// crate::d\n#[cfg(test)]\nmod tests { use crate::e; }\n")
    (src / "b.rs").write_text("fn f() -> crate::a::T { todo!() }\n")
    assert imports("demo", tmp_path) == {"a": {"b", "c"}, "b": {"a"}}


@pytest.mark.parametrize("crate,one,other", GONE)
def test_a_named_circle_stays_gone(crate, one, other):
    found = imports(crate)
    assert one in found and other in found, f"{crate}: module {one} or {other} is not there any more"
    assert not (other in found[one] and one in found[other]), f"{crate}: {one} and {other} import each other again"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`: each a path a → … → a, found by depth-first search."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_the_circle_search_finds_a_three_module_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("crate", CRATES_OF_OURS)
def test_no_crate_has_an_import_circle(crate):
    assert circles(imports(crate)) == []


# Issue 38 item 6: no Rust module over ~600 lines without a reason given in its first comment.
LINE_LIMIT = 620


def oversized_without_reason(crates: Path = CRATES) -> list[str]:
    """Source files (not integration tests) over LINE_LIMIT lines whose leading `//!` comment does
    not say why ("over 600 lines ...")."""
    found = []
    for path in sorted(crates.glob("*/src/**/*.rs")):
        lines = path.read_text(encoding="utf-8").splitlines()
        head = " ".join(line for line in lines[:40] if line.startswith("//!")).lower()
        if len(lines) > LINE_LIMIT and "over 600 lines" not in head:
            found.append(f"{path.relative_to(crates)} ({len(lines)} lines)")
    return found


def test_the_size_rule_sees_a_long_module_and_its_reason(tmp_path):
    src = tmp_path / "demo" / "src"
    src.mkdir(parents=True)
    (src / "long.rs").write_text("//! A module.\n" + "fn f() {}\n" * 700)
    (src / "why.rs").write_text("//! Over 600 lines: one state machine.\n" + "fn f() {}\n" * 700)
    (src / "short.rs").write_text("fn f() {}\n" * 100)
    assert oversized_without_reason(tmp_path) == ["demo/src/long.rs (701 lines)"]


def test_no_rust_module_is_over_600_lines_without_saying_why():
    assert oversized_without_reason() == []
