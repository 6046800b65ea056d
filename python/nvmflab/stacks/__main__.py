"""`python -m nvmflab.stacks DOCS_FILE`: rewrite the generated knob map in DOCS_FILE from the registry."""

from __future__ import annotations

import sys
from pathlib import Path

from ..knobs import markdown, with_section
from . import STACKS, get_stack


def knob_table() -> str:
    return markdown({name: get_stack(name) for name in STACKS})


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m nvmflab.stacks DOCS_FILE  (rewrites its generated knob map)", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        path.write_text(with_section(path.read_text(), knob_table()))
    except (OSError, ValueError) as err:
        print(f"{path}: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
