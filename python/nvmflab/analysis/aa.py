"""The A/A check of the decision rules (`analysis/decide.py`): how often each declares a difference
that is not there, and how often it finds one that is.

Every rule is fed synthetic repeats drawn from one distribution (normal, skewed log-normal, and
normal with one-sided outliers), at the repeat counts the quick (1, 2 for stacks) and full (auto:
3 to 10) specs use, TRIALS times with a fixed seed. The false-positive rate is the share of those
trials in which the rule declares a difference, a winner, a safe load at the limit or a limiting
side. The detection rate is the share of trials in which it finds a true effect of 1, 2 or 4
standard deviations of one repeat (the right winner, where it picks one).

`python -m nvmflab.analysis.aa` prints the table docs/analysis.md carries between its markers;
`--write FILE` replaces it there, `--check FILE` fails when the two disagree (a test does too).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import decide
from .device_model import CONVERGED_SHARE

TRIALS = 2000
SEED = 20261126
REPEATS = (1, 2, 3, 5, 10)
EFFECTS = (1, 2, 4)
DISTRIBUTIONS = ("normal", "log-normal", "outliers")
MEAN, SD = 100.0, 10.0
LIMIT = 2.0  # the interference latency limit (× isolated) the safe-load rule is checked at
CONVERGED = CONVERGED_SHARE  # overhead's device comparison: NVMe/TCP at this share of local access is "converged"
# A bandwidth counted in whole I/Os over a window moves in steps; the counted rows take a step of one
# sd of a repeat, where equal repeats are common and yet the noise is real.
STEP = SD
BEGIN, END = "<!-- aa-rates:begin -->", "<!-- aa-rates:end -->"


def draw(rng: np.random.Generator, dist: str, shape: tuple[int, ...]) -> tuple[np.ndarray, float]:
    """(samples, standard deviation of one repeat) of one distribution, mean MEAN."""
    if dist == "normal":
        return rng.normal(MEAN, SD, shape), SD
    if dist == "log-normal":
        sigma = 0.5  # strongly right-skewed, shifted and scaled to mean MEAN and sd SD
        m = np.exp(sigma ** 2 / 2)
        s = np.sqrt((np.exp(sigma ** 2) - 1) * np.exp(sigma ** 2))
        return MEAN + SD * (np.exp(sigma * rng.standard_normal(shape)) - m) / s, SD
    if dist == "outliers":
        share, jump = 0.1, 6 * SD  # one repeat in ten is a spike six sd high
        spikes = rng.random(shape) < share
        values = rng.normal(MEAN, SD, shape) + spikes * jump - share * jump
        return values, float(np.sqrt(SD ** 2 + share * (1 - share) * jump ** 2))
    raise ValueError(dist)


@dataclass(frozen=True)
class Rule:
    name: str
    used_by: str
    # (rng, dist, n, effect in sd) -> share of trials that declared (effect 0) or found (effect > 0)
    rate: Callable[[np.random.Generator, str, int, float], float]


def _difference(rng, dist, n, k):
    a, sd = draw(rng, dist, (TRIALS, n))
    b, _ = draw(rng, dist, (TRIALS, n))
    b = b + k * sd
    _, _, p, _ = decide.welch(a, b)
    found = decide.clear(p)
    return float(found.mean() if k == 0 else (found & (b.mean(-1) > a.mean(-1))).mean())


def _family(m):
    def rate(rng, dist, n, k):
        a, sd = draw(rng, dist, (TRIALS, m, n))
        b, _ = draw(rng, dist, (TRIALS, m, n))
        b[:, 0] += k * sd  # the effect in the first member of the family only
        _, _, p, _ = decide.welch(a, b)
        rejected = decide.holm(p)
        return float(rejected.any(-1).mean() if k == 0 else rejected[:, 0].mean())
    return rate


def _idle_poll(rng, dist, n, k):
    base, sd = draw(rng, dist, (TRIALS, n))
    cands, _ = draw(rng, dist, (TRIALS, 5, n))
    cands[:, 3] -= k * sd  # 40 µs of 10, 20, 40, 80, 160 lowers p99
    pick = decide.pick_shortest(base, cands, lower_is_better=True)
    return float((pick >= 0).mean() if k == 0 else (pick == 3).mean())


def _target_cores(rng, dist, n, k):
    configs, sd = draw(rng, dist, (TRIALS, 4, n))
    configs[:, 1:] += k * sd  # two or more cores give more IOPS than one
    pick = decide.fewest_not_below(configs, higher_is_better=True)
    return float((pick != 0).mean() if k == 0 else (pick == 1).mean())


def _pairwise(rng, dist, n, k):
    stacks, sd = draw(rng, dist, (TRIALS, 3, n))
    stacks[:, 2] += k * sd  # one of three stacks is faster
    _, _, _, clear, pairs = decide.pairwise(stacks)
    if k == 0:
        return float(clear.any(-1).mean())
    # the finding reads best against worst: found when the faster one is ranked best and clear
    means = stacks.mean(-1)
    best, worst = means.argmax(-1), means.argmin(-1)
    index = {pair: i for i, pair in enumerate(pairs)}
    col = np.array([index[(min(w, b), max(w, b))] for b, w in zip(best, worst)])
    return float(((best == 2) & clear[np.arange(TRIALS), col]).mean())


def _matched_local(rng, dist, n, k):
    local, _ = draw(rng, dist, (TRIALS, n))
    remote, sd = draw(rng, dist, (TRIALS, n))
    remote = remote + k * sd  # true ratio 1 at k = 0: not matched (the rule asks for the whole interval at or above 1)
    _, low, _ = decide.fieller(local, remote)
    return float((decide.safe_upto(low[:, None], 1.0, higher_is_worse=False) >= 0).mean())


def _best_of_four(rng, dist, n, k):
    configs, sd = draw(rng, dist, (TRIALS, 4, n))
    configs[:, 2] -= k * sd  # one of four combinations has the lower p99
    pick = decide.pick_best(configs, higher_is_better=False)
    return float((pick >= 0).mean() if k == 0 else (pick == 2).mean())


def _safe_load(rng, dist, n, k):
    base, _ = draw(rng, dist, (TRIALS, n))
    loaded, sd = draw(rng, dist, (TRIALS, n))
    loaded = LIMIT * loaded - k * LIMIT * sd  # true ratio LIMIT at k = 0: not safe
    _, _, high = decide.fieller(base, loaded)
    safe = decide.safe_upto(high[:, None], LIMIT, higher_is_worse=True) >= 0
    return float(safe.mean())


def _converged_to_ceiling(rng, dist, n, k):
    remote, sd = draw(rng, dist, (TRIALS, n))
    remote = remote + k * sd  # true ratio to the ceiling CONVERGED at k = 0: not converged
    _, low, _ = decide.ratio_to_constant(remote, MEAN / CONVERGED)
    return float((decide.safe_upto(low[:, None], CONVERGED, higher_is_worse=False) >= 0).mean())


def counted(values: np.ndarray, rng: np.random.Generator, step: float) -> np.ndarray:
    """values as a whole number of steps, rounded up (the worst case for a false "converged"), on a
    grid placed at random against the true mean in each trial (where the counts fall is arbitrary)."""
    offset = rng.random(values.shape[:-1] + (1,)) * step
    return np.ceil((values - offset) / step) * step + offset


def _converged_to_ceiling_counted(rng, dist, n, k):
    remote, sd = draw(rng, dist, (TRIALS, n))
    remote = counted(remote + k * sd, rng, STEP)  # true ratio CONVERGED at k = 0, as counted I/Os
    _, low, _ = decide.ratio_to_constant(remote, MEAN / CONVERGED, resolution=STEP)
    return float((decide.safe_upto(low[:, None], CONVERGED, higher_is_worse=False) >= 0).mean())


def _converged_to_local(rng, dist, n, k):
    local, _ = draw(rng, dist, (TRIALS, n))
    remote, sd = draw(rng, dist, (TRIALS, n))
    remote = CONVERGED * remote + k * CONVERGED * sd  # true ratio CONVERGED at k = 0: not converged
    _, low, _ = decide.fieller(local, remote)
    return float((decide.safe_upto(low[:, None], CONVERGED, higher_is_worse=False) >= 0).mean())


RULES = (
    Rule("difference (Welch)", "every 'clear' / 'no significant difference' of one comparison: overhead, "
         "parallelism, dimensions, polling matrix, saturation order, contention_many's network app",
         _difference),
    Rule("two tests, Holm", "polling completion (p99, then peak IOPS); interference control (p99 and IOPS); "
         "stacks against the baseline with two other pairs; parallelism's tail at the lowest and highest QD", _family(2)),
    Rule("ten cells, Holm", "interference polling hypothesis; busy-poll per core count; contention cells; "
         "polling io_queues per QD", _family(10)),
    Rule("idle_poll_us pick", "polling: five periods against 0 µs, Holm, then the shortest not clearly "
         "worse than the best", _idle_poll),
    Rule("target_cores pick", "saturation: fewest of four core counts not clearly below the best, Holm; busy-poll "
         "and transports: cores to saturate by the same rule (`fewest_not_below`)", _target_cores),
    Rule("limiting side", "stacks: three stacks with the other side fixed, every pair, Holm; dimensions' "
         "fastest against slowest I/O pattern is read from the same every-pair family", _pairwise),
    Rule("safe load", f"interference guideline: Fieller's upper end below {LIMIT:g}× (true ratio at the limit "
         "for the false-positive rate, below it by k sd of one loaded repeat for detection)", _safe_load),
    Rule("converged to the device", f"overhead's device comparison: NVMe/TCP's bandwidth over the model device's "
         f"ceiling, its t interval's lower end at least {CONVERGED:g} (true ratio at {CONVERGED:g} for the "
         "false-positive rate, above it by k sd of one repeat for detection)", _converged_to_ceiling),
    Rule("converged to local", f"overhead's device comparison where local access stays below the device: "
         f"Fieller's lower end of NVMe/TCP / local at least {CONVERGED:g} (true ratio at {CONVERGED:g}, above it "
         "by k sd for detection)", _converged_to_local),
    # last, so the rows above keep their seeds (a rule's seed is its position)
    Rule("converged to the device, counted", "the same with the bandwidth counted in whole I/Os (a step of one sd "
         "of a repeat, rounded up): the interval widened by one step, equal repeats judged by that step from "
         f"{decide.MIN_TIED_REPEATS} repeats on", _converged_to_ceiling_counted),
    Rule("best of four pick", "polling matrix: the lowest p99 of the four completion × target_mode combinations; "
         "dimensions: the highest bandwidth among the I/O patterns (`pick_best`: the best mean only when clearly "
         "better than every other, Holm over the k − 1 comparisons with it)", _best_of_four),
    Rule("three tests, Holm", "busy-poll: busy polling only, placement only and both, each against off", _family(3)),
    Rule("matched local", "dimensions: NVMe/TCP at a queue depth matched local QD1 when Fieller's lower end of "
         "IOPS(TCP, QD) / IOPS(local, QD1) is at least 1 (true ratio 1 for the false-positive rate, above it by k sd "
         "of one repeat for detection)", _matched_local),
)


def rates(trials_seed: int = SEED) -> dict[tuple[str, str, int, float], float]:
    """{(rule, distribution, repeats, effect sd): rate} for every rule, distribution, repeat count
    and effect (0 = the A/A false-positive rate)."""
    out = {}
    for r_index, rule in enumerate(RULES):
        for d_index, dist in enumerate(DISTRIBUTIONS):
            for n in REPEATS:
                for k in (0,) + EFFECTS:
                    rng = np.random.default_rng([trials_seed, r_index, d_index, n, int(k)])
                    out[(rule.name, dist, n, k)] = rule.rate(rng, dist, n, float(k))
    return out


def table(measured: dict | None = None) -> str:
    """The markdown table docs/analysis.md carries: per rule and repeat count, the false-positive
    rate and the detection rates per distribution."""
    measured = measured or rates()
    dists = " / ".join(DISTRIBUTIONS)
    lines = [f"{TRIALS} trials per cell, seed {SEED}; each cell reads {dists}.", "",
             "| decision | repeats | A/A: declared a difference | found 1 sd | found 2 sd | found 4 sd |",
             "|---|---|---|---|---|---|"]
    for rule in RULES:
        for n in REPEATS:
            cells = [" / ".join(f"{100 * measured[(rule.name, d, n, k)]:.1f}" for d in DISTRIBUTIONS)
                     for k in (0,) + EFFECTS]
            lines.append(f"| {rule.name} | {n} | " + " | ".join(f"{c} %" for c in cells) + " |")
    lines += ["", "Where each decision is used:", ""]
    lines += [f"- **{rule.name}**: {rule.used_by}." for rule in RULES]
    return "\n".join(lines)


def embedded(doc: str) -> str:
    """The table between the markers of a document ('' when the markers are missing)."""
    if BEGIN not in doc or END not in doc:
        return ""
    return doc.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", type=Path, help="replace the table between the markers in this file")
    parser.add_argument("--check", type=Path, help="fail when this file's table differs from a fresh one")
    args = parser.parse_args(argv)
    text = table()
    if args.write:
        doc = args.write.read_text()
        if BEGIN not in doc or END not in doc:
            print(f"{args.write}: no {BEGIN} ... {END} markers", file=sys.stderr)
            return 1
        head, rest = doc.split(BEGIN, 1)
        args.write.write_text(f"{head}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}")
    elif args.check:
        if embedded(args.check.read_text()) != text.strip():
            print(f"{args.check}: the A/A table differs from `python -m nvmflab.analysis.aa`", file=sys.stderr)
            return 1
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
