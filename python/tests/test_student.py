"""analysis/student.py gives scipy.stats.t's numbers, and no nvmflab command imports scipy.stats
(about a second of CPU per process; issue 41 item 6)."""

import subprocess
import sys

import numpy as np
from scipy.stats import t

from nvmflab.analysis import student


def test_quantiles_and_tails_match_scipy_stats_t():
    q = np.array([0.0, 0.5, 0.8, 0.9, 0.975, 0.995, 0.99995, 1.0])
    x = np.array([0.0, 0.3, 1.96, 4.0, 40.0, np.inf])
    for df in (1, 2, 3.5, 9, 30, 1e6, np.inf, 0, -1, np.nan):
        np.testing.assert_allclose(student.ppf(q, df), t.ppf(q, df), rtol=1e-12, equal_nan=True)
        np.testing.assert_allclose(student.sf(x, df), t.sf(x, df), rtol=1e-12, equal_nan=True)
    # broadcasting over degrees of freedom, and scalars stay scalars
    dofs = np.array([2.0, 5.0, 40.0])
    np.testing.assert_allclose(student.ppf(0.975, dofs), t.ppf(0.975, dofs), rtol=1e-12)
    assert np.ndim(student.ppf(0.975, 4)) == 0 and np.ndim(student.sf(2.0, 4)) == 0
    assert student.ppf(0.975, 4) == t.ppf(0.975, 4)


def test_commands_do_not_import_scipy_stats():
    code = ("import sys, nvmflab.cli, nvmflab.studies.common, nvmflab.report, nvmflab.compare, nvmflab.gate; "
            "print(sorted(m for m in sys.modules if m.startswith('scipy.stats')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
