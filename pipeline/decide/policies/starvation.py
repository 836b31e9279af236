"""The starvation signal: a dataset that has groups in flight but no trained row, step after step.

Why: oldest-first selection under per-dataset bounds can leave a slow dataset (long responses,
a tight bound) with no share of the batch while its groups are still generating, and nothing
else says so (RFC #7579 §9.1: a dataset silently dropping to zero share). Each step's first batch
is one observation: every dataset with a group in flight (pending or running) when the batch is
chosen and no trajectory in it is one step further into a stretch; a dataset that gets a row, or
has nothing in flight, ends its stretch. At exactly ``steps`` consecutive steps the dataset is
named in a warning (once per stretch), and every batch while it lasts counts it in the metric
``<prefix>/dataset/starved``. The lake view `starved_stretches` lists the same stretches from
the decision log. Groups without a dataset are not counted; the counts start again after a
restart (the view reads the whole history).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.state import PartitionState

log = logging.getLogger("replaylake")
METRIC = "dataset/starved"
"""The metric key (after the `training/` or `validation/` prefix): datasets starved now."""
EVENT = "starved_datasets"


@dataclass(frozen=True)
class Starvation:
    """``steps``: how many consecutive steps without a trained row make a dataset starved
    (None: the signal is off)."""

    steps: int | None = None

    def observe(self, part: PartitionState, step: int, trained: Iterable[str | None]
                ) -> dict[str, int]:
        """Count one step of ``part`` whose batch holds rows of the ``trained`` datasets; the
        metrics of the signal (empty when off). A step observed before is not counted again."""
        if self.steps is None:
            return {}
        if part.starving_step is None or step != part.starving_step:
            part.starving_step = step
            waiting = {part.groups[u].dataset for u in part.inflight} - set(trained) - {None}
            part.starving = {d: part.starving.get(d, 0) + 1 for d in waiting}
            newly = sorted(d for d, n in part.starving.items() if n == self.steps)
            if newly:
                log.warning("sample(step=%d, %s): dataset(s) %s had groups in flight but no "
                            "trained row for %d consecutive steps (starvation_steps=%d): check "
                            "their bounds and generation speed; the lake view starved_stretches "
                            "lists every stretch", step, part.partition, ", ".join(newly),
                            self.steps, self.steps, extra={"replaylake_event": EVENT})
        starved = sum(1 for n in part.starving.values() if n >= self.steps)
        return {METRIC: starved} if starved else {}
