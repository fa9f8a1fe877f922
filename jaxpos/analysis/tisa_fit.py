"""TISA kernels fitted to positional profiles (Wennberg & Henter, App. C).

Each head's positional profile F-hat_P [n, n] (`jaxpos.analysis.profile.positional_profile`) is reduced to one
score per offset j - i (the mean of each diagonal: its rows centred on the diagonal), and
f(k) = sum_s a_s exp(-|b_s| (k - c_s)^2) is fitted to those scores by least squares. The result initialises a
TISA model (`a`, `b`, `c` of shape [H, S], the parameters of `jaxpos.positions.tisa`).

The fit runs in normalised coordinates (offsets / max|offset|, scores / their RMS) and greedily: one bump at a
time is added where it best matches the residual (a dictionary of bumps centred at every offset, widths from
half an offset to the whole range), then all bumps so far are refined by a jitted, batched Levenberg-Marquardt
loop on (a, log b, c). Several restarts per head draw among the best-matching bumps; the best fit is kept.
Sums of overlapping bumps have local minima: this finds the optimum reliably for separated bumps, not always
for, e.g., two nearby bumps of opposite sign (r2 reports how well each head was fitted).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxpos.analysis.toeplitz import diagonal_means
from jaxpos.positions.tisa import tisa_scores


def profile_rows_to_offsets(profile) -> np.ndarray:
    """Mean score per offset j - i = -(n-1)..n-1 of profiles [H, n, n] -> [H, 2n - 1]."""
    p = np.asarray(profile, np.float64)
    if p.ndim != 3 or p.shape[-1] != p.shape[-2]:
        raise ValueError(f"expected positional profiles [H, n, n], got shape {p.shape}")
    return diagonal_means(p)


def _bumps(u, theta):
    """Bumps phi [P, K, S] and distances u - c [P, K, S] of parameters theta = (a, log_b, c) [P, 3S]."""
    _, log_b, c = jnp.split(theta, 3, axis=-1)
    d = u[None, :, None] - c[:, None, :]
    return jnp.exp(-jnp.exp(log_b)[:, None, :] * d**2), d


def _residual(u, y, theta):
    """f(u) - y [P, K]."""
    return jnp.einsum("pks,ps->pk", _bumps(u, theta)[0], jnp.split(theta, 3, axis=-1)[0]) - y


@functools.partial(jax.jit, static_argnames=("steps",))
def _levenberg_marquardt(u, y, theta, active, *, steps: int):
    """Batched LM on theta [P, 3S] for targets y [P, K] at normalised offsets u [K] -> theta, loss [P].

    Only the bumps with active [S] = 1 move. Analytic Jacobian; Marquardt's diagonal scaling makes the damping
    unit-free.
    """
    moving = jnp.tile(active, 3)

    def step(carry, _):
        t, damping, loss = carry
        phi, d = _bumps(u, t)
        a, log_b, _ = jnp.split(t, 3, axis=-1)
        ab = (a * jnp.exp(log_b))[:, None, :]
        jac = jnp.concatenate([phi, -ab * d**2 * phi, 2 * ab * d * phi], axis=-1)  # [P, K, 3S]
        r = jnp.einsum("pks,ps->pk", phi, a) - y
        jtj = jnp.einsum("pki,pkj->pij", jac, jac)
        diag = jnp.diagonal(jtj, axis1=1, axis2=2)
        scale = diag + 1e-12 * diag.sum(-1, keepdims=True) + 1e-30
        system = jtj + (damping[:, None] * scale)[:, :, None] * jnp.eye(t.shape[-1])
        proposal = t + moving * jnp.linalg.solve(system, -jnp.einsum("pki,pk->pi", jac, r)[..., None])[..., 0]
        new_loss = jnp.sum(_residual(u, y, proposal) ** 2, axis=-1)
        better = jnp.isfinite(new_loss) & (new_loss < loss)
        return (jnp.where(better[:, None], proposal, t), jnp.where(better, damping / 3, damping * 4),
                jnp.where(better, new_loss, loss)), None

    start = (theta, jnp.full(theta.shape[:1], 1e-3, theta.dtype), jnp.sum(_residual(u, y, theta) ** 2, axis=-1))
    (theta, _, loss), _ = jax.lax.scan(step, start, None, length=steps)
    return theta, loss


def _dictionary(u):
    """Candidate bumps: centres at the offsets, 16 log-spaced widths from half an offset to twice the range.
    -> atoms [K, M] (unit columns), log_b [M], c [M] (normalised units)."""
    smallest = 0.5 * np.abs(u[u != 0]).min() if np.any(u != 0) else 0.5
    widths = np.geomspace(smallest, 2.0, 16)
    atom_log_b, atom_c = np.repeat(np.log(1 / (2 * widths**2)), len(u)), np.tile(u, len(widths))
    atoms = np.exp(-np.exp(atom_log_b)[None, :] * (u[:, None] - atom_c[None, :]) ** 2)
    return atoms / np.linalg.norm(atoms, axis=0), atom_log_b, atom_c


def _greedy_fit(u, y, num_kernels, restarts, steps, rng):
    """Adds one bump at a time, the dictionary bump best matching the residual (restarts > 0 draw among the
    ten best), and refines all bumps so far by LM. y [H, K] -> theta [H * R, 3S], loss [H * R]."""
    atoms, atom_log_b, atom_c = _dictionary(u)
    target = np.repeat(y, restarts, axis=0)  # [P, K], P = H * R
    theta = np.zeros((len(target), 3 * num_kernels))
    theta[:, num_kernels:2 * num_kernels] = atom_log_b.max()  # unused bumps: zero amplitude
    residual = -target
    for s in range(num_kernels):
        top = np.argsort(-np.abs(residual @ atoms), axis=-1)[:, :10]
        pick = np.where(np.arange(len(target)) % restarts == 0, 0, rng.integers(0, 10, len(target)))
        chosen = top[np.arange(len(target)), pick]
        phi = np.exp(-np.exp(atom_log_b[chosen])[:, None] * (u[None, :] - atom_c[chosen][:, None]) ** 2)
        # The new bump's amplitude: the least-squares fit of the residual by it alone.
        theta[:, s] = -(phi * residual).sum(-1) / (phi**2).sum(-1)
        theta[:, num_kernels + s], theta[:, 2 * num_kernels + s] = atom_log_b[chosen], atom_c[chosen]
        active = (np.arange(num_kernels) <= s).astype(np.float64)
        theta, loss = _levenberg_marquardt(u, target, theta, active, steps=steps)
        theta = np.array(theta)
        residual = np.asarray(_residual(u, target, theta))
    return _levenberg_marquardt(u, target, theta, np.ones(num_kernels), steps=2 * steps)


def fit_tisa_kernels(scores, offsets, num_kernels: int = 5, steps: int = 50, seed: int = 0,
                     restarts: int = 16) -> dict:
    """Least-squares fit of f(k) = sum_s a_s exp(-|b_s| (k - c_s)^2) to each head's scores.

    scores [H, K] at integer offsets [K] (e.g. `profile_rows_to_offsets` with offsets -(n-1)..n-1); `steps`
    LM iterations after each added bump (twice that at the end), `restarts` greedy runs per head.
    -> dict(a=[H, S], b=[H, S], c=[H, S], r2=[H]) in the paper's convention F[i, j] = f(j - i), with b > 0;
    r2 = 1 - RSS/TSS of each head's fit (TSS about the mean score).
    """
    y = np.asarray(scores, np.float64)
    k = np.asarray(offsets, np.float64)
    if y.ndim != 2 or k.ndim != 1 or y.shape[1] != k.shape[0]:
        raise ValueError(f"expected scores [H, K] and offsets [K], got {y.shape} and {k.shape}")
    scale = max(float(np.abs(k).max()), 1.0)
    # Per-head RMS puts every head's problem on the same footing; an all-zero head keeps unit scale.
    size = np.sqrt((y**2).mean(axis=1, keepdims=True))
    size = np.where(size > 0, size, 1.0)
    # Overlapping bumps make J^T J ill-conditioned beyond float32; the solves need float64 (cheap here).
    with jax.enable_x64(True):
        theta, loss = _greedy_fit(k / scale, y / size, num_kernels, restarts, int(steps),
                                  np.random.default_rng(seed))
        theta = np.asarray(theta, np.float64).reshape(len(y), restarts, -1)
        loss = np.asarray(loss).reshape(len(y), restarts)
    loss = np.where(np.isfinite(loss), loss, np.inf)
    best = theta[np.arange(len(y)), loss.argmin(axis=1)]  # [H, 3S]
    a, log_b, c = np.split(best, 3, axis=1)
    a, b, c = a * size, np.exp(log_b) / scale**2, c * scale  # back to offsets and score units
    fitted = np.asarray(tisa_scores(jnp.asarray(k), jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32),
                                    jnp.asarray(c, jnp.float32)), np.float64)
    rss = ((y - fitted) ** 2).sum(axis=1)
    tss = ((y - y.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
    r2 = np.where(tss > 0, 1 - rss / np.where(tss > 0, tss, 1.0), np.where(rss > 0, 0.0, 1.0))
    return dict(a=a, b=b, c=c, r2=r2)


def tisa_init_from_profile(profile, num_layers: int, num_kernels: int = 5, **fit_options) -> tuple[dict, np.ndarray]:
    """TISA parameters for a model of `num_layers` layers from the first layer's profile F-hat_P [H, n, n] of a
    trained absolute-position model (TISA App. C): each head's fitted kernels, repeated in every layer.

    Returns ({a, b, c: [L, H, S]} ready for the `position` parameters of a TISA stack with sharing "none",
    r2 [H] of the fits).
    """
    n = np.shape(profile)[-1]
    fit = fit_tisa_kernels(profile_rows_to_offsets(profile), np.arange(-(n - 1), n), num_kernels, **fit_options)
    params = {k: np.repeat(np.asarray(fit[k], np.float32)[None], num_layers, axis=0) for k in "abc"}
    return params, np.asarray(fit["r2"])
