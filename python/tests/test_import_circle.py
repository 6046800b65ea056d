"""Issue 38: analysis/common.py and findings_data.py no longer import each other; what both need
(the descriptive marker, the comparison notes, a study's rows) lives in analysis/recorded.py and
analysis/stats.py, imported at the top of each, so no import hides inside a function."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nvmflab"


def imported(path: Path) -> tuple[set[str], set[str]]:
    """(modules imported at the top, modules imported inside functions) of a source file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inner = {node.module or "" for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
             for node in ast.walk(fn) if isinstance(node, ast.ImportFrom)}
    top = {node.module or "" for node in tree.body if isinstance(node, ast.ImportFrom)}
    return top, inner


def test_common_and_findings_data_do_not_import_each_other():
    common_top, common_inner = imported(PACKAGE / "analysis/common.py")
    data_top, data_inner = imported(PACKAGE / "findings_data.py")
    assert not any("findings_data" in m for m in common_top | common_inner)
    assert not any(m.endswith("common") for m in data_top | data_inner)
    assert common_inner == set() and data_inner == set()  # nothing hidden inside a function
    assert "recorded" in common_top and "analysis.recorded" in data_top  # the shared piece, at the top

