"""DST transitions, table-driven, with expected instants worked out by hand as literal UTC.

Zones and 2024 transitions (UTC instant of the change):

* Europe/Berlin, CET +1 / CEST +2: spring 03-31 01:00Z (02:00 -> 03:00), fall 10-27 01:00Z
  (03:00 -> 02:00, wall 02:00-03:00 twice).
* America/New_York, EST -5 / EDT -4: spring 03-10 07:00Z (02:00 -> 03:00), fall 11-03 06:00Z
  (02:00 -> 01:00, wall 01:00-02:00 twice).
* Australia/Lord_Howe, LHST +10:30 / LHDT +11 (a 30-minute shift): fall 04-06 15:00Z
  (02:00 -> 01:30, wall 01:30-02:00 twice), spring 10-05 15:30Z (02:00 -> 02:30).

Rule (Debian cron): a fixed-time job whose wall time is skipped runs at the first instant after
the gap; one whose wall time repeats runs on the first pass only; a wildcard job (minute or
hour field starting with ``*``) runs at every real instant whose wall clock matches.
"""

# ruff: noqa: E501  (one case per line reads better than wrapped tables)

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from celery.schedules import crontab

from voltro_beat.occurrences import next_after, occurrences_between
from voltro_beat.schedules import to_spec

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
LORD_HOWE = "Australia/Lord_Howe"


def z(month: int, day: int, hour: int, minute: int = 0, second: int = 0) -> datetime:
    """A 2024 instant in UTC."""
    return datetime(2024, month, day, hour, minute, second, tzinfo=UTC)


def seconds(first: datetime, count: int, step: int = 10) -> list[datetime]:
    return [first + timedelta(seconds=step * i) for i in range(count)]


CASES = [
    # ---- Europe/Berlin, spring forward 2024-03-31 -------------------------------------------
    # 03-30 02:30 CET; 03-31 02:30 does not exist -> 03:00 CEST; 04-01 02:30 CEST.
    ("30 2 * * *", BERLIN, z(3, 30, 0), z(4, 1, 12), [z(3, 30, 1, 30), z(3, 31, 1), z(4, 1, 0, 30)]),
    # 00:00 CET, 01:00 CET, (02:00 skipped), 03:00 CEST, 04:00 CEST.
    ("0 * * * *", BERLIN, z(3, 30, 23), z(3, 31, 3), [z(3, 30, 23), z(3, 31, 0), z(3, 31, 1), z(3, 31, 2)]),
    # 01:00 CET, 01:30 CET, 03:00 CEST, 03:30 CEST.
    ("*/30 * * * *", BERLIN, z(3, 31, 0), z(3, 31, 2), [z(3, 31, 0), z(3, 31, 0, 30), z(3, 31, 1), z(3, 31, 1, 30)]),
    # 01:30 CET, 01:45 CET, 03:00 CEST, 03:15 CEST.
    ("*/15 * * * *", BERLIN, z(3, 31, 0, 30), z(3, 31, 1, 30), [z(3, 31, 0, 30), z(3, 31, 0, 45), z(3, 31, 1), z(3, 31, 1, 15)]),
    # 01:59:40 CET, 01:59:50 CET, 03:00:00 CEST, 03:00:10 CEST.
    ("*/10 * * * * *", BERLIN, z(3, 31, 0, 59, 40), z(3, 31, 1, 0, 20), seconds(z(3, 31, 0, 59, 40), 4)),
    # Six wall times 02:30:00-02:30:50, all skipped: once, at 03:00 CEST.
    ("*/10 30 2 * * *", BERLIN, z(3, 31, 0), z(3, 31, 2), [z(3, 31, 1)]),
    # Minute wildcard, so every real 02:xx: none on 03-31, which has no 02:xx at all.
    ("*/20 2 * * *", BERLIN, z(3, 30, 0), z(4, 1, 12), [z(3, 30, 1), z(3, 30, 1, 20), z(3, 30, 1, 40), z(4, 1, 0), z(4, 1, 0, 20), z(4, 1, 0, 40)]),
    (crontab(minute=30, hour=2), BERLIN, z(3, 30, 0), z(4, 1, 12), [z(3, 30, 1, 30), z(3, 31, 1), z(4, 1, 0, 30)]),
    (crontab(minute="*/30"), BERLIN, z(3, 31, 0), z(3, 31, 2), [z(3, 31, 0), z(3, 31, 0, 30), z(3, 31, 1), z(3, 31, 1, 30)]),
    # ---- Europe/Berlin, fall back 2024-10-27 ------------------------------------------------
    # 10-26 02:30 CEST; 10-27 02:30 twice -> first pass (CEST) only; 10-28 02:30 CET.
    ("30 2 * * *", BERLIN, z(10, 26, 0), z(10, 28, 12), [z(10, 26, 0, 30), z(10, 27, 0, 30), z(10, 28, 1, 30)]),
    # 01:00 CEST, 02:00 CEST, 02:00 CET, 03:00 CET.
    ("0 * * * *", BERLIN, z(10, 26, 23), z(10, 27, 3), [z(10, 26, 23), z(10, 27, 0), z(10, 27, 1), z(10, 27, 2)]),
    # 02:00 CEST, 02:30 CEST, 02:00 CET, 02:30 CET.
    ("*/30 * * * *", BERLIN, z(10, 27, 0), z(10, 27, 2), [z(10, 27, 0), z(10, 27, 0, 30), z(10, 27, 1), z(10, 27, 1, 30)]),
    # 02:30 CEST, 02:45 CEST, 02:00 CET, 02:15 CET.
    ("*/15 * * * *", BERLIN, z(10, 27, 0, 30), z(10, 27, 1, 30), [z(10, 27, 0, 30), z(10, 27, 0, 45), z(10, 27, 1), z(10, 27, 1, 15)]),
    # 02:59:40 CEST, 02:59:50 CEST, 02:00:00 CET, 02:00:10 CET.
    ("*/10 * * * * *", BERLIN, z(10, 27, 0, 59, 40), z(10, 27, 1, 0, 20), seconds(z(10, 27, 0, 59, 40), 4)),
    # 02:30:00-02:30:50 on the first pass (CEST) only.
    ("*/10 30 2 * * *", BERLIN, z(10, 27, 0), z(10, 27, 2), seconds(z(10, 27, 0, 30), 6)),
    # Minute wildcard: 02:00, 02:20, 02:40 on both passes, CEST then CET.
    ("*/20 2 * * *", BERLIN, z(10, 27, 0), z(10, 27, 2), [z(10, 27, 0), z(10, 27, 0, 20), z(10, 27, 0, 40), z(10, 27, 1), z(10, 27, 1, 20), z(10, 27, 1, 40)]),
    (crontab(minute=30, hour=2), BERLIN, z(10, 26, 0), z(10, 28, 12), [z(10, 26, 0, 30), z(10, 27, 0, 30), z(10, 28, 1, 30)]),
    (crontab(minute="*/30"), BERLIN, z(10, 27, 0), z(10, 27, 2), [z(10, 27, 0), z(10, 27, 0, 30), z(10, 27, 1), z(10, 27, 1, 30)]),
    # ---- America/New_York, spring forward 2024-03-10 ----------------------------------------
    # 03-09 02:30 EST; 03-10 02:30 does not exist -> 03:00 EDT; 03-11 02:30 EDT.
    ("30 2 * * *", NEW_YORK, z(3, 9, 0), z(3, 11, 12), [z(3, 9, 7, 30), z(3, 10, 7), z(3, 11, 6, 30)]),
    # 00:00 EST, 01:00 EST, (02:00 skipped), 03:00 EDT, 04:00 EDT.
    ("0 * * * *", NEW_YORK, z(3, 10, 5), z(3, 10, 9), [z(3, 10, 5), z(3, 10, 6), z(3, 10, 7), z(3, 10, 8)]),
    # 01:00 EST, 01:30 EST, 03:00 EDT, 03:30 EDT.
    ("*/30 * * * *", NEW_YORK, z(3, 10, 6), z(3, 10, 8), [z(3, 10, 6), z(3, 10, 6, 30), z(3, 10, 7), z(3, 10, 7, 30)]),
    # 01:30 EST, 01:45 EST, 03:00 EDT, 03:15 EDT.
    ("*/15 * * * *", NEW_YORK, z(3, 10, 6, 30), z(3, 10, 7, 30), [z(3, 10, 6, 30), z(3, 10, 6, 45), z(3, 10, 7), z(3, 10, 7, 15)]),
    # 01:59:40 EST, 01:59:50 EST, 03:00:00 EDT, 03:00:10 EDT.
    ("*/10 * * * * *", NEW_YORK, z(3, 10, 6, 59, 40), z(3, 10, 7, 0, 20), seconds(z(3, 10, 6, 59, 40), 4)),
    ("*/10 30 2 * * *", NEW_YORK, z(3, 10, 6), z(3, 10, 8), [z(3, 10, 7)]),
    (crontab(minute=30, hour=2), NEW_YORK, z(3, 9, 0), z(3, 11, 12), [z(3, 9, 7, 30), z(3, 10, 7), z(3, 11, 6, 30)]),
    (crontab(minute="*/30"), NEW_YORK, z(3, 10, 6), z(3, 10, 8), [z(3, 10, 6), z(3, 10, 6, 30), z(3, 10, 7), z(3, 10, 7, 30)]),
    # ---- America/New_York, fall back 2024-11-03 ---------------------------------------------
    # 02:30 is not repeated here: 11-02 02:30 EDT, 11-03 02:30 EST, 11-04 02:30 EST.
    ("30 2 * * *", NEW_YORK, z(11, 2, 0), z(11, 4, 12), [z(11, 2, 6, 30), z(11, 3, 7, 30), z(11, 4, 7, 30)]),
    # 01:30 is: 11-02 01:30 EDT, 11-03 01:30 EDT (first pass only), 11-04 01:30 EST.
    ("30 1 * * *", NEW_YORK, z(11, 2, 0), z(11, 4, 12), [z(11, 2, 5, 30), z(11, 3, 5, 30), z(11, 4, 6, 30)]),
    # 00:00 EDT, 01:00 EDT, 01:00 EST, 02:00 EST.
    ("0 * * * *", NEW_YORK, z(11, 3, 4), z(11, 3, 8), [z(11, 3, 4), z(11, 3, 5), z(11, 3, 6), z(11, 3, 7)]),
    # 01:00 EDT, 01:30 EDT, 01:00 EST, 01:30 EST.
    ("*/30 * * * *", NEW_YORK, z(11, 3, 5), z(11, 3, 7), [z(11, 3, 5), z(11, 3, 5, 30), z(11, 3, 6), z(11, 3, 6, 30)]),
    # 01:30 EDT, 01:45 EDT, 01:00 EST, 01:15 EST.
    ("*/15 * * * *", NEW_YORK, z(11, 3, 5, 30), z(11, 3, 6, 30), [z(11, 3, 5, 30), z(11, 3, 5, 45), z(11, 3, 6), z(11, 3, 6, 15)]),
    # 01:59:40 EDT, 01:59:50 EDT, 01:00:00 EST, 01:00:10 EST.
    ("*/10 * * * * *", NEW_YORK, z(11, 3, 5, 59, 40), z(11, 3, 6, 0, 20), seconds(z(11, 3, 5, 59, 40), 4)),
    ("*/10 30 1 * * *", NEW_YORK, z(11, 3, 5), z(11, 3, 7), seconds(z(11, 3, 5, 30), 6)),
    (crontab(minute=30, hour=1), NEW_YORK, z(11, 2, 0), z(11, 4, 12), [z(11, 2, 5, 30), z(11, 3, 5, 30), z(11, 4, 6, 30)]),
    (crontab(minute="*/30"), NEW_YORK, z(11, 3, 5), z(11, 3, 7), [z(11, 3, 5), z(11, 3, 5, 30), z(11, 3, 6), z(11, 3, 6, 30)]),
    # ---- Australia/Lord_Howe, fall back 2024-04-07 local (04-06 15:00Z) ---------------------
    # 04-06 02:30 LHDT, 04-07 02:30 LHST (not repeated), 04-08 02:30 LHST.
    ("30 2 * * *", LORD_HOWE, z(4, 5, 0), z(4, 8, 0), [z(4, 5, 15, 30), z(4, 6, 16), z(4, 7, 16)]),
    # 01:45 repeats: 04-06 01:45 LHDT, 04-07 01:45 LHDT (first pass only), 04-08 01:45 LHST.
    ("45 1 * * *", LORD_HOWE, z(4, 5, 0), z(4, 8, 0), [z(4, 5, 14, 45), z(4, 6, 14, 45), z(4, 7, 15, 15)]),
    # 00:00 LHDT, 01:00 LHDT, 02:00 LHST, 03:00 LHST: the 30-minute shift shows.
    ("0 * * * *", LORD_HOWE, z(4, 6, 12, 30), z(4, 6, 17), [z(4, 6, 13), z(4, 6, 14), z(4, 6, 15, 30), z(4, 6, 16, 30)]),
    # 01:00 LHDT, 01:30 LHDT, 01:30 LHST (second pass), 02:00 LHST, 02:30 LHST.
    ("*/30 * * * *", LORD_HOWE, z(4, 6, 14), z(4, 6, 16, 30), [z(4, 6, 14), z(4, 6, 14, 30), z(4, 6, 15), z(4, 6, 15, 30), z(4, 6, 16)]),
    # 01:30 and 01:45 LHDT, then 01:30, 01:45, 02:00, 02:15 LHST.
    ("*/15 * * * *", LORD_HOWE, z(4, 6, 14, 30), z(4, 6, 16), [z(4, 6, 14, 30), z(4, 6, 14, 45), z(4, 6, 15), z(4, 6, 15, 15), z(4, 6, 15, 30), z(4, 6, 15, 45)]),
    # 01:00, 01:20, 01:40 LHDT; second pass 01:40 LHST; 02:00, 02:20 LHST.
    ("*/20 * * * *", LORD_HOWE, z(4, 6, 14), z(4, 6, 16), [z(4, 6, 14), z(4, 6, 14, 20), z(4, 6, 14, 40), z(4, 6, 15, 10), z(4, 6, 15, 30), z(4, 6, 15, 50)]),
    # 01:59:40 LHDT, 01:59:50 LHDT, 01:30:00 LHST, 01:30:10 LHST.
    ("*/10 * * * * *", LORD_HOWE, z(4, 6, 14, 59, 40), z(4, 6, 15, 0, 20), seconds(z(4, 6, 14, 59, 40), 4)),
    ("*/10 45 1 * * *", LORD_HOWE, z(4, 6, 14), z(4, 6, 16), seconds(z(4, 6, 14, 45), 6)),
    (crontab(minute=45, hour=1), LORD_HOWE, z(4, 5, 0), z(4, 8, 0), [z(4, 5, 14, 45), z(4, 6, 14, 45), z(4, 7, 15, 15)]),
    (crontab(minute="*/30"), LORD_HOWE, z(4, 6, 14), z(4, 6, 16, 30), [z(4, 6, 14), z(4, 6, 14, 30), z(4, 6, 15), z(4, 6, 15, 30), z(4, 6, 16)]),
    # ---- Australia/Lord_Howe, spring forward 2024-10-06 local (10-05 15:30Z) ----------------
    # 10-05 02:30 LHST; 10-06 02:30 LHDT (exists: the gap is 02:00-02:30); 10-07 02:30 LHDT.
    ("30 2 * * *", LORD_HOWE, z(10, 4, 0), z(10, 7, 0), [z(10, 4, 16), z(10, 5, 15, 30), z(10, 6, 15, 30)]),
    # 02:15 is skipped on 10-06 -> 02:30 LHDT.
    ("15 2 * * *", LORD_HOWE, z(10, 4, 0), z(10, 7, 0), [z(10, 4, 15, 45), z(10, 5, 15, 30), z(10, 6, 15, 15)]),
    # 00:00 LHST, 01:00 LHST, (02:00 skipped), 03:00 LHDT, 04:00 LHDT.
    ("0 * * * *", LORD_HOWE, z(10, 5, 13), z(10, 5, 17, 30), [z(10, 5, 13, 30), z(10, 5, 14, 30), z(10, 5, 16), z(10, 5, 17)]),
    # 00:30, 01:00, 01:30 LHST, (02:00 skipped), 02:30, 03:00 LHDT.
    ("*/30 * * * *", LORD_HOWE, z(10, 5, 14), z(10, 5, 16, 30), [z(10, 5, 14), z(10, 5, 14, 30), z(10, 5, 15), z(10, 5, 15, 30), z(10, 5, 16)]),
    # 01:30, 01:45 LHST, (02:00, 02:15 skipped), 02:30, 02:45 LHDT.
    ("*/15 * * * *", LORD_HOWE, z(10, 5, 15), z(10, 5, 16), [z(10, 5, 15), z(10, 5, 15, 15), z(10, 5, 15, 30), z(10, 5, 15, 45)]),
    # 01:20, 01:40 LHST, (02:00, 02:20 skipped), 02:40, 03:00 LHDT.
    ("*/20 * * * *", LORD_HOWE, z(10, 5, 14, 40), z(10, 5, 16, 10), [z(10, 5, 14, 50), z(10, 5, 15, 10), z(10, 5, 15, 40), z(10, 5, 16)]),
    # 01:59:40 LHST, 01:59:50 LHST, 02:30:00 LHDT, 02:30:10 LHDT.
    ("*/10 * * * * *", LORD_HOWE, z(10, 5, 15, 29, 40), z(10, 5, 15, 30, 20), seconds(z(10, 5, 15, 29, 40), 4)),
    ("*/10 15 2 * * *", LORD_HOWE, z(10, 5, 15), z(10, 5, 16), [z(10, 5, 15, 30)]),
    (crontab(minute=15, hour=2), LORD_HOWE, z(10, 4, 0), z(10, 7, 0), [z(10, 4, 15, 45), z(10, 5, 15, 30), z(10, 6, 15, 15)]),
    (crontab(minute="*/30"), LORD_HOWE, z(10, 5, 14), z(10, 5, 16, 30), [z(10, 5, 14), z(10, 5, 14, 30), z(10, 5, 15), z(10, 5, 15, 30), z(10, 5, 16)]),
]  # fmt: skip


def case_id(case: tuple[object, str, datetime, datetime, list[datetime]]) -> str:
    schedule, tz, start, _, _ = case
    return f"{tz.split('/')[-1]}-{start:%m%d}-{schedule}"


@pytest.mark.parametrize(
    ("schedule", "tz", "start", "end", "expected"), CASES, ids=map(case_id, CASES)
)
def test_dst_transitions(
    schedule: object, tz: str, start: datetime, end: datetime, expected: list[datetime]
) -> None:
    assert list(occurrences_between(schedule, start, end, tz=tz)) == expected
    # The same instants, one next_after at a time, from just before the window.
    spec = to_spec(schedule, tz=tz)
    walked, at = [], next_after(spec, start - timedelta(microseconds=1))
    while at is not None and at < end:
        walked.append(at)
        at = next_after(spec, at)
    assert walked == expected


@pytest.mark.parametrize(
    ("schedule", "after", "expected"),
    [
        # NY */30 from inside the repeated hour: first pass -> rest of the first pass, then the
        # second pass from its start; second pass -> on within the second pass.
        ("*/30 * * * *", z(11, 3, 5, 40), z(11, 3, 6)),
        ("*/30 * * * *", z(11, 3, 5, 10), z(11, 3, 5, 30)),
        ("*/30 * * * *", z(11, 3, 6, 10), z(11, 3, 6, 30)),
        ("*/30 * * * *", z(11, 3, 6, 30), z(11, 3, 7)),
        ("*/30 * * * *", z(11, 3, 5, 59, 59) + timedelta(microseconds=999_999), z(11, 3, 6)),
        # A fixed-time job never takes the second pass.
        ("30 1 * * *", z(11, 3, 5, 40), z(11, 4, 6, 30)),
        ("30 1 * * *", z(11, 3, 6, 10), z(11, 4, 6, 30)),
        ("30 1 * * *", z(11, 3, 5, 10), z(11, 3, 5, 30)),
        # Exactly at the change.
        ("0 * * * *", z(11, 3, 6), z(11, 3, 7)),
        ("30 2 * * *", z(3, 10, 6, 59, 59), z(3, 10, 7)),
        ("30 2 * * *", z(3, 10, 7), z(3, 11, 6, 30)),
    ],
)
def test_next_after_from_inside_the_transition(
    schedule: str, after: datetime, expected: datetime
) -> None:
    assert next_after(schedule, after, tz=NEW_YORK) == expected


def test_a_wildcard_job_that_only_matches_skipped_times_never_fires() -> None:
    # 02:xx on the last Sunday of March: never on Berlin's clocks, which jump 02:00 -> 03:00
    # that night. A fixed-time job at 02:30 runs at the end of the gap instead.
    last_sunday_of_march = {"day_of_week": "sun", "day_of_month": "25-31", "month_of_year": 3}
    wildcard = crontab(minute="*/15", hour=2, **last_sunday_of_march)
    fixed = crontab(minute=30, hour=2, **last_sunday_of_march)
    assert next_after(wildcard, z(1, 1, 0), tz=BERLIN) is None
    assert next_after(fixed, z(1, 1, 0), tz=BERLIN) == z(3, 31, 1)
    # New York changes on the second Sunday of March: 2024-03-31 02:00 EDT exists.
    assert next_after(wildcard, z(1, 1, 0), tz=NEW_YORK) == z(3, 31, 6)
