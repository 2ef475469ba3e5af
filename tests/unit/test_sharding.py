import math

import numpy as np
import pytest

from elastictrain.errors import ConfigError
from elastictrain.model import DatasetSpec
from elastictrain.sharding import permuted_indices


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 17, 1000, 4097, 100_003])
def test_each_epoch_is_a_permutation(n):
    for epoch in range(3):
        out = permuted_indices(n, seed=11, epoch=epoch, start=0, stop=n)
        assert np.array_equal(np.sort(out), np.arange(n))


def test_ranges_compose_and_epochs_differ():
    n = 10_000
    whole = permuted_indices(n, 5, 0, 0, n)
    pieces = np.concatenate([permuted_indices(n, 5, 0, a, min(a + 333, n)) for a in range(0, n, 333)])
    assert np.array_equal(whole, pieces)
    assert not np.array_equal(whole, permuted_indices(n, 5, 1, 0, n))
    assert not np.array_equal(whole, permuted_indices(n, 6, 0, 0, n))
    assert np.array_equal(whole, permuted_indices(n, 5, 0, 0, n))  # deterministic


def test_known_values_are_stable():
    # Workers and coordinators of different releases must agree: pin a few outputs.
    assert permuted_indices(10, 1, 0, 0, 10).tolist() == [1, 2, 6, 9, 3, 8, 4, 5, 7, 0]
    assert permuted_indices(10, 1, 1, 0, 10).tolist() == [1, 7, 9, 5, 4, 2, 8, 0, 6, 3]


def test_no_shuffle_is_identity():
    assert permuted_indices(7, 1, 3, 2, 6, shuffle=False).tolist() == [2, 3, 4, 5]


def test_shard_geometry():
    spec = DatasetSpec("d", num_samples=1050, shard_size=100, epochs=3)
    assert spec.shards_per_epoch == 11 and spec.total_shards == 33
    assert spec.shard_bounds(10) == (0, 1000, 1050)
    assert spec.shard_bounds(11) == (1, 0, 100)


@pytest.mark.parametrize("n, size, taper", [(1, 1, 2), (7, 10, 2), (100, 10, 8), (1001, 10, 3),
                                            (10_000, 500, 4), (1_000_000, 1000, 64), (10**6, 10**6, 1024)])
def test_shrinking_shards_partition_each_epoch(n, size, taper):
    spec = DatasetSpec("d", n, size, epochs=2, taper=taper)
    k = spec.shards_per_epoch
    bounds = [spec.shard_bounds(i) for i in range(spec.total_shards)]
    for e in range(2):
        mine = bounds[e * k:(e + 1) * k]
        assert {b[0] for b in mine} == {e}
        assert mine[0][1] == 0 and mine[-1][2] == n
        assert all(a[2] == b[1] for a, b in zip(mine, mine[1:]))  # contiguous: a partition
    sizes = [b - a for _, a, b in bounds[:k]]
    assert all(0 < s <= size for s in sizes)
    assert sizes == sorted(sizes, reverse=True)  # they only shrink
    smallest = -(-size // taper)
    assert all(s >= smallest for s in sizes[:-1])  # the last one takes the remainder
    tail = [s for s in sizes if s < size]
    assert len(tail) <= taper * (math.log(taper) + 2) + 1  # guided self-scheduling's count
    plain = DatasetSpec("d", n, size)
    head = [i for i, s in enumerate(sizes) if s == size and i < k - len(tail)]
    assert [spec.shard_bounds(i) for i in head] == [plain.shard_bounds(i) for i in head]


def test_a_tapered_epoch_ends_in_small_shards():
    spec = DatasetSpec("d", 10_000, 500, taper=4)
    sizes = [b - a for _, a, b in map(spec.shard_bounds, range(spec.shards_per_epoch))]
    assert sizes[:16] == [500] * 16  # the head is untouched
    assert sizes[-4:] == [125, 125, 125, 99]  # ceil(500 / 4) at the end, the rest last
    assert sum(sizes) == 10_000


@pytest.mark.parametrize("taper", [1, -1, 1025, 2.0, True])
def test_taper_is_checked(taper):
    with pytest.raises(ConfigError, match=r"taper must be 0 \(off\) or a whole number in \[2, 1024\]"):
        DatasetSpec("d", 10, 1, taper=taper)


@pytest.mark.parametrize("kwargs, word", [
    (dict(num_samples=0, shard_size=1), "num_samples"),
    (dict(num_samples=10, shard_size=0), "shard_size"),
    (dict(num_samples=10, shard_size=1, epochs=0), "epochs"),
    (dict(num_samples=10, shard_size=1, lease_ttl=0), "lease_ttl"),
])
def test_spec_validation_names_the_field(kwargs, word):
    with pytest.raises(ConfigError, match=word):
        DatasetSpec("d", **kwargs)


def test_bad_name():
    with pytest.raises(ConfigError, match="A-Za-z0-9"):
        DatasetSpec("../etc", 10, 1)
