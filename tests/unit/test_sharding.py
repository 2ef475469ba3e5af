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
