"""Deterministic per-epoch permutations of sample indices, without materializing them.

Both the coordinator and every worker must agree on which sample sits at position
``p`` of epoch ``e``. A stored permutation costs 8 bytes a sample and a seeded
``shuffle`` is not promised stable across library versions, so we use a keyed
Feistel network over the smallest power-of-four domain that covers ``n`` and
cycle-walk values that land outside ``[0, n)``. It is a bijection for every
``(n, seed, epoch)``, costs O(1) memory, and maps any position range independently.
"""

from __future__ import annotations

import numpy as np

__all__ = ["permuted_indices"]

_ROUNDS = 4
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a fast, well-distributed 64-bit hash (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _mix_int(x: int) -> int:
    """The same finalizer on a Python int (used for the few round keys)."""
    m = 0xFFFFFFFFFFFFFFFF
    x &= m
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & m
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def _round_keys(seed: int, epoch: int) -> list[np.uint64]:
    state = _mix_int(seed ^ _mix_int(epoch + 0x9E3779B97F4A7C15))
    keys = []
    for r in range(_ROUNDS):
        state = _mix_int(state + 0x9E3779B97F4A7C15 * (r + 1))
        keys.append(np.uint64(state))
    return keys


def _feistel(x: np.ndarray, half_bits: int, keys: list[np.uint64]) -> np.ndarray:
    mask = np.uint64((1 << half_bits) - 1)
    shift = np.uint64(half_bits)
    left, right = x >> shift, x & mask
    for key in keys:
        left, right = right, left ^ (_mix(right ^ key) & mask)
    return (left << shift) | right


def permuted_indices(num_samples: int, seed: int, epoch: int, start: int, stop: int,
                     shuffle: bool = True) -> np.ndarray:
    """Sample indices at permutation positions ``[start, stop)`` of ``epoch``.

    Returns an ``int64`` array. With ``shuffle=False`` the permutation is the identity.
    """
    if not 0 <= start <= stop <= num_samples:
        raise ValueError(f"positions [{start}, {stop}) outside [0, {num_samples})")
    pos = np.arange(start, stop, dtype=np.uint64)
    if not shuffle or num_samples <= 1:
        return pos.astype(np.int64)
    bits = max(2, (num_samples - 1).bit_length())
    bits += bits & 1  # even, so both halves have the same width
    keys = _round_keys(seed, epoch)
    out = _feistel(pos, bits // 2, keys)
    limit = np.uint64(num_samples)
    outside = out >= limit
    while outside.any():  # cycle-walk: re-encrypt until inside [0, n); terminates since it is a bijection
        out[outside] = _feistel(out[outside], bits // 2, keys)
        outside = out >= limit
    return out.astype(np.int64)
