"""How runs are counted (voltro_beat.tally): outcomes by kind, the success rate over the runs
that executed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from voltro_beat.status import Reason, Status
from voltro_beat.tally import NO_REASON, tally

#: A healthy `skip` schedule after a downtime: every run it executed succeeded.
HEALTHY = [
    ("succeeded", None, 19),
    ("skipped", Reason.OVERLAP.value, 12),
    ("missed", Reason.CATCH_UP.value, 9),
    ("missed", Reason.LATE.value, 2),
    ("started", None, 1),
]


def test_skipped_and_missed_runs_do_not_count_against_the_success_rate() -> None:
    found = tally(HEALTHY)
    assert found.success_rate == 1.0 and found.success_text == "100%"
    assert (found.total, found.executed, found.unfinished) == (43, 19, 1)
    assert found.missed == {"catch_up": 9, "late": 2}
    assert found.skipped == {"overlap": 12}
    assert found.outcomes_text == (
        "19 succeeded, 9 missed (catch_up), 2 missed (late), 12 skipped (overlap), 1 unfinished"
    )


def test_the_rate_is_succeeded_over_succeeded_and_failed() -> None:
    found = tally([("succeeded", None, 3), ("failed", None, 1), ("revoked", None, 4)])
    assert found.success_rate == 0.75 and found.success_text == "75%"
    assert found.outcomes() == [("succeeded", 3), ("failed", 1), ("revoked", 4)]


def test_nothing_executed_has_no_rate() -> None:
    found = tally([("missed", None, 2), ("skipped", "overlap", 1), ("claimed", None, 1)])
    assert found.success_rate is None and found.success_text == "-"
    assert found.missed == {NO_REASON: 2}
    assert tally([]).outcomes_text == "-" and tally([]).total == 0


def test_the_same_status_and_reason_twice_adds_up() -> None:
    found = tally([("missed", "late", 2), ("missed", "late", 3), ("succeeded", "x", 1)])
    assert found.missed == {"late": 5} and found.statuses == {"missed": 5, "succeeded": 1}


_ROWS = st.lists(
    st.tuples(
        st.sampled_from([s.value for s in Status]),
        st.one_of(st.none(), st.sampled_from([r.value for r in Reason])),
        st.integers(min_value=0, max_value=1000),
    )
)


@given(_ROWS)
def test_every_run_is_counted_once(rows: list[tuple[str, str | None, int]]) -> None:
    found = tally(rows)
    assert found.total == sum(n for _, _, n in rows)
    assert sum(n for _, n in found.outcomes()) == found.total
    ran = sum(n for s, _, n in rows if s in (Status.SUCCEEDED, Status.FAILED))
    if ran:
        assert found.success_rate is not None and 0 <= found.success_rate <= 1
    else:
        assert found.success_rate is None
