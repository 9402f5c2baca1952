"""Histograms observed on the event loop alone, for what every response written reports.

prometheus_client's `Histogram.observe` walks the bounds one by one and takes a
lock for the sum and another for the bucket; every xDS response written makes
three observations. `LoopHistogram` counts with one bisect into plain
integers, and shapes the counts into Prometheus' histogram only when scraped: the
same names, buckets, `_count`, `_sum` and `_created` samples as
prometheus_client's own. It holds no lock, so only the event loop's thread may
observe it (a scrape reads it from the same loop, or from a thread whose reading
a count one observation old is harmless).
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

# How prometheus_client writes a bucket's bound as its `le` label (1 as 1.0, 1e6 as 1e+06).
_le: Callable[[float], str] = floatToGoString


class Series:
    """One labelled series: a count per bucket (the last: above every bound) and a sum."""

    __slots__ = ("_bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound counts in that bound's bucket (le).
        self.counts[bisect.bisect_left(self._bounds, value)] += 1
        self.sum += value


class LoopHistogram(Collector):
    """A histogram with at most one label, its series made on first use."""

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], label: str | None = None
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = tuple(sorted(float(b) for b in buckets))
        self._label = label
        self._series: dict[str, Series] = {}
        if label is None:
            self._series[""] = Series(self._bounds)  # shown before the first observation

    def series(self, value: str = "") -> Series:
        """The series for this label value (the unlabelled one: no value)."""
        series = self._series.get(value)
        if series is None:
            series = self._series[value] = Series(self._bounds)
        return series

    def observe(self, value: float) -> None:
        """Observe the unlabelled series."""
        self._series[""].observe(value)

    def collect(self) -> Iterator[Metric]:
        labels = [self._label] if self._label is not None else []
        family = HistogramMetricFamily(self._name, self._documentation, labels=labels)
        created: list[Sample] = []
        les = [_le(b) for b in (*self._bounds, math.inf)]
        for value, series in self._series.items():  # as made: prometheus_client's order
            label_values = [value] if self._label is not None else []
            cumulative = itertools.accumulate(list(series.counts))
            family.add_metric(label_values, list(zip(les, cumulative, strict=True)), series.sum)
            named = dict(zip(labels, label_values, strict=True))
            created.append(Sample(f"{self._name}_created", named, series.created))
        family.samples.extend(created)
        yield family
