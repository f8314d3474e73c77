"""learning_rate at the steps that define it."""

import math

import numpy as np
import pytest

from uform.training import ErrorCode, Schedule, UFormError, learning_rate

SCHEDULE = Schedule(steps=1000)  # peak 5e-4, floor 1e-5, warmup 100


@pytest.mark.parametrize("step, expected", [
    (1, 5e-4 / 100),
    (50, 2.5e-4),
    (100, 5e-4),
    (550, 1e-5 + 0.5 * (5e-4 - 1e-5)),
    (325, 1e-5 + 0.5 * (5e-4 - 1e-5) * (1 + math.cos(math.pi * 0.25))),
    (1000, 1e-5),
    (1001, 1e-5),
    (50_000, 1e-5),
])
def test_key_steps(step, expected):
    assert learning_rate(SCHEDULE, step) == pytest.approx(expected, rel=1e-12)


def test_the_cosine_starts_just_below_the_peak_and_falls_monotonically():
    rates = learning_rate(SCHEDULE, np.arange(100, 1001))
    assert rates[1] < rates[0] == pytest.approx(5e-4)
    assert np.all(np.diff(rates) <= 0)


def test_arrays_agree_with_scalars():
    steps = np.arange(1, 1200, 37)
    np.testing.assert_allclose(learning_rate(SCHEDULE, steps), [learning_rate(SCHEDULE, int(s)) for s in steps])


def test_given_fields_and_no_warmup():
    schedule = Schedule(learning_rate=1e-3, min_learning_rate=1e-4, warmup_steps=0, steps=5)  # warmup derives 0
    assert learning_rate(schedule, 1) == pytest.approx(1e-4 + 0.5 * 9e-4 * (1 + math.cos(math.pi / 5)))
    assert learning_rate(schedule, 5) == pytest.approx(1e-4)
    assert learning_rate(Schedule(learning_rate=1e-3, warmup_steps=10, steps=10), 10) == pytest.approx(1e-3)
    assert learning_rate(Schedule(learning_rate=1e-3, warmup_steps=10, steps=10), 11) == pytest.approx(1e-5)


@pytest.mark.parametrize("step", [0, -3, 1.5])
def test_steps_count_from_one(step):
    with pytest.raises(UFormError) as error:
        learning_rate(SCHEDULE, step)
    assert error.value.code == ErrorCode.INVALID_ARGUMENT
    assert str(error.value).startswith("step:")
