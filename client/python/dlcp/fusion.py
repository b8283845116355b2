"""Online tuning of the fusion buffer size: Bayesian optimisation with a Gaussian process and
expected improvement, over 1-256 MB on a log scale (as in DeAR). Pure numpy, no torch.

Each trial measures the mean iteration time of a few steps at one size, warm-up excluded. Only
rank 0 runs the optimiser; its choice is broadcast, so every worker fuses the same way.
"""
import math

import numpy as np

MB = 1 << 20


class FusionTuner:
    """Suggests sizes; observe() takes the measured seconds per iteration for the last one."""

    def __init__(self, low_mb=1.0, high_mb=256.0, trials=10, seed=0):
        if not (0 < low_mb < high_mb):
            raise ValueError(f"fusion range [{low_mb}, {high_mb}] MB is empty")
        if trials < 1:
            raise ValueError("trials must be at least 1")
        self._lo, self._hi = math.log2(low_mb), math.log2(high_mb)
        self._trials = trials
        self._x, self._y = [], []
        self._rng = np.random.default_rng(seed)
        self._grid = np.linspace(self._lo, self._hi, 256)

    @property
    def finished(self):
        return len(self._y) >= self._trials

    def best_bytes(self):
        """The size with the lowest measured time (the starting size before any trial)."""
        if not self._y:
            return self._to_bytes(self._lo + (self._hi - self._lo) / 2)
        return self._to_bytes(self._x[int(np.argmin(self._y))])

    def suggest_bytes(self):
        if self.finished:
            return self.best_bytes()
        n = len(self._x)
        seeds = [self._lo, self._hi, (self._lo + self._hi) / 2]  # the ends and the middle first
        if n < len(seeds):
            x = seeds[n]
        else:
            x = self._expected_improvement_argmax()
        self._x.append(float(x))
        return self._to_bytes(x)

    def observe(self, seconds):
        if len(self._y) >= len(self._x):
            raise RuntimeError("observe() without a pending suggestion")
        if not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"iteration time {seconds} is not a positive number")
        self._y.append(float(seconds))

    def _to_bytes(self, x):
        return int(round(2.0 ** x * MB))

    def _expected_improvement_argmax(self):
        x = np.asarray(self._x[: len(self._y)])
        y = np.asarray(self._y)
        mu_y, sd_y = y.mean(), y.std() or 1.0
        z = (y - mu_y) / sd_y
        length = (self._hi - self._lo) / 4

        def kernel(a, b):
            return np.exp(-0.5 * ((a[:, None] - b[None, :]) / length) ** 2)

        k = kernel(x, x) + 1e-2 * np.eye(len(x))  # measured times are noisy
        alpha = np.linalg.solve(k, z)
        ks = kernel(self._grid, x)
        mean = ks @ alpha
        var = np.clip(1.0 - np.einsum("ij,ji->i", ks, np.linalg.solve(k, ks.T)), 1e-12, None)
        sd = np.sqrt(var)
        best = z.min()
        gamma = (best - mean) / sd  # minimising
        cdf = 0.5 * (1 + np.vectorize(math.erf)(gamma / math.sqrt(2)))
        pdf = np.exp(-0.5 * gamma**2) / math.sqrt(2 * math.pi)
        ei = sd * (gamma * cdf + pdf)
        ei[np.isin(self._grid, x)] = -1  # never the same point twice
        top = np.flatnonzero(ei >= ei.max() - 1e-12)
        return float(self._grid[self._rng.choice(top)])
