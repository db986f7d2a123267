"""SMART trends: each wear attribute's daily last value over the past months (metrics_daily) and its
month-over-month growth; the seed's alarm line is growth above 50 % a month."""

from __future__ import annotations

from dataclasses import dataclass

from stethoscope.store.client import Store

GROWTH_ALARM = 50.0  # percent a month
MONTH_DAYS = 30
HISTORY_DAYS = 92
WEAR = (
    "smart_reallocated_sector_ct",
    "smart_reallocated_event_count",
    "smart_current_pending_sector",
    "smart_offline_uncorrectable",
    "smart_reported_uncorrect",
    "smart_uncorrectable_error_cnt",
    "smart_used_rsvd_blk_cnt_tot",
    "smart_wear_leveling_count",
    "smart_udma_crc_error_count",
    "nvme_percentage_used",
    "nvme_media_errors_total",
)


@dataclass
class Trend:
    node_id: str
    device: str
    metric: str
    days: list[str]  # ISO dates
    values: list[float]  # the day's last value
    growth_percent: float | None  # last vs 30 days before (None: no value then, or it was 0 and still is)

    @property
    def alarming(self) -> bool:
        return self.growth_percent is not None and self.growth_percent > GROWTH_ALARM

    @property
    def growth_text(self) -> str:
        if self.growth_percent is None:
            return "n/a"
        if self.growth_percent == float("inf"):
            return "new (from 0)"
        return f"{self.growth_percent:+.1f} %"


def month_growth(values_by_day: list[tuple[int, float]]) -> float | None:
    """(day number, value) ascending: the last value against the last one at least 30 days before it."""
    if not values_by_day:
        return None
    last_day, last = values_by_day[-1]
    before = [v for d, v in values_by_day if d <= last_day - MONTH_DAYS]
    if not before:
        return None
    then = before[-1]
    if then == 0:
        return float("inf") if last > 0 else 0.0
    return (last - then) / abs(then) * 100.0


def smart_trends(store: Store, now_ms: int) -> list[Trend]:
    rows = store.query(
        "SELECT node_id, device, metric_name, groupArray((toUInt32(day), toString(day), last)) FROM ("
        "SELECT node_id, device, metric_name, day, argMaxMerge(last_value) AS last "
        f"FROM {store.database}.metrics_daily WHERE metric_name IN {{wear:Array(String)}} "
        "AND day >= toDate(fromUnixTimestamp64Milli({now:Int64}, 'UTC')) - {days:UInt32} "
        "GROUP BY node_id, device, metric_name, day ORDER BY day) "
        "GROUP BY node_id, device, metric_name ORDER BY node_id, device, metric_name",
        {"wear": list(WEAR), "now": now_ms, "days": HISTORY_DAYS},
    )
    trends = []
    for node, device, metric, points in rows:
        points = sorted(points)
        growth = month_growth([(int(d), float(v)) for d, _, v in points])
        trends.append(
            Trend(
                node, device, metric, [text for _, text, _ in points], [float(v) for *_, v in points], growth
            )
        )
    return trends
