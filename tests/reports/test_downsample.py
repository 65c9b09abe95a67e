"""Display downsampling keeps every bucket's extremes and stays within its point budget."""

from __future__ import annotations

import itertools

import numpy as np

from reports.downsample import cdf_points, decimate_rows


def test_short_series_are_kept_whole() -> None:
    x = np.arange(100.0)
    assert decimate_rows(x, [x], max_buckets=50).tolist() == list(range(100))


def test_decimation_keeps_each_bucket_extremes_of_every_series() -> None:
    rng = np.random.default_rng(1)
    n, buckets = 100_000, 100
    x = np.sort(rng.uniform(0, 50, n))
    a, b = rng.normal(size=n), rng.normal(size=n)
    a[777] = np.nan
    keep = decimate_rows(x, [a, b], max_buckets=buckets)
    assert np.all(np.diff(keep) > 0)
    assert len(keep) <= 4 * buckets + 2
    assert keep[0] == 0 and keep[-1] == n - 1
    edges = np.linspace(x[0], x[-1], buckets + 1)
    for lo, hi in itertools.pairwise(edges):
        inside = np.flatnonzero((x >= lo) & (x < hi))
        kept = np.intersect1d(inside, keep)
        for series in (a, b):
            assert np.nanmax(series[kept]) == np.nanmax(series[inside])
            assert np.nanmin(series[kept]) == np.nanmin(series[inside])


def test_decimation_with_all_rows_at_one_time() -> None:
    x = np.zeros(10_000)
    y = np.arange(10_000.0)
    keep = decimate_rows(x, [y], max_buckets=10)
    assert 0 in keep and 9_999 in keep and len(keep) <= 22


def test_cdf_points_include_both_ends_and_respect_the_budget() -> None:
    values = np.random.default_rng(2).exponential(size=50_001)
    values[5] = np.nan
    x, share = cdf_points(values, max_points=1000)
    assert len(x) <= 1000
    assert x[0] == np.nanmin(values) and x[-1] == np.nanmax(values)
    assert share[-1] == 1.0 and np.all(np.diff(x) >= 0) and np.all(np.diff(share) > 0)


def test_cdf_of_nothing_is_empty() -> None:
    x, share = cdf_points([np.nan])
    assert x.size == 0 and share.size == 0
