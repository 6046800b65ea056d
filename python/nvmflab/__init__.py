"""nvmflab: NVMe-over-Fabrics performance laboratory (harness, results store, studies).

`nvmflab.load("results/quick")` gives a results directory as one tidy pandas DataFrame
(docs/notebook.md).
"""

__version__ = "0.1.0"


def load(results_dir, blobs: bool = False):
    """One row per point, role and repeat; every knob a column; units in the names (nvmflab.frame)."""
    from .frame import load as _load  # pandas only when asked: the CLI starts without it

    return _load(results_dir, blobs)
