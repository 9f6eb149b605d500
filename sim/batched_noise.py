"""The random draws of one batched interval: per-cluster streams, or one stream for the batch.

:class:`sim.engine.Simulator` draws every random number of an interval up front, in a fixed order,
from the cluster's noise stream (the second child its reset spawns): compute noise (K, n) standard
normals, sync jitter K normals, K unit exponentials of latency, (K + 1, n) gamma factors of |g|^2,
(5, n) normals of measurement noise, n + 1 normals of accuracy noise; then, when it measures, the
Poisson count of TCP retransmissions. The two sources here hand :class:`sim.batched.BatchedSimulator`
those draws as padded arrays ``[clusters, workers, K]`` (``[clusters, K]``, ``[clusters, workers]``;
iterations last, so that the reductions over workers run across contiguous rows), the gamma factors
already reduced to what the report reads of them: per worker their mean over the K iterations and
the mean of their square roots (``[clusters, workers]``):

* :class:`StreamNoise` makes exactly those calls on each cluster's own stream: the batched engine
  then reproduces the SimPy engine's reports (the equivalence test of ``tests/sim/test_batched.py``).
  It costs one generator call per draw kind and cluster.
* :class:`BatchNoise` draws the same distributions with one call per draw kind for the whole batch
  from one generator: the fast path. The reports have the same law, not the same numbers, as the
  per-cluster streams', with one approximation: the K gamma factors of each worker's |g|^2 are not
  drawn; the two figures the report reads of them (their mean and the mean of their roots) come
  from two draws per worker that treat the root as normal (:meth:`BatchNoise._gradient_factors`).

The fault processes never draw from either: their stream is the cluster's own in both cases
(:mod:`sim.fault_timeline`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.batched_world import GRAD_GAMMA

#: Elements (float64) of one chunk of a per-iteration array ``[clusters, workers, K]`` that the
#: batched engine works on at a time: 512 KiB, so that the passes over a chunk stay in a core's L2
#: cache (on 256 clusters of 64 workers a whole array is 6.5 MiB and each pass goes to memory).
CHUNK_ELEMENTS = 1 << 16


def chunk_rows(width: int, iterations: int) -> int:
    """Clusters per chunk of a ``[clusters, width, iterations]`` array (at least one)."""
    return max(1, CHUNK_ELEMENTS // (width * iterations))


@dataclass
class Draws:
    """The raw draws of one interval for a set of clusters (padded slots hold unused values)."""

    compute: np.ndarray  # [C, W, K] standard normals of compute noise
    sync: np.ndarray  # [C, K] standard normals of the sync jitter
    latency: np.ndarray  # [C, K] unit exponentials of ring latency
    grad_mean: np.ndarray  # [C, W] mean over the K iterations of each worker's gamma factors of |g|^2
    grad_root_mean: np.ndarray  # [C, W] mean over the K iterations of their square roots
    grad_global: np.ndarray  # [C] mean over the cluster's workers of the all-reduced gradient's factors
    meas: np.ndarray  # [C, 5, W] standard normals of the counters' measurement noise
    batch_normal: np.ndarray  # [C, W] standard normals of the batch accuracies
    val_normal: np.ndarray  # [C] standard normal of the validation accuracy


class StreamNoise:
    """Each cluster's draws from its own generator, in :class:`sim.engine.Simulator`'s order."""

    exact = True

    def __init__(self, clusters: int) -> None:
        self.streams: list[np.random.Generator | None] = [None] * clusters

    def start(self, i: int, stream: np.random.Generator) -> None:
        """Cluster ``i`` draws from ``stream`` (its reset's noise child) from now on."""
        self.streams[i] = stream

    def draw(self, idx: np.ndarray, iterations: int, num_workers: np.ndarray, width: int) -> Draws:
        c, k = len(idx), iterations
        out = Draws(
            compute=np.zeros((c, width, k)),
            sync=np.empty((c, k)),
            latency=np.empty((c, k)),
            grad_mean=np.ones((c, width)),
            grad_root_mean=np.ones((c, width)),
            grad_global=np.empty(c),
            meas=np.zeros((c, 5, width)),
            batch_normal=np.zeros((c, width)),
            val_normal=np.empty(c),
        )
        shape, scale = GRAD_GAMMA
        for row, i in enumerate(idx.tolist()):
            rng, n = self.streams[i], int(num_workers[row])
            out.compute[row, :n] = rng.standard_normal((k, n)).T
            out.sync[row] = rng.standard_normal(k)
            out.latency[row] = rng.exponential(1.0, k)
            g = rng.gamma(shape, scale, (k + 1, n))
            out.grad_mean[row, :n] = g[:k].mean(axis=0)
            out.grad_root_mean[row, :n] = np.sqrt(g[:k]).mean(axis=0)
            out.grad_global[row] = g[k].mean()
            out.meas[row, :, :n] = rng.standard_normal((5, n))
            z = rng.standard_normal(n + 1)
            out.batch_normal[row, :n] = z[:n]
            out.val_normal[row] = z[n]
        return out

    def poisson(self, idx: np.ndarray, lam: np.ndarray, num_workers: np.ndarray) -> np.ndarray:
        out = np.zeros(lam.shape)
        for row, i in enumerate(idx.tolist()):
            n = int(num_workers[row])
            out[row, :n] = self.streams[i].poisson(lam[row, :n])
        return out


def _root_moments(shape: float, scale: float) -> tuple[float, float, float]:
    """Mean, variance and skewness of sqrt(X) for X ~ Gamma(shape, scale)."""
    mean = math.sqrt(scale) * math.exp(math.lgamma(shape + 0.5) - math.lgamma(shape))
    var = shape * scale - mean**2
    third = scale**1.5 * math.exp(math.lgamma(shape + 1.5) - math.lgamma(shape))  # E[X^(3/2)]
    return mean, var, (third - 3.0 * mean * var - mean**3) / var**1.5


#: Mean, variance and skewness of the root of one |g|^2 factor (:data:`sim.batched_world.GRAD_GAMMA`).
ROOT_MOMENTS = _root_moments(*GRAD_GAMMA)


def batch_generator(seed: int | None) -> np.random.Generator:
    """The batch's noise generator: numpy's SFC64 bit generator (its normals and gammas come out
    ~15% faster than PCG64's on these sizes; any bit generator gives the same law)."""
    return np.random.Generator(np.random.SFC64(seed))


class BatchNoise:
    """One generator for the whole batch: one call per draw kind and interval; the gradient factors
    drawn as their per-worker means (:meth:`_gradient_factors`). The compute normals land in a buffer
    that the next draw overwrites: :class:`Draws` lives for one interval."""

    exact = False

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self._buffers: dict[str, np.ndarray] = {}

    def start(self, i: int, stream: np.random.Generator) -> None:
        """Nothing to do: every cluster draws from the batch's generator."""

    def _buffer(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        size = math.prod(shape)
        buf = self._buffers.get(name)
        if buf is None or buf.size < size:
            buf = self._buffers[name] = np.empty(size)
        return buf[:size].reshape(shape)

    def _gradient_factors(self, c: int, width: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Per worker, the mean over ``k`` iterations of the |g|^2 factors X ~ Gamma(shape, scale) and
        the mean of their square roots, without drawing the ``k`` factors.

        The report reads the pair only through the roots' sample mean and (biased) sample variance:
        ``mean_g - mean_root**2``. The root U = sqrt(X) is a scaled chi variable with ``2 * shape`` (50)
        degrees of freedom, close to normal (skewness 0.10). Were it normal, the sample mean and
        variance of ``k`` of them would be independent, a normal and a scaled chi-square with ``k - 1``
        degrees of freedom (Cochran); so two draws per worker stand for ``k``: the sample variance as
        that chi-square, the sample mean as a normal with U's exact mean and variance / ``k``, bent by
        a Cornish-Fisher term to the mean's skewness (U's / sqrt(k)). ``mean_g`` keeps its exact
        expectation (shape * scale). Their law against the ``k`` draws (two-sample tests on 10^5
        workers) is checked in ``tests/sim/test_batched_noise.py``.
        """
        rng = self.rng
        mu, var, skew = ROOT_MOMENTS
        z = rng.standard_normal((c, width))
        bend = skew / (6.0 * math.sqrt(k))
        grad_root_mean = z + bend * (z * z - 1.0)
        grad_root_mean *= math.sqrt(var / k)
        grad_root_mean += mu
        spread = rng.standard_gamma((k - 1) / 2.0, (c, width)) if k > 1 else np.zeros((c, width))
        grad_mean = spread * (2.0 * var / k)
        grad_mean += grad_root_mean**2
        return grad_mean, grad_root_mean

    def draw(self, idx: np.ndarray, iterations: int, num_workers: np.ndarray, width: int) -> Draws:
        rng, c, k = self.rng, len(idx), iterations
        compute = self._buffer("compute", (c, width, k))
        rng.standard_normal(out=compute)
        grad_mean, grad_root_mean = self._gradient_factors(c, width, k)
        # The all-reduced gradient's factor, averaged over the cluster's n workers: a mean of n
        # Gamma(shape, scale) draws is Gamma(n * shape, scale / n), drawn as such (the same law).
        shape, scale = GRAD_GAMMA
        grad_global = rng.gamma(shape * num_workers, scale / num_workers)
        z = rng.standard_normal(c * (k + 6 * width + 1))
        o1 = c * k
        o2 = o1 + c * 5 * width
        o3 = o2 + c * width
        return Draws(
            compute=compute,
            sync=z[:o1].reshape(c, k),
            latency=rng.standard_exponential((c, k)),
            grad_mean=grad_mean,
            grad_root_mean=grad_root_mean,
            grad_global=grad_global,
            meas=z[o1:o2].reshape(c, 5, width),
            batch_normal=z[o2:o3].reshape(c, width),
            val_normal=z[o3:],
        )

    def poisson(self, idx: np.ndarray, lam: np.ndarray, num_workers: np.ndarray) -> np.ndarray:
        out = np.zeros(lam.shape)
        some = lam > 0
        if some.any():
            out[some] = self.rng.poisson(lam[some])
        return out
