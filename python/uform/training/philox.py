"""Philox4x64-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) for many keys and
counters at once.

A block is the function of a 128-bit key and a 256-bit counter that Random123 names ``philox4x64_10``:
ten rounds of

    (hi0, lo0) = M0 · c0,  (hi1, lo1) = M1 · c2           full 128-bit products
    (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)

with the key advanced by the Weyl constants (k0 += W0, k1 += W1, modulo 2⁶⁴) between rounds; its four
output words are the final counter. numpy's ``Philox`` bit generator computes the same blocks one key at
a time (``Philox(key=[k0, k1], counter=c).random_raw(4)`` is the block at counter ``c + 1``: numpy steps
the counter before each block). Here the keys and counters are arrays, so thousands of independent draws
cost a few hundred numpy operations, with no state between them.
"""

from __future__ import annotations

import numpy as np

from .arrays import group_entries

_MULTIPLIERS = np.array([[0xD2E7470EE14C6C93], [0xCA5A826395121157]], np.uint64)  # M0, M1: a column each
_WEYL = np.array([[0x9E3779B97F4A7C15], [0xBB67AE8584CAA73B]], np.uint64)  # W0, W1
_LOW = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)
ROUNDS = 10


def _wide_products(multipliers: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(high, low)`` 64-bit words of the 128-bit products ``multipliers · x`` element-wise, from four 32 × 32-bit
    products."""
    m_high, m_low = multipliers >> _32, multipliers & _LOW
    x_high, x_low = x >> _32, x & _LOW
    low_low, low_high, high_low = m_low * x_low, m_low * x_high, m_high * x_low
    middle = (low_low >> _32) + (low_high & _LOW) + (high_low & _LOW)  # < 3 · 2³², no overflow
    high = m_high * x_high + (low_high >> _32) + (high_low >> _32) + (middle >> _32)
    return high, multipliers * x


def philox4x64(key: tuple[np.ndarray, np.ndarray], counter: tuple[np.ndarray, ...]) -> np.ndarray:
    """``(n, 4)`` uint64: the blocks of ``key = (k0, k1)`` at ``counter = (c0, c1, c2, c3)``, each an array or
    scalar that broadcasts to ``n`` (uint64 values). The round's two products are one operation on the stacked
    (c0, c2), and its xors one on the stacked (c1, c3) and (k0, k1)."""
    words = np.broadcast_arrays(*(np.atleast_1d(np.asarray(word, np.uint64)) for word in (*counter, *key)))
    multiplied = np.stack(words[0:4:2])  # (c0, c2)
    passed = np.stack(words[1:4:2])  # (c1, c3)
    key = np.stack(words[4:6])  # (k0, k1)
    with np.errstate(over="ignore"):
        for round_ in range(ROUNDS):
            if round_:
                key = key + _WEYL
            high, low = _wide_products(_MULTIPLIERS, multiplied)
            # (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
            multiplied, passed = high[::-1] ^ passed ^ key, low[::-1]
    return np.stack([multiplied[0], passed[0], multiplied[1], passed[1]], axis=-1)


def stream_words(key0: int, key1: np.ndarray, stream: np.ndarray | int, counts: np.ndarray) -> np.ndarray:
    """Words ``0 .. counts[i] − 1`` of stream ``stream[i]`` under key ``(key0, key1[i])`` for every ``i``, back to
    back in ``i``'s order (``key1``, ``stream`` and ``counts`` broadcast): word ``w`` is lane ``w mod 4`` of the
    block at counter ``(w div 4, stream, 0, 0)``. One call for many requests costs about what one request does."""
    key1, stream, counts = np.broadcast_arrays(np.asarray(key1, np.uint64), np.asarray(stream, np.uint64),
                                               np.asarray(counts, np.int64))
    _, owner, block = group_entries((counts + 3) // 4)  # each request's whole blocks
    words = philox4x64((np.uint64(key0), key1[owner]), (block.astype(np.uint64), stream[owner], 0, 0))
    # keep each request's first counts[i] words of its whole blocks
    return words[np.arange(4) < (counts[owner] - 4 * block)[:, None]]


def uniforms(words: np.ndarray) -> np.ndarray:
    """float64 in [0, 1) from each word's top 53 bits, exactly ``(word >> 11) · 2⁻⁵³`` (numpy's ``random``)."""
    return (words >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def below(words: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """int64 in ``[0, bounds)`` from each word's top 32 bits: ``(word >> 32) · bound >> 32``, for bounds up to
    2³² (each value's chance within ``bound`` / 2³² of uniform)."""
    return ((words >> _32) * np.asarray(bounds, np.uint64) >> _32).astype(np.int64)
