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

_M0, _M1 = np.uint64(0xD2E7470EE14C6C93), np.uint64(0xCA5A826395121157)
_W0, _W1 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBB67AE8584CAA73B)
_LOW = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)
ROUNDS = 10


def _wide_product(multiplier: np.uint64, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(high, low)`` 64-bit words of the 128-bit product ``multiplier · x``, from four 32 × 32-bit products."""
    m_high, m_low = multiplier >> _32, multiplier & _LOW
    x_high, x_low = x >> _32, x & _LOW
    low_low, low_high, high_low = m_low * x_low, m_low * x_high, m_high * x_low
    middle = (low_low >> _32) + (low_high & _LOW) + (high_low & _LOW)  # < 3 · 2³², no overflow
    high = m_high * x_high + (low_high >> _32) + (high_low >> _32) + (middle >> _32)
    return high, multiplier * x


def philox4x64(key: tuple[np.ndarray, np.ndarray], counter: tuple[np.ndarray, ...]) -> np.ndarray:
    """``(n, 4)`` uint64: the blocks of ``key = (k0, k1)`` at ``counter = (c0, c1, c2, c3)``, each an array or
    scalar that broadcasts to ``n`` (uint64 values)."""
    k0, k1 = (np.asarray(word, np.uint64) for word in key)
    c0, c1, c2, c3 = np.broadcast_arrays(*(np.asarray(word, np.uint64) for word in counter))
    with np.errstate(over="ignore"):
        for round_ in range(ROUNDS):
            if round_:
                k0, k1 = k0 + _W0, k1 + _W1
            high0, low0 = _wide_product(_M0, c0)
            high1, low1 = _wide_product(_M1, c2)
            c0, c1, c2, c3 = high1 ^ c1 ^ k0, low1, high0 ^ c3 ^ k1, low0
    return np.stack(np.broadcast_arrays(c0, c1, c2, c3), axis=-1)


def stream_words(key0: int, key1: np.ndarray, stream: np.ndarray | int, counts: np.ndarray) -> np.ndarray:
    """Words ``0 .. counts[i] − 1`` of stream ``stream[i]`` under key ``(key0, key1[i])`` for every ``i``, back to
    back in ``i``'s order (``key1``, ``stream`` and ``counts`` broadcast): word ``w`` is lane ``w mod 4`` of the
    block at counter ``(w div 4, stream, 0, 0)``. One call for many requests costs about what one request does."""
    key1, stream, counts = np.broadcast_arrays(np.asarray(key1, np.uint64), np.asarray(stream, np.uint64),
                                               np.asarray(counts, np.int64))
    blocks = (counts + 3) // 4
    owner = np.repeat(np.arange(counts.size), blocks)
    block = np.arange(owner.size) - np.repeat(np.cumsum(blocks) - blocks, blocks)
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
