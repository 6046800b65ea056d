"""Analysis of a results store: statistics over repeats, the studies' formulas and findings.

One module per job: `stats` (repeats, confidence intervals, histogram percentiles), `formulas`
(the ratios the studies define), `plateau` (saturation point rule), and one module per study
(`polling`, `overhead`, `saturation`, `interference`) whose `analyze()` turns measurements into
tables, figures and findings. Nothing here runs experiments or writes files.
"""
