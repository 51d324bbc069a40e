"""The ``synchronize()`` lines of :class:`~migrate.model_uses.ModelUses`, planned once every
use of the wrapped model is known.

A function of the file that evaluates or saves the model it gets (``evaluate(model)``) takes
``model.synchronize()`` inside itself. When the file also calls it with another object (the
EMA copy: ``evaluate(model_ema)``, a model restored from a checkpoint), that line would fail
on the other object; when the function does not train the model, the same line before each
call that hands it the RoundPipe model waits for the same step (nothing in between changes
the weights), so it goes there instead. The lines are planned in the order they were asked
for, so a file without such a function gets exactly the lines it got before.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import libcst as cst

from .synchronize import Synchronizations

__all__ = ["DeferredSynchronizations", "Redirect"]

#: where a ``<model>.synchronize()`` asked for before ``node`` goes instead: (node, model) pairs, or None
Redirect = Callable[[cst.CSTNode, str], Optional[Sequence[Tuple[cst.CSTNode, str]]]]


class DeferredSynchronizations:
    """Records :meth:`Synchronizations.before`/``after_training`` requests; :meth:`replay` plans them."""

    def __init__(self, syncs: Synchronizations) -> None:
        self._syncs = syncs
        # (after training?, node, model, why, since, entered right after training?)
        self._asked: List[Tuple[bool, cst.CSTNode, str, str, int, bool]] = []

    def before(self, node: cst.CSTNode, model: str, why: str) -> None:
        self._asked.append((False, node, model, why, 0, False))

    def after_training(
        self, node: cst.CSTNode, model: str, why: str, since: int = 0, entered_trained: bool = False
    ) -> None:
        self._asked.append((True, node, model, why, since, entered_trained))

    def trains(self, node: cst.CSTNode, model: str) -> bool:
        return self._syncs.trains(node, model)

    def replay(self, redirect: Redirect) -> None:
        """Plan every request in order; a ``before`` request that ``redirect`` moves is planned
        before each node it names instead."""
        for after_training, node, model, why, since, entered_trained in self._asked:
            if after_training:
                self._syncs.after_training(node, model, why, since, entered_trained)
                continue
            moved = redirect(node, model)
            for target, name in moved if moved is not None else [(node, model)]:
                self._syncs.before(target, name, why)
        self._asked.clear()
