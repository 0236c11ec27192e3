# SPDX-License-Identifier: Apache-2.0
"""Metrics and counters in PyTorch/XLA's text format (torch_xla.debug.metrics.metrics_report).

A metric keeps every sample (seconds, or a count); the report prints TotalSamples, the
Accumulator, ValueRate and Rate per second of host time since the first sample, and
percentiles, formatted as PyTorch/XLA formats times (``01s234ms567.890us``). A counter is a
value. Names follow PyTorch/XLA: CompileTime, ExecuteTime, TransferToDeviceTime,
TransferFromDeviceTime; CachedCompile, UncachedCompile, MarkStep and ``aten::NAME`` for every
op run by the CPU fallback.
"""

import time

_PERCENTILES = (1, 5, 10, 20, 50, 80, 90, 95, 99)


def format_seconds(s: float) -> str:
    """PyTorch/XLA's time format: ``02s005ms300.000us``, ``226ms137.620us``, ``006.378us``."""
    us_total = s * 1e6
    secs = int(us_total // 1_000_000)
    ms = int((us_total - secs * 1_000_000) // 1000)
    us = us_total - secs * 1_000_000 - ms * 1000
    out = ""
    if secs:
        out += f"{secs:02d}s"
    if secs or ms:
        out += f"{ms:02d}ms"
    return out + f"{us:07.3f}us"


class Metric:
    """Samples of one quantity; ``seconds`` says whether they are times."""

    def __init__(self, seconds: bool = True):
        self.seconds = seconds
        self.samples = []
        self.first = None

    def add(self, value: float) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        self.samples.append(float(value))

    @property
    def total(self) -> float:
        return sum(self.samples)

    def _fmt(self, v: float) -> str:
        return format_seconds(v) if self.seconds else f"{v:.2f}"

    def report(self, name: str) -> str:
        n = len(self.samples)
        elapsed = max(time.perf_counter() - (self.first or time.perf_counter()), 1e-9)
        ordered = sorted(self.samples)
        pct = "; ".join(
            f"{p}%={self._fmt(ordered[min(n - 1, int(p / 100 * n))])}" for p in _PERCENTILES)
        return (f"Metric: {name}\n  TotalSamples: {n}\n  Accumulator: {self._fmt(self.total)}\n"
                f"  ValueRate: {self._fmt(self.total / elapsed)} / second\n"
                f"  Rate: {n / elapsed:.6g} / second\n  Percentiles: {pct}\n")


class Metrics:
    """The registry of one process (as PyTorch/XLA's)."""

    def __init__(self):
        self.metrics = {}
        self.counters = {}

    def metric(self, name: str, seconds: bool = True) -> Metric:
        if name not in self.metrics:
            self.metrics[name] = Metric(seconds)
        return self.metrics[name]

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def clear(self) -> None:
        self.metrics.clear()
        self.counters.clear()

    def report(self) -> str:
        out = "".join(m.report(k) for k, m in self.metrics.items() if m.samples)
        out += "".join(f"Counter: {k}\n  Value: {v}\n" for k, v in self.counters.items() if v)
        return out


METRICS = Metrics()
