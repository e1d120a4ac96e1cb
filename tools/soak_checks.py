"""The soak's invariants: each compares what the clients saw with what the gateway
recorded (the usage ledger, ``/metrics``, the quota store) and says whether they agree.

What is checked, exactly, is listed in ``docs/reliability.md`` ("Soak").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from tools.soak_load import Outcome

Rows = dict[str, dict[str, Any]]
"""The usage ledger's rows by request id."""
Samples = dict[str, list[tuple[dict[str, str], float]]]
"""``/metrics`` samples by name."""


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def check_requests(outcomes: list[Outcome], over: str) -> list[Check]:
    server_errors = [o for o in outcomes if o.status is not None and o.status >= 500]
    hung = [o for o in outcomes if o.hung]
    problems = [o for o in outcomes if o.problem is not None]
    unexpected = [
        o
        for o in outcomes
        if o.status not in (200, None)
        and not (
            o.spec.tenant == over and o.status == 429 and o.error_code == "rate_limit_exceeded"
        )
    ]
    return [
        Check("no 5xx", not server_errors, f"{len(server_errors)} responses >= 500"),
        Check("no hung request", not hung, f"{len(hung)} without an answer in time"),
        Check(
            "every answer well formed",
            not problems,
            f"{len(problems)} transport errors, in-band errors, missing usage or non-OpenAI errors",
        ),
        Check(
            "only expected statuses",
            not unexpected,
            f"{len(unexpected)} other than 200 (and 429 rate_limit_exceeded for {over})",
        ),
    ]


def check_over_quota(outcomes: list[Outcome], over: str, rpm: int) -> Check:
    """A requests-per-minute limit is a bucket of ``rpm`` draining at ``rpm`` a minute: over
    a window of ``m`` minutes it admits at most ``rpm * (1 + m)``."""
    mine = [o for o in outcomes if o.spec.tenant == over]
    admitted = sum(o.status == 200 for o in mine)
    refused = sum(o.status == 429 for o in mine)
    # Admissions happen between the first request's start and the last one's answer.
    window = max(o.started + o.seconds for o in mine) - min(o.started for o in mine) if mine else 0
    minutes = window / 60
    bound = rpm * (1 + minutes)
    return Check(
        f"{over} held to {rpm} rpm",
        refused > 0 and admitted <= bound,
        f"{admitted} admitted (at most {bound:.1f} in {minutes:.2f} min), {refused} refused 429",
    )


def check_ledger(
    outcomes: list[Outcome],
    rows: Rows,
    totals: dict[str, dict[str, int]],
) -> list[Check]:
    admitted = {o.request_id: o for o in outcomes if o.status == 200 and o.request_id}
    missing = admitted.keys() - rows.keys()
    extra = rows.keys() - admitted.keys()
    wrong, short, cancelled_complete = [], [], []
    for rid, o in admitted.items():
        row = rows.get(rid)
        if row is None:
            continue
        if o.complete and (
            row["status"] != "ok"
            or row["completion_tokens"] != o.completion_tokens
            or row["prompt_tokens"] != o.prompt_tokens
        ):
            wrong.append(rid)
        if o.left and (
            row["status"] not in ("cancelled", "ok") or row["completion_tokens"] < o.content_chunks
        ):
            short.append(rid)
        if not o.left and row["status"] == "cancelled":
            cancelled_complete.append(rid)
    errors = [rid for rid, row in rows.items() if row["status"] == "error"]
    sums_differ = []
    for tenant, total in totals.items():
        mine = [row for row in rows.values() if row["tenant_id"] == tenant]
        received = sum(
            o.completion_tokens or 0
            for o in admitted.values()
            if o.complete and o.spec.tenant == tenant
        )
        partial = sum(
            rows[rid]["completion_tokens"]
            for rid, o in admitted.items()
            if o.left and o.spec.tenant == tenant and rid in rows
        )
        expected = {
            "requests": len(mine),
            "prompt_tokens": sum(row["prompt_tokens"] for row in mine),
            "completion_tokens": received + partial,
        }
        if total != expected:
            sums_differ.append(f"{tenant}: ledger {total}, responses {expected}")
    return [
        Check(
            "one ledger row per admitted request",
            not missing and not extra,
            f"{len(admitted)} admitted, {len(rows)} rows, {len(missing)} missing, "
            f"{len(extra)} unexplained",
        ),
        Check(
            "completed: ledger == usage received",
            not wrong,
            f"{len(wrong)} complete answers whose row is not 'ok' with the same prompt and "
            "completion tokens",
        ),
        Check(
            "left streams: ledger >= chunks received",
            not short,
            f"{len(short)} streams the client left whose row is neither 'cancelled' nor 'ok' "
            "or counts fewer tokens than the content chunks received",
        ),
        Check(
            "'cancelled' only for streams the client left",
            not cancelled_complete,
            f"{len(cancelled_complete)} other requests recorded as cancelled",
        ),
        Check("no request recorded as error", not errors, f"{len(errors)} rows with status error"),
        Check(
            "ledger totals == usage received + partial",
            not sums_differ,
            "; ".join(sums_differ) or "every tenant's /usage totals match",
        ),
    ]


def check_metrics(
    metrics: Samples,
    outcomes: list[Outcome],
    rows: Rows,
    tenants: list[str],
) -> Check:
    """Per tenant: requests by status, quota rejections and tokens in ``/metrics`` equal what
    the ledger recorded and the clients saw."""

    def total(name: str, tenant: str) -> dict[str, float]:
        by_status: dict[str, float] = {}
        for labels, value in metrics.get(name, []):
            if labels.get("tenant") == tenant and value:
                status = labels.get("status", "")
                by_status[status] = by_status.get(status, 0.0) + value
        return by_status

    differ = []
    for tenant in tenants:
        mine = [row for row in rows.values() if row["tenant_id"] == tenant]
        expected: Counter[str] = Counter(row["status"] for row in mine)
        expected.update(
            o.error_code or "" for o in outcomes if o.spec.tenant == tenant and o.status != 200
        )
        seen = {
            "requests": total("lora_gateway_requests_total", tenant),
            "rejections": sum(total("lora_gateway_quota_rejections_total", tenant).values()),
            "prompt_tokens": sum(total("lora_gateway_prompt_tokens_total", tenant).values()),
            "completion_tokens": sum(
                total("lora_gateway_completion_tokens_total", tenant).values()
            ),
        }
        want = {
            "requests": {k: float(v) for k, v in expected.items()},
            "rejections": float(sum(o.status == 429 for o in outcomes if o.spec.tenant == tenant)),
            "prompt_tokens": float(sum(row["prompt_tokens"] for row in mine)),
            "completion_tokens": float(sum(row["completion_tokens"] for row in mine)),
        }
        if seen != want:
            differ.append(f"{tenant}: /metrics {seen}, expected {want}")
    return Check(
        "/metrics == ledger and clients",
        not differ,
        "; ".join(differ) or "requests by status, rejections and tokens match per tenant",
    )


def check_quota_store(
    quota: dict[str, Any], totals: dict[str, dict[str, int]], leases_during: int
) -> list[Check]:
    """No lease or open reservation is left, though leases were seen during the load; each
    tenant's budget counter (reserved worst cases, moved to the actual tokens when settled)
    equals its ledger's prompt + completion tokens."""
    held = {subject: n for subject, n in quota["leases"].items() if n}
    differ = {
        tenant: (quota["budget"].get(tenant, 0), t["prompt_tokens"] + t["completion_tokens"])
        for tenant, t in totals.items()
        if quota["budget"].get(tenant, 0) != t["prompt_tokens"] + t["completion_tokens"]
    }
    return [
        Check(
            "no leased slot after the run",
            not held and quota["open_reservations"] == 0 and leases_during > 0,
            f"leases held {held or 0}, open reservations {quota['open_reservations']} "
            f"(at most {leases_during} held at once during the load)",
        ),
        Check(
            "budget counters == ledger tokens",
            not differ,
            f"(charged, ledger) differ for {differ}" if differ else "every tenant's month matches",
        ),
    ]


def check_rss(samples: list[tuple[float, int, int]], max_growth_mib: float) -> Check:
    """The gateway process's RSS (KiB, the second of each sample) from the first sample
    (after the warm-up) to the last (after the idle) grew by at most ``max_growth_mib``."""
    start, end = samples[0][1], samples[-1][1]
    growth = (end - start) / 1024
    return Check(
        "gateway RSS bounded",
        growth <= max_growth_mib,
        f"start {start / 1024:.0f} MiB, end {end / 1024:.0f} MiB, growth {growth:+.0f} MiB "
        f"(limit {max_growth_mib:.0f})",
    )


def check_log(log: str) -> Check:
    """The gateway logged no error and no traceback (vLLM's ``ERROR <date>`` lines and ours,
    ``ERROR <logger>: ...``, alike)."""
    errors = [
        line
        for line in log.splitlines()
        if "Traceback (most recent call last)" in line or "ERROR " in line
    ]
    return Check(
        "no error in the gateway's log",
        not errors,
        f"{len(errors)} lines" + (f", first: {errors[0][:200]}" if errors else ""),
    )
