"""Student's t distribution: the quantile (`ppf`) and survival (`sf`) functions the intervals and
tests use, from scipy.special rather than scipy.stats.

They are the functions `scipy.stats.t` itself calls (`stdtrit`, `stdtr`), so the numbers are the
same (test_student.py compares them), but importing scipy.stats costs about a second of CPU per
process (it builds every distribution and their docstrings), and every nvmflab command that plans,
runs, compares or reports would pay it."""

from __future__ import annotations

import numpy as np
from scipy.special import stdtr, stdtrit


def ppf(q, df):
    """The q quantile with df degrees of freedom (NaN where df <= 0 or NaN), like scipy.stats.t.ppf."""
    q, df = np.asarray(q, dtype=float), np.asarray(df, dtype=float)
    out = np.where((q == 0) & (df > 0), -np.inf, stdtrit(df, q))  # stdtrit answers +inf at q = 0
    return out[()]


def sf(x, df):
    """P(T > x) with df degrees of freedom, like scipy.stats.t.sf."""
    return np.asarray(stdtr(df, -np.asarray(x, dtype=float)))[()]
