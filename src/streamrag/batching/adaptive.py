"""The adaptive batch-size controller: as large as the latency target allows.

Bigger embedding batches use the embedder better, up to a point; they also
make every change in them wait longer. The controller keeps the target batch
size where one embed call takes about ``target_latency_s``:

* after each batch it measures the embed latency ``L`` of ``n`` chunks;
* if ``L`` is over the target, it shrinks the target to ``n · target / L``;
* if ``L`` is under the target **and work is queued** (more than a batch is
  waiting), it grows the target the same way — at most doubling per step;
* if ``L`` is under the target but nothing is waiting, it holds: a small batch
  flushed by its deadline says nothing about how large a batch could be.

For an embedder whose latency grows linearly, ``L(n) = a + b·n``, the update
``n' = n · T / L(n)`` has its fixed point where ``L(n) = T`` and reaches it
without oscillating (its slope there is ``a / T < 1``). The target always stays
within ``[min_size, max_size]``.

>>> c = AdaptiveController(min_size=1, max_size=1000, target_latency_s=0.1, initial=10)
>>> c.observe(10, 0.2, queued=0)   # twice the target: halve
'shrink'
>>> c.target
5
>>> c.observe(5, 0.05, queued=100)  # half the target with work waiting: double
'grow'
>>> c.target
10
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamrag.errors import ArgumentError

__all__ = ["AdaptiveController", "Decision"]


@dataclass(frozen=True, slots=True)
class Decision:
    """One step of the controller, kept for metrics and benchmarks."""

    batch: int
    latency_s: float
    queued: int
    action: str
    target: int


@dataclass
class AdaptiveController:
    """Sets the micro-batch target size from measured embed latency and queue depth."""

    min_size: int
    max_size: int
    target_latency_s: float
    initial: int | None = None
    max_step: float = 2.0
    history_size: int = 256
    target: int = field(init=False)
    history: list[Decision] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.min_size <= self.max_size:
            msg = f"need 1 <= min_size <= max_size, found {self.min_size} and {self.max_size}"
            raise ArgumentError(msg)
        if self.target_latency_s <= 0:
            msg = f"the latency target must be positive, found {self.target_latency_s} s"
            raise ArgumentError(msg)
        start = self.initial if self.initial is not None else self.min_size
        self.target = min(self.max_size, max(self.min_size, start))

    def observe(self, batch: int, latency_s: float, *, queued: int) -> str:
        """Account for one embed call of ``batch`` chunks; returns grow, shrink or hold."""
        if batch <= 0:
            return "hold"
        proposal = batch * self.target_latency_s / max(latency_s, 1e-9)
        proposal = min(proposal, self.target * self.max_step)
        proposal = max(proposal, self.target / self.max_step)
        new = self.target
        if latency_s > self.target_latency_s:
            new = round(proposal)
        elif queued >= self.target:
            new = max(self.target, round(proposal))
        new = min(self.max_size, max(self.min_size, new))
        action = "grow" if new > self.target else "shrink" if new < self.target else "hold"
        self.target = new
        self.history.append(Decision(batch, latency_s, queued, action, new))
        del self.history[: -self.history_size]
        return action
