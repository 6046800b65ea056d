"""nvmflab: NVMe-over-Fabrics performance laboratory (harness, results store, studies)."""

__version__ = "0.1.0"
