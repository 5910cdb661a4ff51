"""What holds back or marks a node's rounds from outside it: the commitment backlog and a
missing stream.

Owns two pieces of round-loop state and their log lines: the pause while more than
``ledger.max_pending`` commitments wait for the chain (commitments never wait on other
nodes', so only a chain that is down or slower than the rounds fills the backlog; nothing is
dropped meanwhile), and whether the swarm's stream was found missing when the round
published (the node then trains on its own groups). Both reach the next round report
(``backlog_wait_s``, ``stream_missing``, and the bound ``max_pending``), hence status,
metrics and the explorer. Does not know how rounds
run or how commitments land (:mod:`sapo_async.ledger.recorder`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio

from sapo_async import limits
from sapo_async.ledger.recorder import Recorder

__all__ = ["RoundPacing"]


class RoundPacing:
    """The backlog pause and the stream-missing mark of one node's rounds.

    Args:
        recorder: the node's recorder (None: no ledger, never paused).
        max_pending: ``ledger.max_pending``.
        log: the round loop's bound logger.
    """

    def __init__(self, recorder: Recorder | None, max_pending: int, log: Any) -> None:
        self._recorder = recorder
        self.max_pending = max_pending
        """The bound: rounds pause while more commitments than this are pending."""
        self._log = log
        self._waited_s = 0.0
        self.backlog_paused = False
        """Whether rounds are paused now for the commitment backlog."""
        self._paused = anyio.Event()  # set while paused; a fresh one after each resume
        self.stream_missing = False
        """Whether the last round's publishes found the swarm's stream gone."""

    async def wait_backlog(self, stopping: Callable[[], bool]) -> None:
        """Return once at most ``max_pending`` commitments are pending, or ``stopping()``."""
        recorder = self._recorder
        if recorder is None or recorder.statistics().pending <= self.max_pending:
            return
        t0 = time.perf_counter()
        self.backlog_paused = True
        self._paused.set()
        pending = recorder.statistics().pending
        self._log.warning(
            "rounds_paused_for_backlog", pending=pending, max_pending=self.max_pending
        )
        while not stopping():
            try:
                await recorder.wait_backlog(self.max_pending, limits.LEDGER_BACKLOG_CHECK_S)
            except TimeoutError:
                continue  # still paused; looks for a stop request every few seconds
            break
        self._waited_s += time.perf_counter() - t0
        self.backlog_paused = False
        self._paused = anyio.Event()
        self._log.info("rounds_resumed_after_backlog", waited_s=round(self._waited_s, 3))

    async def wait_paused(self) -> None:
        """Wait until rounds pause for the backlog (at once if they are paused now)."""
        await self._paused.wait()

    def take_report_fields(self) -> dict[str, Any]:
        """What the next round report says of the pacing: ``backlog_wait_s`` (seconds
        paused since the last call), ``stream_missing`` and ``max_pending``."""
        waited, self._waited_s = self._waited_s, 0.0
        return {
            "backlog_wait_s": waited,
            "stream_missing": self.stream_missing,
            "max_pending": self.max_pending,
        }

    def published(self, *, missing: bool, round_: int | None) -> None:
        """Note whether this round's publishes found the stream missing (logs changes)."""
        if missing == self.stream_missing:
            return
        self.stream_missing = missing
        if missing:
            self._log.warning("stream_missing", round=round_)
        else:
            self._log.info("stream_restored", round=round_)
