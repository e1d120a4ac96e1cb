"""Metrics of a test module's own in place of the process's, for tests that read what the code
under test counted outside a gateway.

The process's metrics (``app.metrics``, in prometheus_client's ``REGISTRY``) are shared with
every gateway a test of the same worker runs, and each gateway's start and stop clears their
children and moves their values to another storage (``app.metrics.multiprocess_dir``): a
count read there before and after may not be this test's alone (CI once read 20 usage
records dropped that were not the test's). Code that looks its metric up on ``app.metrics``
at each use (``metrics.NAME.labels(...)``) counts in the copies instead; a module that binds
it at import (``metrics.Children(metrics.NAME)``) is named to :meth:`OwnMetrics.install`."""

from __future__ import annotations

from types import ModuleType

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.metrics import MetricWrapperBase

from app import metrics


class _InMemory(MetricWrapperBase):
    """A metric whose values stay in this process's memory, whatever storage the process's
    metrics use now: while a gateway runs in the worker (on a thread, for the whole session)
    they are slots in its files, keyed by the metric's name and labels, so a copy's child would
    read the original's count, every earlier test's included."""

    def _metric_init(self) -> None:
        shared = values.ValueClass
        values.ValueClass = values.MutexValue
        try:
            super()._metric_init()
        finally:
            values.ValueClass = shared


class _Counter(_InMemory, Counter):
    pass


class _Gauge(_InMemory, Gauge):
    pass


class _Histogram(_InMemory, Histogram):
    pass


class OwnMetrics:
    """A copy of each of ``app.metrics``' ``names`` (same name, labels and buckets: read
    with the same sample names) in a registry of their own, its values in memory."""

    def __init__(self, *names: str) -> None:
        self.registry = CollectorRegistry()
        self._copies: dict[str, Counter | Gauge | Histogram] = {}
        for name in names:
            metric = getattr(metrics, name)
            common = {"labelnames": metric._labelnames, "registry": self.registry}
            if isinstance(metric, Counter):
                copy: Counter | Gauge | Histogram = _Counter(
                    metric._name, metric._documentation, **common
                )
            elif isinstance(metric, Gauge):
                copy = _Gauge(metric._name, metric._documentation, **common)
            elif isinstance(metric, Histogram):
                buckets = metric._upper_bounds
                copy = _Histogram(metric._name, metric._documentation, buckets=buckets, **common)
            else:
                raise TypeError(f"{name}: a {type(metric).__name__} is not copied")
            self._copies[name] = copy

    def install(self, monkeypatch: pytest.MonkeyPatch, *users: ModuleType) -> None:
        """The copies in the originals' place for as long as ``monkeypatch`` lasts, in
        ``app.metrics`` and in the ``metrics.Children`` caches of them that ``users`` (modules)
        bound at import."""
        for name, copy in self._copies.items():
            original = getattr(metrics, name)
            monkeypatch.setattr(metrics, name, copy)
            for module in users:
                for attribute, value in vars(module).items():
                    if isinstance(value, metrics.Children) and value.metric is original:
                        monkeypatch.setattr(module, attribute, metrics.Children(copy))

    def value(self, sample: str, **labels: str) -> float:
        """The sample's value, 0 while nothing was counted in it."""
        return self.registry.get_sample_value(sample, labels) or 0.0
