#!/usr/bin/env python3
"""What a host and a target put on the wire: the busiest NVMe/TCP connection of a loopback capture
(nvmfbench/wire.py), as JSON: digests and MAXH2CDATA from the handshake, PDUs per command by
direction, in-capsule, H2CData, C2HData and R2T sizes, segments per command.

Usage: tcpdump -i lo -s 0 -B 262144 -c 20000 -w run.pcap 'tcp port 4420' &   (before the host connects)
       bench/wire.py run.pcap"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nvmfbench.wire import WireError, summarize_capture  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("capture", type=Path, help="a pcap file from tcpdump -w")
    args = parser.parse_args(argv)
    try:
        summary = summarize_capture(args.capture.read_bytes())
    except (OSError, WireError) as err:
        print(f"wire: {args.capture}: {err}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
