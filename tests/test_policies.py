"""BackoffPolicy arithmetic, RestartPolicy and RestartLimit values, the restart window and
the retry budget rule: pure, synchronous tests."""

from __future__ import annotations

import math
import random
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_taskvisor import BackoffPolicy, ConfigError, Jitter, RestartLimit, RestartPolicy

from helpers import RestartWindow, retry_budget_spent

SAFETY_FLOOR = 0.001
HUGE_N = 10**400  # too large even to convert to a float

durations = st.floats(min_value=0.0, max_value=1e300, allow_nan=False, allow_infinity=False)
factors = st.floats(min_value=1.0, max_value=1e6, allow_nan=False, allow_infinity=False)
retry_indices = st.one_of(
    st.integers(min_value=0, max_value=64),
    st.integers(min_value=0, max_value=10**6),
    st.just(HUGE_N),
)
seeds = st.integers(min_value=0, max_value=2**32)


@st.composite
def policies(draw: st.DrawFn, jitter: Jitter | None = None) -> BackoffPolicy:
    first = draw(durations)
    max_ = draw(st.floats(min_value=first, max_value=1e300, allow_infinity=False))
    return BackoffPolicy(
        first=first,
        max=max_,
        factor=draw(factors),
        jitter=draw(st.sampled_from(Jitter)) if jitter is None else jitter,
        floor=draw(st.one_of(st.just(0.0), durations)),
    )


def base_of(policy: BackoffPolicy, n: int) -> float:
    """Return the documented base delay: min(first * factor**n, max), overflow -> max."""
    if policy.first == 0.0 or policy.factor == 1.0:
        return policy.first
    try:
        return min(policy.first * policy.factor**n, policy.max)
    except OverflowError:
        return policy.max


def plain_delay(policy: BackoffPolicy, n: int) -> float:
    """Return the delay of ``policy`` for retry ``n`` without jitter or floor."""
    return attrs.evolve(policy, jitter=Jitter.NONE, floor=0.0).delay_for_retry(n, random.Random(0))


def floored(policy: BackoffPolicy, value: float) -> float:
    return max(value, policy.floor, SAFETY_FLOOR)


# -- BackoffPolicy: construction -------------------------------------------------------


def test_backoff_defaults_match_design() -> None:
    """The default policy is first=0.2, max=30, factor=2, EQUAL jitter, no floor."""
    assert BackoffPolicy() == BackoffPolicy(
        first=0.2, max=30.0, factor=2.0, jitter=Jitter.EQUAL, floor=0.0
    )


def test_backoff_field_order_is_positional() -> None:
    """Positional arguments follow the order first, max, factor, jitter, floor."""
    policy = BackoffPolicy(1.0, 10.0, 3.0, Jitter.FULL, 0.5)
    assert (policy.first, policy.max, policy.factor, policy.jitter, policy.floor) == (
        1.0,
        10.0,
        3.0,
        Jitter.FULL,
        0.5,
    )


def test_backoff_converts_ints_to_floats() -> None:
    """Int durations and factors are stored as floats."""
    policy = BackoffPolicy(first=1, max=10, factor=2, floor=1)
    assert [type(v) for v in (policy.first, policy.max, policy.factor, policy.floor)] == [float] * 4


def test_backoff_normalises_negative_zero() -> None:
    """``-0.0`` is accepted and stored as ``0.0``."""
    policy = BackoffPolicy(first=-0.0, floor=-0.0)
    assert math.copysign(1.0, policy.first) == 1.0
    assert math.copysign(1.0, policy.floor) == 1.0


def test_backoff_is_frozen() -> None:
    """A BackoffPolicy cannot be mutated."""
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        BackoffPolicy().first = 1.0  # type: ignore[misc]


def test_backoff_compares_and_hashes_by_value() -> None:
    """Equal fields give equal, equally hashed policies."""
    assert BackoffPolicy(first=1.0) == BackoffPolicy(first=1)
    assert hash(BackoffPolicy(first=1.0)) == hash(BackoffPolicy(first=1))


def test_constant_constructor_defaults() -> None:
    """constant(d) is first=d, max=30, factor=1, no jitter, no floor."""
    assert BackoffPolicy.constant(2.5) == BackoffPolicy(
        first=2.5, max=30.0, factor=1.0, jitter=Jitter.NONE, floor=0.0
    )


def test_constant_above_thirty_raises_max_to_delay() -> None:
    """constant(d) with d > 30 uses max=d."""
    assert BackoffPolicy.constant(45.0).max == 45.0


def test_constant_waits_the_same_for_every_retry() -> None:
    """A constant policy gives its delay for every n, huge n included."""
    policy = BackoffPolicy.constant(2.5)
    rng = random.Random(0)
    assert {policy.delay_for_retry(n, rng) for n in (0, 1, 7, 10**6, HUGE_N)} == {2.5}


def test_exponential_constructor_defaults() -> None:
    """exponential(first) is max=30, factor=2, no jitter, no floor."""
    assert BackoffPolicy.exponential(0.5) == BackoffPolicy(
        first=0.5, max=30.0, factor=2.0, jitter=Jitter.NONE, floor=0.0
    )


def test_exponential_without_max_uses_first_when_above_thirty() -> None:
    """exponential(first) with first > 30 and max=None uses max=first."""
    assert BackoffPolicy.exponential(60.0).max == 60.0


def test_exponential_passes_keywords_through() -> None:
    """exponential forwards max, factor and jitter."""
    policy = BackoffPolicy.exponential(1.0, max=5.0, factor=3.0, jitter=Jitter.BAND)
    assert policy == BackoffPolicy(first=1.0, max=5.0, factor=3.0, jitter=Jitter.BAND)


def test_floor_above_max_is_clamped_to_max() -> None:
    """A floor above max is stored as max."""
    assert BackoffPolicy(first=1.0, max=5.0, floor=9.0).floor == 5.0


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"first": -1.0}, "-1.0"),
        ({"first": math.nan}, "nan"),
        ({"first": math.inf}, "inf"),
        ({"first": 10**400}, str(10**400)),
        ({"max": -0.5}, "-0.5"),
        ({"max": math.nan}, "nan"),
        ({"max": math.inf}, "inf"),
        ({"factor": 0.5}, "0.5"),
        ({"factor": 0}, "0.0"),
        ({"factor": math.nan}, "nan"),
        ({"factor": math.inf}, "inf"),
        ({"floor": -0.001}, "-0.001"),
        ({"floor": math.nan}, "nan"),
        ({"floor": math.inf}, "inf"),
    ],
)
def test_invalid_backoff_value_raises_config_error_naming_it(
    kwargs: dict[str, Any], shown: str
) -> None:
    """Each invalid field raises ConfigError whose message names the field and value."""
    (field,) = kwargs
    with pytest.raises(ConfigError) as info:
        BackoffPolicy(**kwargs)
    message = str(info.value)
    assert message.startswith(f"{field} must ")
    assert shown in message


def test_first_above_max_raises_config_error_naming_both() -> None:
    """first > max is a ConfigError naming both values."""
    with pytest.raises(ConfigError, match=r"first must be <= max, got first=5\.0 and max=2\.0"):
        BackoffPolicy(first=5.0, max=2.0)


def test_exponential_validates_like_the_constructor() -> None:
    """exponential() rejects an invalid factor with ConfigError."""
    with pytest.raises(ConfigError, match=r"factor must be finite and >= 1, got 0\.9"):
        BackoffPolicy.exponential(1.0, factor=0.9)


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"first": "0.2"}, "'0.2'"),
        ({"max": None}, "None"),
        ({"jitter": "full"}, "'full'"),
        ({"jitter": None}, "None"),
    ],
)
def test_backoff_value_of_a_wrong_type_raises_type_error_naming_it(
    kwargs: dict[str, Any], shown: str
) -> None:
    """A field of a wrong type raises TypeError whose message names the field and value."""
    (field,) = kwargs
    with pytest.raises(TypeError) as info:
        BackoffPolicy(**kwargs)
    message = str(info.value)
    assert message.startswith(f"{field} must ")
    assert shown in message


@pytest.mark.parametrize(
    ("first", "error"), [(math.nan, ConfigError), ("x", TypeError), (-1.0, ConfigError)]
)
def test_constant_reports_the_bad_delay_as_first(first: Any, error: type[Exception]) -> None:
    """constant() of an invalid delay blames first, not max."""
    with pytest.raises(error, match=r"^first must "):
        BackoffPolicy.constant(first)


def test_config_error_is_a_value_error() -> None:
    """Invalid policies can be caught as ValueError."""
    with pytest.raises(ValueError, match="factor"):
        BackoffPolicy(factor=0.0)


# -- BackoffPolicy: delays -------------------------------------------------------------


def test_exponential_base_doubles_per_retry() -> None:
    """With factor 2 and no jitter the delays are first * 2**n."""
    policy = BackoffPolicy.exponential(0.25)
    rng = random.Random(0)
    assert [policy.delay_for_retry(n, rng) for n in range(5)] == [0.25, 0.5, 1.0, 2.0, 4.0]


def test_base_saturates_at_max() -> None:
    """Once first * factor**n passes max, the delay is max."""
    policy = BackoffPolicy.exponential(1.0, max=5.0)
    rng = random.Random(0)
    assert [policy.delay_for_retry(n, rng) for n in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


@pytest.mark.parametrize("n", [1100, 10**6, 10**18, HUGE_N])
def test_overflowing_base_saturates_at_max_without_raising(n: int) -> None:
    """A float overflow of factor**n gives max instead of raising."""
    assert BackoffPolicy.exponential(1.0, max=7.0).delay_for_retry(n, random.Random(0)) == 7.0


def test_huge_factor_times_first_saturates_at_max() -> None:
    """A product that overflows to inf (without OverflowError) still gives max."""
    policy = BackoffPolicy(first=1e300, max=1e300, factor=1e6, jitter=Jitter.NONE)
    assert policy.delay_for_retry(5, random.Random(0)) == 1e300


def test_negative_retry_index_raises_config_error() -> None:
    """n < 0 raises ConfigError naming n."""
    with pytest.raises(ConfigError, match="got -1"):
        BackoffPolicy().delay_for_retry(-1, random.Random(0))


def test_zero_first_without_floor_is_exactly_zero() -> None:
    """first=0 and floor=0 give exactly 0.0: no safety floor for a zero base."""
    policy = BackoffPolicy(first=0.0, jitter=Jitter.FULL)
    assert policy.delay_for_retry(3, random.Random(0)) == 0.0


def test_zero_first_with_floor_waits_the_floor() -> None:
    """first=0 with a floor waits exactly the floor."""
    policy = BackoffPolicy(first=0.0, floor=0.5)
    assert policy.delay_for_retry(0, random.Random(0)) == 0.5


def test_zero_base_consumes_no_randomness() -> None:
    """A zero base is not jittered, so the RNG is left untouched."""
    rng = random.Random(3)
    state = rng.getstate()
    BackoffPolicy(first=0.0, jitter=Jitter.BAND).delay_for_retry(2, rng)
    assert rng.getstate() == state


def test_tiny_base_is_raised_to_the_safety_floor() -> None:
    """A positive delay below 1 ms becomes 1 ms."""
    policy = BackoffPolicy.constant(1e-9)
    assert policy.delay_for_retry(0, random.Random(0)) == SAFETY_FLOOR


def test_floor_raises_short_delays() -> None:
    """Delays below the floor are raised to it."""
    policy = BackoffPolicy(first=0.1, max=10.0, jitter=Jitter.NONE, floor=0.3)
    rng = random.Random(0)
    assert [policy.delay_for_retry(n, rng) for n in range(4)] == [0.3, 0.3, 0.4, 0.8]


def test_floor_above_safety_floor_applies_to_full_jitter() -> None:
    """FULL jitter never goes below the floor."""
    policy = BackoffPolicy(first=1.0, max=1.0, jitter=Jitter.FULL, floor=0.9)
    rng = random.Random(0)
    assert min(policy.delay_for_retry(0, rng) for _ in range(200)) >= 0.9


def test_band_jitter_example_bounds() -> None:
    """BAND draws within [first, min(3 * base, max)]."""
    policy = BackoffPolicy(first=1.0, max=10.0, factor=2.0, jitter=Jitter.BAND)
    rng = random.Random(0)
    draws = [policy.delay_for_retry(1, rng) for _ in range(200)]
    assert all(1.0 <= d <= 6.0 for d in draws)


def test_none_jitter_consumes_no_randomness() -> None:
    """Jitter.NONE never draws from the RNG."""
    rng = random.Random(5)
    state = rng.getstate()
    BackoffPolicy(jitter=Jitter.NONE).delay_for_retry(4, rng)
    assert rng.getstate() == state


@pytest.mark.parametrize("jitter", [Jitter.FULL, Jitter.EQUAL, Jitter.BAND])
def test_random_jitter_draws_from_the_given_rng(jitter: Jitter) -> None:
    """Every random jitter mode advances the RNG it is given."""
    rng = random.Random(5)
    state = rng.getstate()
    BackoffPolicy(jitter=jitter).delay_for_retry(4, rng)
    assert rng.getstate() != state


@given(policy=policies(), n=retry_indices)
@settings(max_examples=150)
def test_plain_delay_stays_between_first_and_max(policy: BackoffPolicy, n: int) -> None:
    """Without jitter or floor the delay lies in [first, max] (1 ms floor aside)."""
    delay = plain_delay(policy, n)
    if policy.first == 0.0:
        assert delay == 0.0
    else:
        assert max(policy.first, SAFETY_FLOOR) <= delay <= max(policy.max, SAFETY_FLOOR)


@given(policy=policies(), n=st.integers(min_value=0, max_value=2000), step=st.integers(1, 50))
@settings(max_examples=150)
def test_plain_delay_is_non_decreasing_in_n(policy: BackoffPolicy, n: int, step: int) -> None:
    """A later retry never has a shorter un-jittered delay."""
    assert plain_delay(policy, n) <= plain_delay(policy, n + step) <= plain_delay(policy, HUGE_N)


@given(policy=policies(), n=retry_indices)
@settings(max_examples=100)
def test_plain_delay_is_the_documented_base(policy: BackoffPolicy, n: int) -> None:
    """Without jitter or floor the delay is the documented base (1 ms floor if positive)."""
    base = base_of(policy, n)
    assert plain_delay(policy, n) == (0.0 if base == 0.0 else max(base, SAFETY_FLOOR))


@given(policy=policies(), seed=seeds, n=retry_indices)
@settings(max_examples=100)
def test_none_jitter_is_deterministic(policy: BackoffPolicy, seed: int, n: int) -> None:
    """Jitter.NONE gives the same delay whatever the RNG, and leaves it untouched."""
    policy = attrs.evolve(policy, jitter=Jitter.NONE)
    rng = random.Random(seed)
    state = rng.getstate()
    delay = policy.delay_for_retry(n, rng)
    assert rng.getstate() == state
    assert delay == policy.delay_for_retry(n, random.Random(seed + 1))


@given(policy=policies(jitter=Jitter.NONE), n=retry_indices)
@settings(max_examples=100)
def test_none_jitter_is_floored_base(policy: BackoffPolicy, n: int) -> None:
    """NONE gives max(base, floor, 1 ms), or the floor when base is 0."""
    base = base_of(policy, n)
    expected = policy.floor if base == 0.0 else floored(policy, base)
    assert policy.delay_for_retry(n, random.Random(0)) == expected


@given(policy=policies(jitter=Jitter.FULL), seed=seeds, n=retry_indices)
@settings(max_examples=150)
def test_full_jitter_stays_in_bounds(policy: BackoffPolicy, seed: int, n: int) -> None:
    """FULL lies in [max(floor, 1 ms), max(base, floor, 1 ms)]."""
    base = base_of(policy, n)
    delay = policy.delay_for_retry(n, random.Random(seed))
    if base == 0.0:
        assert delay == policy.floor
    else:
        assert floored(policy, 0.0) <= delay <= floored(policy, base)


@given(policy=policies(jitter=Jitter.EQUAL), seed=seeds, n=retry_indices)
@settings(max_examples=150)
def test_equal_jitter_stays_in_bounds(policy: BackoffPolicy, seed: int, n: int) -> None:
    """EQUAL lies in [max(base/2, floor, 1 ms), max(base, floor, 1 ms)]."""
    base = base_of(policy, n)
    delay = policy.delay_for_retry(n, random.Random(seed))
    if base == 0.0:
        assert delay == policy.floor
    else:
        assert floored(policy, base / 2) <= delay <= floored(policy, base)


@given(policy=policies(jitter=Jitter.BAND), seed=seeds, n=retry_indices)
@settings(max_examples=150)
def test_band_jitter_stays_in_bounds(policy: BackoffPolicy, seed: int, n: int) -> None:
    """BAND lies in [max(first, floor, 1 ms), max(min(3*base, max), floor, 1 ms)]."""
    base = base_of(policy, n)
    delay = policy.delay_for_retry(n, random.Random(seed))
    if base == 0.0:
        assert delay == policy.floor
    else:
        high = min(3 * base, policy.max)
        assert floored(policy, policy.first) <= delay <= floored(policy, high)


@given(policy=policies(), seed=seeds, n=retry_indices)
@settings(max_examples=100)
def test_no_delay_exceeds_max(policy: BackoffPolicy, seed: int, n: int) -> None:
    """Every delay is at most max (or the 1 ms safety floor when max is tinier)."""
    assert policy.delay_for_retry(n, random.Random(seed)) <= max(policy.max, SAFETY_FLOOR)


@given(policy=policies(), seed=seeds, n=retry_indices)
@settings(max_examples=100)
def test_delay_respects_floor(policy: BackoffPolicy, seed: int, n: int) -> None:
    """Every delay is at least the floor."""
    assert policy.delay_for_retry(n, random.Random(seed)) >= policy.floor


@given(policy=policies(), seed=seeds)
@settings(max_examples=75)
def test_seeded_rng_reproduces_delays(policy: BackoffPolicy, seed: int) -> None:
    """The same seed gives the same sequence of delays."""
    first_rng, second_rng = random.Random(seed), random.Random(seed)
    first_run = [policy.delay_for_retry(n, first_rng) for n in range(8)]
    second_run = [policy.delay_for_retry(n, second_rng) for n in range(8)]
    assert first_run == second_run


# -- Jitter ----------------------------------------------------------------------------


def test_jitter_values_are_lower_case_names() -> None:
    """Each Jitter member's value is its lower-case name."""
    assert [(j.name.lower(), j.value) for j in Jitter] == [
        ("none", "none"),
        ("full", "full"),
        ("equal", "equal"),
        ("band", "band"),
    ]


# -- RestartPolicy ---------------------------------------------------------------------


def test_restart_policies_compare_by_value() -> None:
    """always(5.0) equals another always(5.0) and differs from always(6.0)."""
    assert RestartPolicy.always(5.0) == RestartPolicy.always(5.0)
    assert RestartPolicy.always(5.0) != RestartPolicy.always(6.0)


def test_restart_policies_hash_by_value() -> None:
    """Equal restart policies hash equally, so they work as dict keys."""
    assert len({RestartPolicy.always(5), RestartPolicy.always(5.0), RestartPolicy.NEVER}) == 2


def test_restart_constants_equal_direct_construction() -> None:
    """NEVER and ON_FAILURE are the plain values of their kinds."""
    assert RestartPolicy("never") == RestartPolicy.NEVER
    assert RestartPolicy("on_failure") == RestartPolicy.ON_FAILURE
    assert RestartPolicy.NEVER != RestartPolicy.ON_FAILURE


def test_always_zero_interval_normalises_to_none() -> None:
    """always(0) is always(None): run again right after a success."""
    assert RestartPolicy.always(0).interval is None
    assert RestartPolicy.always(0.0) == RestartPolicy.always()


def test_always_converts_int_interval_to_float() -> None:
    """An int interval is stored as a float."""
    assert type(RestartPolicy.always(5).interval) is float


@pytest.mark.parametrize(
    ("policy", "text"),
    [
        (RestartPolicy.NEVER, "RestartPolicy.NEVER"),
        (RestartPolicy.ON_FAILURE, "RestartPolicy.ON_FAILURE"),
        (RestartPolicy.always(5), "RestartPolicy.always(5.0)"),
        (RestartPolicy.always(), "RestartPolicy.always()"),
    ],
)
def test_restart_policy_repr(policy: RestartPolicy, text: str) -> None:
    """repr reads like the expression that builds the policy."""
    assert repr(policy) == text


@pytest.mark.parametrize(
    ("policy", "on_failure", "on_success"),
    [
        (RestartPolicy.NEVER, False, False),
        (RestartPolicy.ON_FAILURE, True, False),
        (RestartPolicy.always(), True, True),
        (RestartPolicy.always(3.0), True, True),
    ],
)
def test_restart_policy_flags(policy: RestartPolicy, on_failure: bool, on_success: bool) -> None:
    """restarts_on_failure / restarts_on_success follow the kind."""
    assert (policy.restarts_on_failure, policy.restarts_on_success) == (on_failure, on_success)


@pytest.mark.parametrize(
    ("interval", "shown"),
    [(-1.0, "-1.0"), (math.nan, "nan"), (math.inf, "inf")],
)
def test_invalid_always_interval_raises_config_error_naming_it(interval: Any, shown: str) -> None:
    """A negative, NaN or infinite interval raises ConfigError naming it (a non-number:
    TypeError, tests/test_bad_input.py)."""
    with pytest.raises(ConfigError) as info:
        RestartPolicy.always(interval)
    assert str(info.value).startswith("interval must ")
    assert shown in str(info.value)


@pytest.mark.parametrize("kind", ["sometimes", "NEVER", "", None])
def test_unknown_restart_kind_raises_config_error_naming_it(kind: Any) -> None:
    """Direct construction with an unknown kind raises ConfigError naming it."""
    with pytest.raises(ConfigError, match="restart kind must be one of") as info:
        RestartPolicy(kind)
    assert repr(kind) in str(info.value)


@pytest.mark.parametrize("kind", ["never", "on_failure"])
def test_interval_on_non_always_kind_raises_config_error(kind: str) -> None:
    """Only the "always" kind takes an interval."""
    with pytest.raises(ConfigError, match=r"interval is only valid for restart kind 'always'"):
        RestartPolicy(kind, 5.0)


def test_restart_policy_is_frozen() -> None:
    """A RestartPolicy cannot be mutated, so shared constants stay intact."""
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        RestartPolicy.NEVER.kind = "always"  # type: ignore[misc]


# -- RestartLimit: the restart intensity of one task ----------------------------------


def test_restart_limit_stores_within_as_float() -> None:
    """``within`` is stored as a float; the limit compares and hashes by value."""
    limit = RestartLimit(3, 60)
    assert type(limit.within) is float
    assert limit == RestartLimit(3, 60.0)
    assert len({limit, RestartLimit(3, 60.0), RestartLimit(4, 60.0)}) == 2


def test_restart_limit_reason_names_the_limit_and_the_error() -> None:
    """The FAILED reason text is the documented one: ``within`` as a float repr."""
    assert RestartLimit(2, 10).reason(ValueError("boom")) == (
        "restart limit reached: 2 restarts within 10.0 s: boom"
    )


@pytest.mark.parametrize(
    ("args", "exc_type", "shown"),
    [
        pytest.param((0, 1.0), ConfigError, "0", id="max-zero"),
        pytest.param((-1, 1.0), ConfigError, "-1", id="max-negative"),
        pytest.param((1.5, 1.0), TypeError, "1.5", id="max-float"),
        pytest.param((True, 1.0), TypeError, "True", id="max-bool"),
        pytest.param(("3", 1.0), TypeError, "'3'", id="max-str"),
        pytest.param((1, 0), ConfigError, "0", id="within-zero"),
        pytest.param((1, -1.0), ConfigError, "-1.0", id="within-negative"),
        pytest.param((1, math.nan), ConfigError, "nan", id="within-nan"),
        pytest.param((1, math.inf), ConfigError, "inf", id="within-inf"),
        pytest.param((1, "1"), TypeError, "'1'", id="within-str"),
        pytest.param((1, None), TypeError, "None", id="within-none"),
    ],
)
def test_restart_limit_rejects_bad_values(
    args: tuple[Any, Any], exc_type: type[Exception], shown: str
) -> None:
    """``max_restarts >= 1`` (an int) and finite ``within > 0``; wrong types: TypeError."""
    with pytest.raises(exc_type) as info:
        RestartLimit(*args)
    assert type(info.value) is exc_type
    assert shown in str(info.value)


def test_restart_window_counts_restarts_within_the_closed_window() -> None:
    """A restart ``within`` seconds after an earlier one is still counted with it."""
    window = RestartWindow(RestartLimit(2, 10.0))
    assert window.admits(1.0)
    window.record(1.0)
    assert window.admits(2.0)
    window.record(2.0)
    assert not window.admits(11.0)  # 1.0 >= 11.0 - 10.0: three within 10 s
    assert window.admits(11.5)  # 1.0 has left the window; 2.0 and 11.5 are two


def _model_admits(history: list[float], limit: RestartLimit, at: float) -> bool:
    """The rule as documented, over the whole history."""
    return 1 + sum(1 for s in history if s >= at - limit.within) <= limit.max_restarts


@settings(max_examples=300)
@given(
    max_restarts=st.integers(min_value=1, max_value=5),
    within=st.floats(min_value=0.001, max_value=100.0),
    gaps=st.lists(st.floats(min_value=0.0, max_value=50.0), max_size=40),
)
def test_restart_window_matches_the_rule_over_the_whole_history(
    max_restarts: int, within: float, gaps: list[float]
) -> None:
    """Keeping only the last ``max_restarts`` restarts decides as the whole history would."""
    limit = RestartLimit(max_restarts, within)
    window = RestartWindow(limit)
    history: list[float] = []
    at = 0.0
    for gap in gaps:
        at += gap
        admitted = window.admits(at)
        assert admitted == _model_admits(history, limit, at)
        if admitted:  # the actor records only the restarts it makes
            window.record(at)
            history.append(at)
    # Never more than max_restarts restarts in any closed window of ``within`` seconds.
    for end in history:
        assert sum(1 for s in history if end - within <= s <= end) <= max_restarts


@given(
    first=st.floats(min_value=0.0, max_value=1e6),
    budget=st.floats(min_value=0.001, max_value=1e6),
    late=st.floats(min_value=0.0, max_value=1e6),
)
def test_retry_budget_allows_a_retry_exactly_at_its_end(
    first: float, budget: float, late: float
) -> None:
    """A retry at ``first + budget`` is made; any later one is not."""
    end = first + budget
    assert not retry_budget_spent(first, budget, end)
    assert retry_budget_spent(first, budget, end + late) is (end + late > end)
