"""Medians of repeated runs, ratios against the incumbents, and the markdown tables."""

from __future__ import annotations

import statistics
from typing import Any

from bench.workloads import Case

# workload -> (column title, figure key) in print order
COLUMNS: dict[str, list[tuple[str, str]]] = {
    "burst": [
        ("first s", "first_s"),
        ("last s", "last_s"),
        ("all S by s", "all_s"),
        ("arrived", "arrived"),
        ("arrived %", "arrived_pct"),
        ("dups", "duplicates"),
        ("earlier", "earlier_messages"),
        ("early", "early_messages"),
        ("publishers", "publishers"),
        ("CPU s/1k", "cpu_per_1k"),
        ("peak RSS MB", "peak_rss_mb"),
        ("boot s", "boot_s"),
        ("ready s", "ready_s"),
        ("db xacts", "db_xacts"),
        ("burst db xacts", "burst_db_xacts"),
        ("burst db rows", "burst_db_rows"),
        ("burst db ms", "burst_db_ms"),
    ],
    "steady": [
        ("expected", "expected"),
        ("achieved", "achieved_ratio"),
        ("firings/s", "firings_per_s"),
        ("dups", "duplicates"),
        ("misses", "misses"),
        ("publishers", "publishers"),
        ("lag p50 ms", "lag_p50_ms"),
        ("lag p99 ms", "lag_p99_ms"),
        ("lag max ms", "lag_max_ms"),
        ("lag basis", "lag_basis"),
        ("gap p50 ms", "gap_p50_ms"),
        ("gap p99 ms", "gap_p99_ms"),
        ("CPU s/1k", "cpu_per_1k"),
        ("peak RSS MB", "peak_rss_mb"),
        ("boot s", "boot_s"),
        ("db xacts", "db_xacts"),
    ],
    "idle": [
        ("boot s", "boot_s"),
        ("ready s", "ready_s"),
        ("peak RSS MB", "peak_rss_mb"),
        ("idle CPU %", "idle_cpu_pct"),
    ],
}

# workload -> figures compared as x / reference (same workload and S, reference at R=1)
RATIO_KEYS = {
    "burst": ["all_s", "last_s", "arrived", "cpu_per_1k"],
    "steady": ["achieved_ratio", "lag_p99_ms", "cpu_per_1k"],
    "idle": ["boot_s", "ready_s", "peak_rss_mb", "idle_cpu_pct"],
}
REFERENCES = ("celery", "redbeat")


def median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of each numeric figure over repeats (None ignored); other values from run 1."""
    keys = {k for run in runs for k in run}
    out: dict[str, Any] = {"repeats": len(runs)}
    for key in sorted(keys):
        values = [run.get(key) for run in runs]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if numbers:
            m = statistics.median(numbers)
            out[key] = round(m, 4) if isinstance(m, float) else m
            if len(numbers) < len(values):
                out[f"{key}_missing_in"] = len(values) - len(numbers)
        else:
            out[key] = next((v for v in values if v is not None), None)
    return out


def ratios(medians: dict[Case, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every figure in RATIO_KEYS as x / reference, reference = celery or RedBeat at R=1."""
    rows = []
    for case, figures in medians.items():
        for ref_name in REFERENCES:
            ref = medians.get(Case(case.workload, ref_name, case.size, 1))
            if ref is None or (case.contender == ref_name and case.replicas == 1):
                continue
            row: dict[str, Any] = {"case": case.label, "vs": f"{ref_name}-R1"}
            for key in RATIO_KEYS[case.workload]:
                x, r = figures.get(key), ref.get(key)
                ok = isinstance(x, int | float) and isinstance(r, int | float) and r
                row[key] = round(x / r, 3) if ok else None
            rows.append(row)
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(
    medians: dict[Case, dict[str, Any]],
    raw: dict[str, float] | None,
    skipped: dict[str, str],
    errors: dict[str, str],
) -> str:
    parts: list[str] = []
    for workload, cols in COLUMNS.items():
        cases = [c for c in medians if c.workload == workload]
        if not cases:
            continue
        header = ["scheduler", "S", "R", "runs"] + [title for title, _ in cols]
        rows = [
            [c.contender, c.size, c.replicas, medians[c].get("repeats")]
            + [medians[c].get(key) for _, key in cols]
            for c in sorted(cases, key=lambda c: (c.size, c.contender, c.replicas))
        ]
        parts.append(f"### {workload}\n\n{_table(header, rows)}")
    ratio_rows = ratios(medians)
    if ratio_rows:
        keys = sorted({k for row in ratio_rows for k in row} - {"case", "vs"})
        header = ["case", "vs"] + [f"{k} ÷ ref" for k in keys]
        body = [[row["case"], row["vs"]] + [row.get(k) for k in keys] for row in ratio_rows]
        parts.append(f"### ratios (x ÷ reference, same run, medians)\n\n{_table(header, body)}")
    if raw:
        body = [[name, rate] for name, rate in raw.items()]
        parts.append(f"### raw limits\n\n{_table(['what', 'per second'], body)}")
    for name, reason in skipped.items():
        parts.append(f"**skipped {name}:** {reason}")
    for label, err in errors.items():
        parts.append(f"**failed {label}:** {err}")
    return "\n\n".join(parts)
