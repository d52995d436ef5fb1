"""Certified lambdas for Best-of-N: conformal risk control and Learn-then-Test. Pure numpy/scipy, no I/O.

Per calibration prompt i the loss is l_i(lam), the exact expected Best-of-N cost over the N-subsets of its
K samples (:mod:`lara.calibrate.bestofn`), with every sample's cost clipped to fixed bounds [lo, hi] for the
expectation (the decoder still ranks by r - lam c with the unclipped cost). Clipping is monotone, so l_i is
still a non-increasing right-continuous step function of lam with the same crossings, and it is bounded,
which is what both guarantees need. The bounds must be fixed before the calibration samples are seen (from
the cost model's design, or from data the calibration never draws): bounds read off the calibration costs
make the losses depend on each other through them and void the finite-sample statements.

Both procedures reduce to a threshold on the mean clipped loss R_n(lam) = (1/n) sum_i l_i(lam), so their
lambda is exact (the first crossing where R_n drops to the threshold, :func:`lara.calibrate.bestofn.roots`):

* **CRC** (Angelopoulos et al., *Conformal Risk Control*, 2022): the smallest lam with
  (n R_n(lam) + hi) / (n + 1) <= tau, i.e. R_n(lam) <= tau - (hi - tau) / n. For exchangeable prompts,
  E[l_{n+1}(lam_crc)] <= tau: the expected cost of Best-of-N at lam_crc on a new prompt, averaged over the
  calibration draw too, is at most tau. (l_{n+1} from the new prompt's K samples is unbiased for its
  expected Best-of-N cost, so this is a statement about the deployed decoder.)
* **LTT** (Angelopoulos et al., *Learn then Test*, 2021): for every lam the null E[l(lam)] > tau is tested
  with the Hoeffding-Bentkus p-value of R_n(lam) (losses rescaled to [0, 1]); testing in a fixed sequence
  from large lam down and stopping at the first non-rejection gives lam_ltt with
  P(E[l(lam_ltt)] <= tau) >= 1 - delta over the calibration draw. The p-value is a non-decreasing function
  of R_n, and R_n of lam is non-increasing, so the sequence over the whole interval [0, Lambda] rejects
  exactly where R_n(lam) <= r_crit (the largest mean with p <= delta): the error event is an increasing
  union of single-test events, each of probability <= delta.
* **LTT with betting p-values** (``ltt_wsr``; :mod:`lara.calibrate.betting`, Waudby-Smith & Ramdas 2024): the same
  fixed sequence, each lam's null tested by a gambler's wealth over the prompts in one seeded order, so the
  p-value adapts to the losses' spread (Hoeffding-Bentkus assumes the worst, variance (hi - lo)^2 / 4). It is no
  threshold on the mean: every stretch of constant losses from Lambda down is tested until one is not rejected.
  Same statement as LTT's. No weighted version (the weighted procedures are crc and ltt).

**Covariate-shift weighted versions** (:func:`certified_lambda` with ``shift``; weights w_i > 0 of the calibration
prompts, estimates of dP_deploy / dP_cal at each prompt, :mod:`lara.deploy.shift`). Both are about the deployment
prompt distribution as the weights describe it, and both reduce to a threshold on the weighted mean
R_w(lam) = sum_i w_i l_i(lam) / sum_i w_i, still non-increasing in lam, so their lambda is exact too:

* **weighted CRC** (Tibshirani, Barber, Candes, Ramdas 2019, *Conformal prediction under covariate shift*; the
  covariate-shift section of *Conformal Risk Control*): the test prompt enters with its own weight w_{n+1},
  (sum_i w_i l_i(lam) + w_{n+1} hi) / (sum_i w_i + w_{n+1}) <= tau. w_{n+1} = w(x_{n+1}) is unknown when lambda
  is chosen; the left side only grows with it (it moves weight onto hi >= every l_i), so it is replaced by the
  largest calibration weight: conservative as long as no deployment prompt weighs more than every calibration
  prompt. R_w(lam) <= ((W + w_max) tau - w_max hi) / W, W = sum_i w_i; equal weights give CRC's threshold.
* **weighted LTT**: with the weights treated as fixed, R_w is a weighted mean of independent losses in [lo, hi]
  and Hoeffding's inequality gives P(R_w <= E R_w - t) <= exp(-2 t^2 / (B^2 sum_i p_i^2)) =
  exp(-2 ESS t^2 / B^2), p_i = w_i / W, ESS = 1 / sum_i p_i^2 = W^2 / sum_i w_i^2 (B = hi - lo): the p-value of
  "the deployment's expected loss > tau" at R_w = r < tau is exp(-2 ESS ((tau - r) / B)^2), and the largest
  mean it rejects is tau - B sqrt(log(1 / delta) / (2 ESS)). The same fixed-sequence argument applies. It is
  exact for known density ratios; the weights are estimated (a classifier's cross-fitted odds) and
  self-normalised, so the statement is approximate. Equal weights are no reweighting: the plain mean's
  Hoeffding-Bentkus p-value applies (tighter), and the lambdas are exactly the unweighted ones.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from lara.settings import CERTIFIED, WEIGHTED

PROCEDURES = ("bootstrap", *CERTIFIED)


def clip_costs(cost: np.ndarray, mask: np.ndarray, bounds) -> tuple[np.ndarray, dict]:
    """The costs clipped to ``bounds`` and the fractions of real samples below and above them."""
    lo, hi = (float(b) for b in bounds)
    live = cost[mask]
    n = max(1, live.size)
    frac = {"below": float((live < lo).sum() / n), "above": float((live > hi).sum() / n)}
    return np.clip(cost, lo, hi), frac


def clipped_steps(s, n: int | None, lam_max: float, bounds, unclipped=None):
    """The steps of the clipped expected Best-of-n cost of the prompts ``s`` (PromptScores). When no cost lies
    outside the bounds the clipped curve is the cost curve itself: ``unclipped`` (its steps, if already computed)
    is returned instead of a second pass over every crossing."""
    from lara.calibrate.bestofn import steps

    clip, frac = clip_costs(s.cost, s.mask, bounds)
    if unclipped is not None and frac["below"] == frac["above"] == 0.0:
        return unclipped
    return steps(s.reward, s.cost, s.mask, n, lam_max, value=clip)


def crc_threshold(tau: float, n: int, bounds) -> float:
    """The largest mean clipped loss CRC accepts with n calibration prompts: tau - (hi - tau) / n."""
    hi = float(bounds[1])
    return ((n + 1) * tau - hi) / n


def _h1(a: np.ndarray, b: float) -> np.ndarray:
    """KL divergence of Bernoulli(a) from Bernoulli(b) (0 log 0 = 0), the exponent of Hoeffding's tail bound."""
    a = np.asarray(a, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.where(a > 0, a * np.log(a / b), 0.0)
        second = np.where(a < 1, (1 - a) * np.log((1 - a) / (1 - b)), 0.0)
    return first + second


def hb_p_value(mean, n: int, tau: float, bounds) -> np.ndarray:
    """Hoeffding-Bentkus p-value of the null "expected loss > tau" given the mean ``mean`` of n losses in
    ``bounds`` (Learn then Test, Prop. 3; rescaled to [0, 1]): min(exp(-n h1(min(r, a), a)),
    e P(Binomial(n, a) <= ceil(n r))), r and a the rescaled mean and tau."""
    lo, hi = (float(b) for b in bounds)
    r = (np.asarray(mean, dtype=float) - lo) / (hi - lo)
    a = (tau - lo) / (hi - lo)
    if a <= 0:
        return np.ones_like(r)
    if a >= 1:
        return np.zeros_like(r)
    from scipy.stats import binom  # (scipy.stats takes a second to import: only when a p-value is needed)

    hoeffding = np.exp(-n * _h1(np.minimum(np.clip(r, 0.0, 1.0), a), a))
    bentkus = math.e * binom.cdf(np.ceil(n * np.clip(r, 0.0, 1.0)), n, a)
    return np.minimum(np.minimum(hoeffding, bentkus), 1.0)


def ltt_threshold(tau: float, n: int, delta: float, bounds) -> float | None:
    """The largest mean clipped loss whose Hoeffding-Bentkus p-value is <= delta (None: not even a mean at
    the lower bound is, so n prompts cannot certify tau at this delta)."""
    return _ltt_threshold(float(tau), int(n), float(delta), float(bounds[0]), float(bounds[1]))


@functools.lru_cache(maxsize=256)  # a coverage study asks again for every draw of the same size
def _ltt_threshold(tau: float, n: int, delta: float, lo: float, hi: float) -> float | None:
    bounds = (lo, hi)
    if tau >= hi:
        return hi
    if hb_p_value(lo, n, tau, bounds) > delta:
        return None
    a, b = lo, min(tau, hi)  # p <= delta at a; the p-value is 1 from tau on
    for _ in range(200):
        mid = 0.5 * (a + b)
        if hb_p_value(mid, n, tau, bounds) <= delta:
            a = mid
        else:
            b = mid
        if b - a <= 1e-13 * max(1.0, abs(a)):
            break
    return a - 4e-12 * max(1.0, abs(a))  # below the roots' rounding slack, so the found lam's p stays <= delta


@dataclass(frozen=True)
class Certified:
    """A certified lambda: the procedure, its lambda, whether tau was reachable, and the threshold on the mean
    clipped loss it used (None: no mean can be certified)."""

    procedure: str
    lam: float
    feasible: bool
    threshold: float | None


def certified_lambda(clipped_steps, n: int, procedure: str, tau: float, lam_max: float, bounds,
                     delta: float, weights: np.ndarray | None = None, seed: int = 0,
                     rows: np.ndarray | None = None, shift: np.ndarray | None = None) -> Certified:
    """The CRC, LTT or betting-LTT lambda from the steps of the clipped expected cost
    (:func:`lara.calibrate.bestofn.steps` with ``value`` the clipped costs) of n prompts (``weights``: the prompts'
    weights, default equal: a draw with repeats; ``rows``: that draw as a sequence of prompt indices, which the
    betting test takes in its order; ``seed``: the betting test's order of the prompts when no ``rows``).
    ``shift``: the prompts' covariate-shift weights (finite, > 0), for the weighted CRC or LTT lambda (module
    docstring); equal ones are no reweighting and give the plain lambda."""
    from lara.calibrate.bestofn import roots

    if shift is not None and procedure not in WEIGHTED:
        raise ValueError(f"no weighted version of {procedure!r} (weighted: {', '.join(WEIGHTED)})")
    if shift is not None and equal_weights(shift):
        n, shift = len(shift), None
    if procedure == "ltt_wsr":
        from lara.calibrate.betting import betting_ltt_lambda

        lam, feasible = betting_ltt_lambda(clipped_steps, tau, delta, lam_max, bounds, seed, rows=rows)
        return Certified(procedure, lam, feasible, None)
    if procedure not in ("crc", "ltt"):
        raise ValueError(f"not a certified procedure: {procedure!r} (one of {', '.join(CERTIFIED)})")
    if shift is None:
        threshold = crc_threshold(tau, n, bounds) if procedure == "crc" else ltt_threshold(tau, n, delta, bounds)
    else:
        weights = np.asarray(shift, dtype=float)
        threshold = (weighted_crc_threshold(tau, weights, bounds) if procedure == "crc" else
                     weighted_ltt_threshold(tau, effective_sample_size(weights), delta, bounds))
        weights = (weights / weights.sum())[None, :]
    if threshold is None:
        return Certified(procedure, float(lam_max), False, None)
    w = np.full((1, len(clipped_steps.start)), 1.0 / len(clipped_steps.start)) if weights is None else weights
    lam, status = roots(clipped_steps, w, threshold, lam_max)
    return Certified(procedure, float(lam[0]), bool(status[0] != 2), float(threshold))


def effective_sample_size(weights) -> float:
    """(sum w)^2 / sum w^2: the number of equally weighted prompts a weighted mean is worth."""
    w = np.asarray(weights, dtype=float)
    return float(w.sum() ** 2 / (w * w).sum())


def equal_weights(weights) -> bool:
    """All weights the same: a weighted calibration is then the plain one (and computed as it, exactly)."""
    w = np.asarray(weights, dtype=float)
    return bool(np.all(w == w[0]))


def weighted_crc_threshold(tau: float, weights, bounds) -> float:
    """The largest weighted mean clipped loss weighted CRC accepts: ((W + w_max) tau - w_max hi) / W, the test
    prompt's unknown weight replaced by the largest calibration weight (conservative; module docstring)."""
    w = np.asarray(weights, dtype=float)
    total, top, hi = float(w.sum()), float(w.max()), float(bounds[1])
    return ((total + top) * tau - top * hi) / total


def weighted_ltt_threshold(tau: float, ess: float, delta: float, bounds) -> float | None:
    """The largest weighted mean clipped loss whose Hoeffding p-value at the effective sample size is <= delta:
    tau - B sqrt(log(1 / delta) / (2 ESS)) (None: below the lower bound, so these weights cannot certify tau)."""
    lo, hi = (float(b) for b in bounds)
    if tau >= hi:
        return hi
    r = min(tau, hi) - (hi - lo) * math.sqrt(math.log(1.0 / delta) / (2.0 * ess))
    return None if r < lo else r - 4e-12 * max(1.0, abs(r))  # the roots' rounding slack, as ltt_threshold


def weighted_p_value(mean, ess: float, tau: float, bounds) -> np.ndarray:
    """Hoeffding p-value of "expected loss > tau" from a weighted mean of losses in ``bounds`` at effective sample
    size ``ess`` (weights treated as fixed): exp(-2 ESS ((tau - mean) / B)^2) below tau, 1 from tau on."""
    lo, hi = (float(b) for b in bounds)
    gap = np.maximum((tau - np.asarray(mean, dtype=float)) / (hi - lo), 0.0)
    return np.minimum(np.exp(-2.0 * ess * gap * gap), 1.0)


def statement(procedure: str, *, lam: float, tau: float, n_prompts: int, bon_n: int | None, feasible: bool,
              delta: float | None = None, bounds=None, quantile: float | None = None,
              replicates: int | None = None, clipped: float | None = None, ess: float | None = None,
              decoder: str | None = None, how: str = "") -> str:
    """The guarantee that comes with a deployed lambda, in one plain sentence, for every decoder (``decoder``: its
    name, else full Best-of-``bon_n``; ``how``: how its losses were searched and averaged, said at the end; ``ess``:
    the effective sample size of unequal covariate-shift weights, for the weighted procedures' statements)."""
    decoder = decoder or (f"Best-of-{bon_n}" if bon_n else "Best-of-N (N = each prompt's K)")
    clip = "" if bounds is None else f" (costs clipped to [{bounds[0]:g}, {bounds[1]:g}]" + (
        f"; {clipped:.2%} of the calibration costs lay outside them)" if clipped is not None else ")")
    if not feasible:
        return (f"no guarantee: {procedure} could not reach tau = {tau:g} within the search interval with "
                f"{n_prompts:,} calibration prompts{'' if ess is None else ' reweighted'} (lambda = {lam:.6g} is "
                f"the interval's end){clip}")
    if ess is not None:
        return _weighted_statement(procedure, lam, tau, n_prompts, decoder, clip, delta, quantile, replicates, ess)
    if procedure in ("ltt", "ltt_wsr"):
        p_values = ("Hoeffding-Bentkus p-values" if procedure == "ltt" else
                    "betting p-values, Waudby-Smith & Ramdas 2024, the prompts in one seeded order")
        return (f"with probability >= {1 - delta:.3g} over the draw of the {n_prompts:,} calibration prompts, "
                f"{decoder} at lambda = {lam:.6g} has expected cost{clip} <= tau = {tau:g} on prompts from the "
                f"same distribution (Learn then Test, {p_values}, fixed-sequence testing{how})")
    if procedure == "crc":
        return (f"averaged over the draw of the {n_prompts:,} calibration prompts and of a new prompt from the same "
                f"distribution, {decoder} at lambda = {lam:.6g} has expected cost{clip} <= tau = {tau:g} "
                f"(conformal risk control{how})")
    return (f"no finite-sample guarantee: lambda* = {lam:.6g} is the {quantile:g} quantile of {replicates:,} "
            f"bootstrap replicates of lambda-hat over the {n_prompts:,} calibration prompts (a heuristic upper "
            f"confidence bound on the lambda that meets tau = {tau:g} for {decoder}{how})")


def _weighted_statement(procedure, lam, tau, n_prompts, decoder, clip, delta, quantile, replicates, ess) -> str:
    drawn = (f"the {n_prompts:,} calibration prompts reweighted to the deployment prompts (effective sample size "
             f"{ess:.1f})")
    if procedure == "ltt":
        return (f"with probability >= {1 - delta:.3g} over the draw of {drawn}, {decoder} at lambda = {lam:.6g} has "
                f"expected cost{clip} <= tau = {tau:g} on deployment prompts (weighted Learn then Test: Hoeffding "
                "p-values at the effective sample size, the weights treated as fixed; exact for known density "
                "ratios, approximate for these estimated ones)")
    if procedure == "crc":
        return (f"averaged over the draw of {drawn} and of a deployment prompt, {decoder} at lambda = {lam:.6g} has "
                f"expected cost{clip} <= tau = {tau:g} (weighted conformal risk control, Tibshirani et al. 2019, the "
                "deployment prompt's unknown weight replaced by the largest calibration weight: conservative unless "
                "a deployment prompt weighs more; exact for known density ratios, approximate for these estimated "
                "ones)")
    return (f"no finite-sample guarantee: lambda* = {lam:.6g} is the {quantile:g} quantile of {replicates:,} "
            f"bootstrap replicates of the weighted lambda-hat over {drawn} (a heuristic upper confidence bound on "
            f"the lambda that meets tau = {tau:g} for {decoder} on deployment prompts)")
