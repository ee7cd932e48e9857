"""Prometheus exposition of the daemon's own counters, from one CollectorRegistry per daemon.

Each subsystem keeps plain counters and a ``stats()`` dict (the single source for /status and
/metrics); ``StatsCollector`` turns them into metric families at scrape time.

Invariant: a key is a gauge only if its source names it in ``gauges``; every other key is a
monotonic counter exported as ``edgefed_gateway_<subsystem>_<key>_total``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "edgefed_gateway"


@dataclass(frozen=True)
class _Source:
    subsystem: str
    stats: Callable[[], Mapping[str, float]]
    gauges: frozenset[str]


@dataclass(frozen=True)
class _Labeled:
    name: str
    help: str
    label: str
    values: Callable[[], Mapping[str, float]]


class StatsCollector:
    def __init__(self, gateway_id: str) -> None:
        self.gateway_id = gateway_id
        self._sources: list[_Source] = []
        self._labeled: list[_Labeled] = []

    def add(
        self, subsystem: str, stats: Callable[[], Mapping[str, float]], gauges: set[str] | None = None
    ) -> None:
        self._sources.append(_Source(subsystem, stats, frozenset(gauges or ())))

    def add_labeled_counter(
        self, name: str, help_text: str, label: str, values: Callable[[], Mapping[str, float]]
    ) -> None:
        self._labeled.append(_Labeled(name, help_text, label, values))

    def collect(self) -> Iterator[Metric]:
        for source in self._sources:
            for key, value in sorted(source.stats().items()):
                name = f"{PREFIX}_{source.subsystem}_{key}"
                if key in source.gauges:
                    yield GaugeMetricFamily(name, f"{source.subsystem} {key}", value=value)
                else:
                    yield CounterMetricFamily(name, f"{source.subsystem} {key}", value=value)
        for labeled in self._labeled:
            family = CounterMetricFamily(f"{PREFIX}_{labeled.name}", labeled.help, labels=[labeled.label])
            for label_value, value in sorted(labeled.values().items()):
                family.add_metric([label_value], value)
            yield family


def make_registry(collector: StatsCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
