import math

import pytest

from nvmflab.analysis.saturation import find_plateau, plateau_confirmed


def test_clean_plateau_returns_first_flat_point():
    loads = [1, 2, 4, 8, 16, 32]
    iops = [20, 40, 80, 120, 122, 121]
    assert find_plateau(loads, iops) == 3
    assert plateau_confirmed(loads, iops)


def test_dip_followed_by_rise_is_not_a_plateau():
    loads = [1, 2, 4, 8, 16]
    iops = [100, 95, 130, 131, 129]
    assert find_plateau(loads, iops) == 2


def test_small_noise_within_tolerance_stays_on_plateau():
    loads = [1, 2, 4, 8, 16, 32]
    iops = [50, 100, 103, 99, 104, 101]
    # 104 is within 5 % of 100, so the plateau starts at load 2.
    assert find_plateau(loads, iops, tolerance=0.05) == 1
    # With a 1 % tolerance the later 104 is a rise above 100 but not above 103.
    assert find_plateau(loads, iops, tolerance=0.01) == 2


def test_monotonic_rise_has_no_plateau_inside_the_sweep():
    loads = [1, 2, 4, 8]
    iops = [10, 20, 40, 80]
    assert find_plateau(loads, iops) == 3
    assert not plateau_confirmed(loads, iops)


def test_collapse_after_peak_picks_the_peak():
    assert find_plateau([1, 2, 4, 8], [10, 50, 30, 20]) == 1


def test_unsorted_loads_index_into_the_given_order():
    loads = [16, 1, 8, 4, 2]
    iops = [121, 20, 120, 80, 40]
    assert find_plateau(loads, iops) == 2


def test_failed_points_are_ignored():
    loads = [1, 2, 4, 8]
    iops = [10, math.nan, 40, None]
    assert find_plateau(loads, iops) == 2
    assert not plateau_confirmed(loads, iops)


def test_too_few_points():
    assert find_plateau([4], [7.0]) == 0
    assert not plateau_confirmed([4], [7.0])
    with pytest.raises(ValueError, match="no usable points"):
        find_plateau([], [])
    with pytest.raises(ValueError, match="no usable points"):
        find_plateau([1, 2], [math.nan, math.nan])


def test_bad_arguments():
    with pytest.raises(ValueError, match="differ in length"):
        find_plateau([1, 2], [1])
    with pytest.raises(ValueError, match="tolerance"):
        find_plateau([1, 2], [1, 2], tolerance=-0.1)
