"""The online learner's rollback test: is a promoted version measurably slower than its parent on
the jobs it served? (``LearnerConfig.rollback_test``; see :mod:`dynamix_gym.service.learner`.)"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The smallest seed-noise variance of log time to accuracy the rollback test assumes for a task
#: (a 1% standard deviation): a task measured twice alike must not weigh without bound.
NOISE_FLOOR_VAR = 1e-4

#: (version, task) -> the measured times to accuracy (s) of that version's ended jobs on that task.
Measured = dict[tuple[int, str], list[float]]


def window_ratios(measured: Measured, version: int, parent: int) -> list[float]:
    """Measured TTA of ``version``'s jobs / the ``parent``'s mean on the same task."""
    out = []
    for (v, task), ttas in list(measured.items()):
        ref = measured.get((parent, task))
        if v == version and ref:
            mean_ref = float(np.mean(ref))
            out += [t / mean_ref for t in ttas]
    return out


def measured_regression(measured: Measured, version: int, parent: int, cfg: Any) -> dict[str, Any] | None:
    """The measured regression of ``version`` against ``parent``, or ``None`` before
    ``cfg.rollback_window`` of its jobs have ended: ``ratio`` (its time to accuracy over the
    parent's), ``jobs``, ``rollback`` (the decision) and, for the stratified test, ``p_value``
    and ``df`` (``None`` without a noise estimate)."""
    jobs = sum(len(t) for (v, _), t in measured.items() if v == version)
    if jobs < cfg.rollback_window:
        return None
    if cfg.rollback_test == "window":
        ratios = window_ratios(measured, version, parent)[-cfg.rollback_window :]
        if not ratios:
            return None
        ratio = float(np.mean(ratios))
        return {"ratio": ratio, "jobs": jobs, "rollback": ratio > 1.0 + cfg.rollback_tolerance}
    from scipy import stats

    logs = {k: np.log(np.asarray(t, dtype=np.float64)) for k, t in measured.items()}
    diffs, sizes, noise = [], [], []
    for (v, task), lv in logs.items():
        lp = logs.get((parent, task))
        if v != version or lp is None or not len(lp):
            continue
        diffs.append(float(lv.mean() - lp.mean()))
        sizes.append(1.0 / len(lv) + 1.0 / len(lp))
        # the task's seed noise: the pooled within-group variance of every version's jobs on it
        groups = [g for (_, t), g in logs.items() if t == task and len(g) > 1]
        df_k = sum(len(g) - 1 for g in groups)
        ss_k = sum(float(((g - g.mean()) ** 2).sum()) for g in groups)
        noise.append((max(ss_k / df_k, NOISE_FLOOR_VAR), df_k) if df_k else None)
    if not diffs:
        return None
    known = [i for i, n in enumerate(noise) if n is not None]
    out: dict[str, Any] = {"jobs": jobs, "p_value": None, "df": None}
    if known:  # inverse-variance weights over the tasks whose noise is known (Welch-Satterthwaite df)
        var = np.array([noise[i][0] * sizes[i] for i in known])
        w = (1.0 / var) / (1.0 / var).sum()
        effect = float(np.dot(w, [diffs[i] for i in known]))
        se2 = float((w**2 * var).sum())
        df = se2**2 / float(sum((w[j] ** 2 * var[j]) ** 2 / noise[i][1] for j, i in enumerate(known)))
        out["df"] = df
    else:
        w = 1.0 / np.asarray(sizes)
        effect = float(np.dot(w, diffs) / w.sum())
    out["ratio"] = ratio = float(np.exp(effect))
    if ratio <= 1.0 + cfg.rollback_tolerance:
        out["rollback"] = False
    elif ratio > 1.0 + cfg.rollback_gross:
        out["rollback"] = True
    elif not known:
        out["rollback"] = False  # no noise estimate yet: wait for a second job of some group
    else:
        out["p_value"] = float(stats.t.sf(effect / np.sqrt(se2), out["df"]))
        out["rollback"] = out["p_value"] < cfg.rollback_alpha
    return out
