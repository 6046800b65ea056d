"""Lets the interop modules import each other when pytest runs from the repository root, and
turns SIGTERM into KeyboardInterrupt so the test bed's cleanup runs then too."""

import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _interrupt)
