"""Convergence under asynchronous 1F1B: stale weights cost iterations.

Synchronous schedules (GPipe, 1F1B with a flush) take one optimiser step per iteration at the
global batch M * micro_batch and follow the workload's fitted convergence model
(:mod:`sim.convergence`) unchanged. Asynchronous 1F1B (PipeDream's weight stashing) updates after
every micro-batch, and stage s computes its gradient on weights tau_s = S - 1 - s updates old.
DynPipe's analysis bounds the iterations to a target by a term that grows with the staleness,
as S^3 over the stages; here the progress of one update is divided by

    phi(S) = 1 + kappa * sum_s tau_s ** 2 = 1 + kappa * (S - 1) S (2 S - 1) / 6       # ~ S^3 / 3

    progress per update = r(micro_batch, p) / phi(S)          # r: sim.scaling's progress per step

Source of the form: the S^3 growth of DynPipe's convergence bound (IEEE TPDS 2025; see
``shared/PRIOR_ART.md``). ``kappa`` is a parameter, NOT a fitted value: the paper's constant is not
at hand and no delayed-gradient runs of this project measure it yet. The default 0.01 makes a
4-stage pipeline need 1.14x the updates and an 8-stage one 2.4x.
"""

from __future__ import annotations

from sim.validation import check_int, check_range

DEFAULT_KAPPA = 0.01


def staleness_penalty(stages: int, kappa: float = DEFAULT_KAPPA) -> float:
    """phi(S): how many times more updates asynchronous 1F1B over ``stages`` stages needs."""
    S = check_int("stages", stages, 1)
    check_range("staleness kappa", kappa, 0.0, 10.0)
    return 1.0 + kappa * (S - 1) * S * (2 * S - 1) / 6.0
