"""Incremental aggregations for windows: fold each element into an accumulator.

A window keeps one small accumulator, not the elements it has seen (unless you
ask for the raw collection with :class:`Collect`). An :class:`Aggregator` says
how to start one (``create``), fold an element in (``add``), combine two
(``merge`` — needed when session windows merge, and to fold a batch's partial
results into the running state) and read the answer out (``result``). This is
Beam's ``CombineFn`` and Flink's ``AggregateFunction``.

Numeric aggregators are also :class:`Columnar`: their accumulator is a few
float64 columns, so the window operator can keep window state in numpy arrays
and fold a whole micro-batch at once (:mod:`.columnar`).

Accumulators must be plain data (numbers, strings, lists) so that window state
can be written into a checkpoint.

>>> c = Count()
>>> c.result(c.merge(c.add(c.create(), "x"), c.add(c.create(), "y")))
2
>>> m = Mean()
>>> m.result(m.add(m.add(m.create(), 1.0), 2.0))
1.5
"""

# ruff: noqa: D102  (the methods are documented once, on the Aggregator protocol)
from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "Collect",
    "Columnar",
    "Count",
    "Max",
    "Mean",
    "Min",
    "Sum",
]

F64 = npt.NDArray[np.float64]


class Aggregator(Protocol):
    """How a window folds its elements into one result."""

    name: str

    def create(self) -> Any:
        """An empty accumulator."""
        ...

    def add(self, acc: Any, value: Any) -> Any:
        """Fold one element's value in; returns the new accumulator."""
        ...

    def merge(self, a: Any, b: Any) -> Any:
        """Combine two accumulators (order-independent for the built-ins)."""
        ...

    def result(self, acc: Any) -> Any:
        """The window's answer from its accumulator."""
        ...


class Columnar(Protocol):
    """An aggregator whose accumulator is a few float64 columns, for columnar window state.

    ``identity`` is the empty accumulator, ``ufunc`` combines two accumulators
    column by column (``np.add``, ``np.minimum``, ``np.maximum``), ``grouped``
    folds a batch into one row per group, ``results`` reads answers out of rows,
    and ``to_acc``/``from_acc`` convert a row to and from the plain accumulator
    (for checkpoints, which both window-state layouts share).
    """

    name: str
    identity: tuple[float, ...]
    ufunc: np.ufunc

    def grouped(self, values: F64 | None, groups: npt.NDArray[np.intp], n_groups: int) -> F64:
        """One accumulator row per group."""
        ...

    def results(self, state: F64) -> list[Any]:
        """The answer of every row."""
        ...

    def to_acc(self, row: F64) -> Any:
        """The plain accumulator of a row."""
        ...

    def from_acc(self, acc: Any) -> tuple[float, ...]:
        """The row of a plain accumulator."""
        ...


class Count:
    """How many elements (values are ignored)."""

    name = "count"
    needs_value = False
    identity = (0.0,)
    ufunc = np.add

    def create(self) -> int:
        return 0

    def add(self, acc: int, value: Any) -> int:
        return acc + 1

    def merge(self, a: int, b: int) -> int:
        return a + b

    def result(self, acc: int) -> int:
        return acc

    def grouped(self, values: F64 | None, groups: npt.NDArray[np.intp], n_groups: int) -> F64:
        return np.bincount(groups, minlength=n_groups).astype(np.float64)[:, None]

    def results(self, state: F64) -> list[Any]:
        return state[:, 0].astype(np.int64).tolist()  # type: ignore[no-any-return]

    def to_acc(self, row: F64) -> Any:
        return int(row[0])

    def from_acc(self, acc: Any) -> tuple[float, ...]:
        return (float(acc),)


class Sum:
    """The sum of numeric values."""

    name = "sum"
    needs_value = True
    identity = (0.0,)
    ufunc = np.add

    def create(self) -> float:
        return 0.0

    def add(self, acc: float, value: Any) -> float:
        return acc + float(value)

    def merge(self, a: float, b: float) -> float:
        return a + b

    def result(self, acc: float) -> float:
        return acc

    def grouped(self, values: F64 | None, groups: npt.NDArray[np.intp], n_groups: int) -> F64:
        assert values is not None
        sums: F64 = np.bincount(groups, weights=values, minlength=n_groups).astype(np.float64)
        return sums[:, None]

    def results(self, state: F64) -> list[Any]:
        return state[:, 0].tolist()  # type: ignore[no-any-return]

    def to_acc(self, row: F64) -> Any:
        return float(row[0])

    def from_acc(self, acc: Any) -> tuple[float, ...]:
        return (float(acc),)


class _Extreme:
    """The smallest or largest numeric value: ``ufunc`` says which."""

    name = ""
    needs_value = True
    identity: tuple[float, ...] = ()
    ufunc: np.ufunc = np.minimum

    def create(self) -> float:
        return self.identity[0]

    def add(self, acc: float, value: Any) -> float:
        return float(self.ufunc(acc, float(value)))

    def merge(self, a: float, b: float) -> float:
        return float(self.ufunc(a, b))

    def result(self, acc: float) -> float:
        return acc

    def grouped(self, values: F64 | None, groups: npt.NDArray[np.intp], n_groups: int) -> F64:
        assert values is not None
        out = np.full(n_groups, self.identity[0])
        self.ufunc.at(out, groups, values)
        return out[:, None]

    def results(self, state: F64) -> list[Any]:
        return state[:, 0].tolist()  # type: ignore[no-any-return]

    def to_acc(self, row: F64) -> Any:
        return float(row[0])

    def from_acc(self, acc: Any) -> tuple[float, ...]:
        return (float(acc),)


class Min(_Extreme):
    """The smallest numeric value."""

    name = "min"
    identity = (math.inf,)
    ufunc = np.minimum


class Max(_Extreme):
    """The largest numeric value."""

    name = "max"
    identity = (-math.inf,)
    ufunc = np.maximum


class Mean:
    """The arithmetic mean of numeric values; the accumulator is ``[sum, count]``."""

    name = "mean"
    needs_value = True
    identity = (0.0, 0.0)
    ufunc = np.add

    def create(self) -> list[float]:
        return [0.0, 0]

    def add(self, acc: list[float], value: Any) -> list[float]:
        return [acc[0] + float(value), acc[1] + 1]

    def merge(self, a: list[float], b: list[float]) -> list[float]:
        return [a[0] + b[0], a[1] + b[1]]

    def result(self, acc: list[float]) -> float:
        return acc[0] / acc[1] if acc[1] else math.nan

    def grouped(self, values: F64 | None, groups: npt.NDArray[np.intp], n_groups: int) -> F64:
        assert values is not None
        sums = np.bincount(groups, weights=values, minlength=n_groups)
        counts = np.bincount(groups, minlength=n_groups).astype(np.float64)
        return np.stack([sums, counts], axis=1)

    def results(self, state: F64) -> list[Any]:
        return [s / c if c else math.nan for s, c in state.tolist()]

    def to_acc(self, row: F64) -> Any:
        return [float(row[0]), int(row[1])]

    def from_acc(self, acc: Any) -> tuple[float, ...]:
        return (float(acc[0]), float(acc[1]))


class Collect:
    """The raw values, in arrival order — the one aggregator that keeps elements."""

    name = "collect"
    needs_value = True

    def create(self) -> list[Any]:
        return []

    def add(self, acc: list[Any], value: Any) -> list[Any]:
        return [*acc, value]

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        return a + b

    def result(self, acc: list[Any]) -> list[Any]:
        return list(acc)


AGGREGATORS: dict[str, type] = {cls.name: cls for cls in (Count, Sum, Min, Max, Mean, Collect)}
"""Built-in aggregators by the name used in configuration."""
