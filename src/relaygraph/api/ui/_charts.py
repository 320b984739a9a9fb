"""The usage chart: one stacked bar per day, a segment per agent, laid out for SVG."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

from relaygraph.api.ui._queries import DailyUsage

WIDTH = 760
HEIGHT = 260
LEFT = 64
BOTTOM = 30
TOP = 12
MAX_LABELS = 12
LABEL_HALF_W = 18
"""Half the width of a day's label ("Jan 31" at 10 px): none is placed closer to an edge."""
SERIES = 8
"""Colours in the stylesheet (``series-0`` .. ``series-7``); more agents reuse them."""

Metric = Literal["tokens", "cost_usd"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Segment:
    day: str
    agent: str
    value: float
    x: float
    y: float
    width: float
    height: float
    series: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Tick:
    value: float
    y: float


@dataclass(frozen=True, kw_only=True, slots=True)
class DayLabel:
    day: str
    x: float


@dataclass(frozen=True, kw_only=True, slots=True)
class DayRow:
    """One day of the chart as a table row (for readers who cannot see the bars)."""

    day: str
    """The UTC day, ``2026-01-31``."""
    tasks: int
    values: tuple[float, ...]
    """The metric of each agent, in the legend's order."""
    total: float


@dataclass(frozen=True, kw_only=True, slots=True)
class UsageChart:
    # The drawing's size and axes are the layout's, the same for every chart.
    width: ClassVar[int] = WIDTH
    height: ClassVar[int] = HEIGHT
    left: ClassVar[int] = LEFT
    """Where the bars start: the value axis's labels are to its left."""
    bottom: ClassVar[int] = HEIGHT - BOTTOM
    """The bars' base line."""
    metric: Metric
    segments: tuple[Segment, ...]
    ticks: tuple[Tick, ...]
    labels: tuple[DayLabel, ...]
    legend: tuple[tuple[str, int], ...]
    """Each agent and its colour."""
    rows: tuple[DayRow, ...]
    """The same figures, a row per day."""
    total: float


def _value(entry: dict[str, float], metric: Metric) -> float:
    if metric == "tokens":
        return float(entry.get("input_tokens", 0) + entry.get("output_tokens", 0))
    return float(entry.get("cost_usd", 0.0))


def _nice_top(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above ``value``."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= value)


def usage_chart(daily: DailyUsage, metric: Metric) -> UsageChart:
    """Lay out ``daily`` as stacked bars of ``metric``, the agents in a fixed order."""
    agents = sorted({agent for day in daily.days for agent in day.agents})
    series = {agent: i % SERIES for i, agent in enumerate(agents)}
    totals = [sum(_value(e, metric) for e in day.agents.values()) for day in daily.days]
    top = _nice_top(max(totals, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - TOP
    slot = plot_w / max(len(daily.days), 1)
    bar_w = max(1.0, slot * 0.7)
    base = UsageChart.bottom
    segments = []
    for i, day in enumerate(daily.days):
        x = LEFT + i * slot + (slot - bar_w) / 2
        y = float(base)
        for agent in agents:
            value = _value(day.agents.get(agent) or {}, metric)
            if value <= 0:
                continue
            height = value / top * plot_h
            y -= height
            segments.append(
                Segment(
                    day=day.date.isoformat(),
                    agent=agent,
                    value=value,
                    x=x,
                    y=y,
                    width=bar_w,
                    height=height,
                    series=series[agent],
                )
            )
    # Every so many days a label, counted back from the last day: the latest day, the one
    # a reader looks for first, always has its label.
    every = max(1, math.ceil(len(daily.days) / MAX_LABELS))
    last = len(daily.days) - 1
    labels = tuple(
        DayLabel(
            day=day.date.strftime("%b %d"),
            x=min(LEFT + i * slot + slot / 2, WIDTH - LABEL_HALF_W),
        )
        for i, day in enumerate(daily.days)
        if (last - i) % every == 0
    )
    ticks = tuple(Tick(value=top * k / 4, y=base - plot_h * k / 4) for k in range(5))
    return UsageChart(
        metric=metric,
        segments=tuple(segments),
        ticks=ticks,
        labels=labels,
        legend=tuple((agent, series[agent]) for agent in agents),
        rows=tuple(
            DayRow(
                day=day.date.isoformat(),
                tasks=day.tasks,
                values=tuple(_value(day.agents.get(agent) or {}, metric) for agent in agents),
                total=total,
            )
            for day, total in zip(daily.days, totals, strict=True)
        ),
        total=sum(totals),
    )
