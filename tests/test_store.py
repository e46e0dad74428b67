from __future__ import annotations

import math
import random
import tracemalloc

import pytest

from driftwatch.runtime.store import (
    DEFAULT_TIERS,
    Ring,
    SeriesHistory,
    Store,
    Tier,
    TierSpec,
    cascade,
)
from driftwatch.series import Sample


def test_ring_keeps_the_newest_rows_in_order() -> None:
    ring = Ring(3, 2)
    for i in range(5):
        ring.append(i, i * 10)
    assert len(ring) == 3
    assert ring.column(0) == [2, 3, 4]
    assert ring.column(1) == [20, 30, 40]
    assert ring.last(2, 0) == [3, 4]
    assert ring.last(10, 1) == [20, 30, 40]


def test_ring_last_before_it_is_full() -> None:
    ring = Ring(5, 1)
    ring.append(1.0)
    ring.append(2.0)
    assert ring.last(1, 0) == [2.0]
    assert ring.last(5, 0) == [1.0, 2.0]


def test_ring_rows_and_pairs_read_as_the_columns_do_across_the_wrap() -> None:
    pairs, rows = Ring(4, 2), Ring(4, 2)
    for i in range(7):  # wrapped: the newest rows sit at both ends of the columns
        pairs.append_pair(i, i * 10)
        rows.append(i, i * 10)
        for count in range(6):
            expected = list(zip(rows.last(count, 0), rows.last(count, 1), strict=True))
            assert rows.last_rows(count) == expected
            assert pairs.last_rows(count) == expected
    assert rows.last_rows(3) == [(4.0, 40.0), (5.0, 50.0), (6.0, 60.0)]
    assert Ring(3, 2).last_rows(2) == []


def test_ring_rejects_zero_capacity() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Ring(0, 1)


def test_tier_aggregates_buckets_and_skips_nonfinite_values() -> None:
    tier = Tier(TierSpec(10.0, 100))
    for t, value in [(0, 1.0), (5, 3.0), (9, math.nan), (12, 10.0), (25, math.inf)]:
        tier.add(t, value)
    tier.flush()
    starts, counts, means, mins, maxes, lasts = (tier.rows.column(i) for i in range(6))
    assert starts == [0, 10, 20]
    assert counts == [2, 1, 0]
    assert means[:2] == [2.0, 10.0]
    assert mins[:2] == [1.0, 10.0]
    assert maxes[:2] == [3.0, 10.0]
    assert math.isnan(lasts[0])  # the newest value, even if not finite
    assert math.isnan(means[2])
    assert lasts[2] == math.inf


def test_tier_folds_a_backwards_clock_into_the_open_bucket() -> None:
    tier = Tier(TierSpec(10.0, 100))
    tier.add(100, 1.0)
    tier.add(50, 3.0)  # clock stepped back
    tier.flush()
    assert tier.rows.column(0) == [100]
    assert tier.rows.column(1) == [2]


def _same_bucket(got: tuple[float, ...] | None, want: tuple[float, ...] | None) -> bool:
    if got is None or want is None:
        return got is want
    return all(
        (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12)
        for a, b in zip(got, want, strict=True)
    )


@pytest.mark.parametrize("seed", range(6))
def test_cascaded_tiers_build_the_buckets_each_tier_would_build_alone(seed: int) -> None:
    rng = random.Random(seed)
    specs = [TierSpec(10.0, 50), TierSpec(60.0, 20), TierSpec(600.0, 5)]
    cascaded, alone = cascade(specs), [Tier(spec) for spec in specs]
    t = 1_700_000_003.0
    for _ in range(3000):
        # steady ticks, gaps of minutes, a clock stepped back now and then; odd values
        t += rng.choice([0.5, 2.0, 2.0, 7.0, 45.0, 400.0, -30.0])
        value = rng.choice([rng.uniform(-5, 5), rng.uniform(0, 1e9), math.nan, math.inf])
        cascaded[0].add(t, value)
        for tier in alone:
            tier.add(t, value)
        for got, want in zip(cascaded, alone, strict=True):
            assert got.closed == want.closed
            assert _same_bucket(got.open_bucket(), want.open_bucket())
    for got, want in zip(cascaded, alone, strict=True):
        rows = got.rows.last_rows(len(got.rows))
        assert len(rows) == len(want.rows) > 0
        assert all(map(_same_bucket, rows, want.rows.last_rows(len(want.rows))))
    cascaded[-1].flush()
    for tier in alone:
        tier.flush()
    assert [tier.closed for tier in cascaded] == [tier.closed for tier in alone]


def test_a_tier_is_built_only_on_one_whose_width_divides_its_own() -> None:
    assert [tier.width for tier in cascade(DEFAULT_TIERS)] == [10.0, 60.0, 600.0]
    with pytest.raises(ValueError, match="whole multiple"):
        cascade([TierSpec(10.0, 10), TierSpec(25.0, 10)])


def test_history_tracks_first_peak_and_count_for_the_whole_run() -> None:
    history = SeriesHistory(4, [TierSpec(60, 10)])
    for t, value in enumerate([5.0, 9.0, math.nan, 7.0, 1.0, 2.0]):
        history.add(float(t), value)
    assert history.first == (0.0, 5.0)
    assert history.peak == 9.0
    assert history.count == 6
    assert history.latest() == (5.0, 2.0)
    assert history.recent_median(4) == 2.0  # of 7, 1, 2 (NaN skipped)


def test_recent_median_of_nothing_is_nan() -> None:
    history = SeriesHistory(4, [])
    assert history.latest() is None
    assert math.isnan(history.recent_median(10))


def test_store_memory_is_bounded_however_long_the_run() -> None:
    store = Store(raw_capacity=256, tiers=[TierSpec(10, 64), TierSpec(60, 64)])

    def feed(start: int, count: int) -> None:
        for i in range(start, start + count):
            store.add(Sample("rss_bytes", float(i), float(i)))

    feed(0, 50_000)  # every ring is full from here on
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    feed(50_000, 200_000)
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    history = store.get(("rss_bytes", ()))
    assert history is not None
    assert len(history.raw) == 256
    assert all(len(tier.rows) == 64 for tier in history.tiers)
    assert grown < 64 * 1024, f"store grew by {grown} bytes while its rings were full"


def test_store_keys_series_by_name_and_labels() -> None:
    store = Store()
    store.add(Sample("gpu_process_memory_bytes", 1.0, 0.0, (("gpu", "0"),)))
    store.add(Sample("gpu_process_memory_bytes", 2.0, 0.0, (("gpu", "1"),)))
    assert sorted(labels for (_, labels), _ in store) == [(("gpu", "0"),), (("gpu", "1"),)]
    gpu1 = store.get(("gpu_process_memory_bytes", (("gpu", "1"),)))
    assert gpu1 is not None
    assert gpu1.latest() == (0.0, 2.0)


def test_tier_hands_out_closed_buckets_once_and_the_open_one_as_it_stands() -> None:
    tier = Tier(TierSpec(10.0, 3))
    assert tier.open_bucket() is None
    for t in (1, 2, 11, 25, 31, 42):
        tier.add(t, float(t))
    assert tier.closed == 4
    assert tier.open_bucket() == (40.0, 1.0, 42.0, 42.0, 42.0, 42.0)
    assert [row[0] for row in tier.closed_since(2)] == [20.0, 30.0]
    assert tier.closed_since(4) == []
    # The ring keeps 3: a reader that fell further behind gets what is left, in order.
    assert [row[0] for row in tier.closed_since(0)] == [10.0, 20.0, 30.0]
    assert tier.closed_since(0)[0] == (10.0, 1.0, 11.0, 11.0, 11.0, 11.0)
