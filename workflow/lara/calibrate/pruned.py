"""Pruned Best-of-N, and its lambda calibrated for itself. Pure numpy, no I/O.

The decoder (``decode.bon_prune``) draws N candidates from pi_ref as one batch. At each checkpoint t_j (a
number of generated tokens) the candidates still alive are scored on their first t_j tokens by the partial
reward and cost models, ranked by r_p - lam c_p and all but the best m_j are stopped; the survivors are
generated to the end and the final choice is the Best-of-N choice among them by r - lam c with the full models.
Every ranking is Best-of-N's (:func:`lara.calibrate.bestofn.order`): ties go to the lower cost, then to the lower
sample index. A stopped candidate cost min(its length, t_j) tokens; a survivor its whole length.

**Calibration for itself.** A calibration sample is a full response from pi_ref: its first t_j tokens are exactly
the prefix the decoder would have generated, so the decoder's choice over any N of a prompt's K samples is known
from their prefix scores and full scores, with no extra generation. A prompt's loss at lam is the decoder's cost
(clipped to ``bounds`` for the certificates) averaged over N-subsets of its K samples: all C(K, N) of them when
there are at most ``max_subsets`` (exact; K = N is one subset), otherwise ``max_subsets`` subsets drawn uniformly
(seeded, the same subsets at every lam: an unbiased estimate of the exact expectation; its standard error is
recorded). Either way the loss is an unbiased estimate of the decoder's expected cost on that prompt.

**The cost need not be monotone in lam**: a larger lam can stop, at a checkpoint, a candidate whose full
response was the safe one; the calibration core searches a grid for the stable root and certifies with fixed-sequence
LTT and CRC on the upper envelope (:mod:`lara.calibrate.procedures`).

The searches, the certificates and the record are the calibration core's (:mod:`lara.calibrate.procedures`); this
module is the decoder (:class:`PrunedBestOfN`, an instance of :mod:`lara.calibrate.decoder`'s interface), its
settings and its table of prefix scores. The λ of full Best-of-N is never reused here: it is a different decoder.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import ClassVar, Literal

import numpy as np

from lara.calibrate.bestofn import order, select
from lara.calibrate.decoder import Curves, clip
from lara.calibrate.procedures import GridCalibration
from lara.settings import Settings, cross_key, seed_setting, setting

SUBSET_SEED = 47  # the subsets drawn when C(K, N) > max_subsets come from [seed, SUBSET_SEED]
TIE_RULES = ("index", "keep")  # at a keep cut, candidates whose prefixes score and cost the same as the last kept one
# are stopped by sample index (no signal decides) or all kept (the cut moves down to where the scores differ)


@dataclass(frozen=True)
class Schedule:
    """Checkpoints in generated tokens (increasing) and how many candidates survive each (non-increasing, each
    below the number alive before it: a checkpoint that stops nothing is refused)."""

    n: int
    checkpoints: tuple[int, ...]
    keep: tuple[int, ...]
    ties: str = "index"  # a tie at a keep cut: "index" stops by sample index; "keep" keeps every tied candidate

    def __post_init__(self):
        if self.ties not in TIE_RULES:
            raise ValueError(f"ties {self.ties!r}: one of {', '.join(TIE_RULES)}")
        if not self.checkpoints or len(self.checkpoints) != len(self.keep):
            raise ValueError(f"a pruning schedule needs as many keep counts as checkpoints, got "
                             f"{list(self.checkpoints)} and {list(self.keep)}")
        steps = zip(self.checkpoints, self.checkpoints[1:], strict=False)
        if any(t < 1 for t in self.checkpoints) or any(b <= a for a, b in steps):
            raise ValueError(f"checkpoints {list(self.checkpoints)} are not increasing token counts >= 1")
        alive = self.n
        for t, m in zip(self.checkpoints, self.keep, strict=True):
            if not 1 <= m < alive:
                raise ValueError(f"keep {m} at checkpoint {t}: must be >= 1 and below the {alive} candidates alive "
                                 "there (a checkpoint that stops nothing costs prefix scores for nothing)")
            alive = m

    def describe(self) -> str:
        steps = ", ".join(f"{m} after {t} tokens" for t, m in zip(self.checkpoints, self.keep, strict=True))
        return f"pruned Best-of-{self.n} (keep {steps}{'; ties at a cut kept' if self.ties == 'keep' else ''})"

    def as_dict(self) -> dict:
        rule = {} if self.ties == "index" else {"ties": self.ties}  # (the first rule's records name none)
        return {"n": self.n, "checkpoints": list(self.checkpoints), "keep": list(self.keep), **rule}


def make_schedule(n: int, checkpoints, keep, max_new_tokens: int, ties: str = "index") -> Schedule:
    """A schedule from config values: a checkpoint is a token count (int >= 1) or a fraction of max_new_tokens
    (a float in (0, 1), rounded up); a keep is a count (int >= 1) or a fraction of N (a float in (0, 1), rounded
    up)."""
    def whole(v, what: str, of: int) -> int:  # a whole number, or a fraction of ``of`` rounded up
        v = float(v)
        if not (0 < v < 1 or (v >= 1 and v.is_integer())):
            raise ValueError(f"{what} {v:g} is neither a whole number >= 1 nor a fraction in (0, 1)")
        return int(v) if v >= 1 else max(1, math.ceil(v * of))

    return Schedule(int(n), tuple(whole(v, "checkpoint", max_new_tokens) for v in checkpoints),
                    tuple(whole(v, "keep", n) for v in keep), ties)


@dataclass(frozen=True)
class PrefixScores:
    """Per prompt its K samples (equal K): full reward and cost, generated length in tokens, and the prefix
    reward and cost at each checkpoint of a schedule (P, K, J)."""

    reward: np.ndarray
    cost: np.ndarray
    length: np.ndarray
    prefix_reward: np.ndarray
    prefix_cost: np.ndarray

    @property
    def shape(self):
        return self.reward.shape


@dataclass(frozen=True)
class Outcome:
    """What the decoder does on rows of N candidates at one lam."""

    pick: np.ndarray  # (R,) column of the chosen candidate
    tokens: np.ndarray  # (R,) tokens generated
    prefix_scored: np.ndarray  # (R,) prefixes scored (each by the partial reward and the partial cost model)
    full_scored: np.ndarray  # (R,) finished candidates scored by the full models
    tied_cuts: np.ndarray  # (R,) checkpoints whose cut fell between candidates with the same prefix score and cost


def run(reward, cost, length, prefix_reward, prefix_cost, lam: float, schedule: Schedule) -> Outcome:
    """The pruned decoder on rows (R, N) of candidates: stop all but the best keep[j] at checkpoint j by the
    prefix scores, choose among the survivors by the full scores."""
    rows, n = reward.shape
    if n != schedule.n:
        raise ValueError(f"the schedule is for N = {schedule.n}, the rows hold {n} candidates")
    alive = np.ones((rows, n), dtype=bool)
    tokens = np.zeros(rows, dtype=np.int64)
    scored = np.zeros(rows, dtype=np.int64)
    tied_cuts = np.zeros(rows, dtype=np.int64)
    r_idx = np.arange(rows)[:, None]
    for j, (t, m) in enumerate(zip(schedule.checkpoints, schedule.keep, strict=True)):
        pr, pc = prefix_reward[..., j], prefix_cost[..., j]
        ranked = order(pr, pc, lam, alive)
        kept = np.zeros_like(alive)
        kept[r_idx, ranked[:, :m]] = True
        tied = alive & _tied_with(pr, pc, lam, ranked[:, m - 1])  # the last kept one's equals, itself included
        cut = alive.sum(axis=1) > m
        tied_cuts += cut & (tied & ~kept).any(axis=1)
        if schedule.ties == "keep":
            kept |= tied
        stopped = alive & ~kept
        tokens += np.where(stopped, np.minimum(length, t), 0).sum(axis=1)
        scored += alive.sum(axis=1)
        alive = kept
    tokens += np.where(alive, length, 0).sum(axis=1)
    pick = select(reward, cost, lam, alive)
    return Outcome(pick, tokens, scored, alive.sum(axis=1), tied_cuts)


def _tied_with(pr: np.ndarray, pc: np.ndarray, lam: float, last: np.ndarray) -> np.ndarray:
    """(R, N): the candidates :func:`lara.calibrate.bestofn.order` cannot tell from the column ``last`` of each row
    but by sample index: the same prefix score r - lam c (within its tolerance) and the same prefix cost."""
    from lara.calibrate.bestofn import TIE_RTOL

    score = pr - lam * pc
    at = np.arange(len(last))
    s_last, c_last = score[at, last][:, None], pc[at, last][:, None]
    return (np.abs(score - s_last) <= TIE_RTOL * np.maximum(1.0, np.abs(s_last))) & (pc == c_last)


def subsets(k: int, n: int, max_subsets: int, seed: int) -> tuple[np.ndarray, bool]:
    """(S, n) sorted column sets of the N-subsets of K columns: every one when C(K, N) <= max_subsets (exact),
    else max_subsets drawn uniformly without replacement within a subset (seeded)."""
    if not 1 <= n <= k:
        raise ValueError(f"pruned Best-of-N needs 1 <= N <= K, got N = {n}, K = {k}")
    if math.comb(k, n) <= max_subsets:
        return np.array(list(combinations(range(k), n)), dtype=np.int64).reshape(-1, n), True
    rng = np.random.default_rng([seed, SUBSET_SEED])
    return np.sort(np.argsort(rng.random((max_subsets, k)), axis=1)[:, :n], axis=1), False


def gather(ps: PrefixScores, cols: np.ndarray) -> PrefixScores:
    """Rows (P * S, N): every prompt's samples at each subset's columns (subset-major within a prompt)."""
    (p, _), (s, n) = ps.shape, cols.shape
    return PrefixScores(*(a[:, cols].reshape(p * s, n, *a.shape[2:])  # (P, S, N, ...) flattened
                          for a in (ps.reward, ps.cost, ps.length, ps.prefix_reward, ps.prefix_cost)))


def curves(ps: PrefixScores, schedule: Schedule, grid, bounds=None, max_subsets: int = 500, seed: int = 0) -> Curves:
    """The decoder's per-prompt expectations at every lambda of ``grid`` (module docstring)."""
    grid = np.asarray(grid, dtype=float)
    p, k = ps.shape
    cols, exact = subsets(k, schedule.n, max_subsets, seed)
    s = len(cols)
    rows = gather(ps, cols)
    clipped = clip(rows.cost, bounds)
    shape = (p, len(grid))
    out = {name: np.empty(shape) for name in ("cost", "clipped", "reward", "tokens", "se")}
    at = np.arange(len(rows.reward))
    for li, lam in enumerate(grid):
        o = run(rows.reward, rows.cost, rows.length, rows.prefix_reward, rows.prefix_cost, float(lam), schedule)
        chosen = {"cost": rows.cost[at, o.pick], "clipped": clipped[at, o.pick], "reward": rows.reward[at, o.pick],
                  "tokens": o.tokens}
        for name, v in chosen.items():
            out[name][:, li] = v.reshape(p, s).mean(axis=1)
        se = chosen["clipped"].reshape(p, s).std(axis=1, ddof=1) / math.sqrt(s) if not exact and s > 1 else 0.0
        out["se"][:, li] = se
    return Curves(grid, out["cost"], out["clipped"], out["reward"], out["tokens"], out["se"], s, exact)


def brute_force(ps: PrefixScores, schedule: Schedule, lam: float, bounds=None) -> dict:
    """The decoder's expected cost, reward and tokens per prompt, written out plainly: every N-subset of every
    prompt in turn, each checkpoint a Python sort by (score, cost, sample index). Independent of :func:`run` and
    :func:`curves`, which must equal it where they are exact (exact ties aside: this one has no tolerance)."""
    p, k = ps.shape
    res = {"cost": np.zeros(p), "reward": np.zeros(p), "tokens": np.zeros(p)}
    combos = list(combinations(range(k), schedule.n))
    for i in range(p):
        for cols in combos:
            alive, spent = list(cols), 0
            for j, (t, m) in enumerate(zip(schedule.checkpoints, schedule.keep, strict=True)):
                def key(a, i=i, j=j):
                    return -(ps.prefix_reward[i, a, j] - lam * ps.prefix_cost[i, a, j]), ps.prefix_cost[i, a, j]

                ranked = sorted(alive, key=lambda a: (*key(a), a))
                if schedule.ties == "keep":  # every candidate equal to the last kept one is kept too
                    m = max(q + 1 for q, a in enumerate(ranked) if q < m or key(a) == key(ranked[m - 1]))
                spent += sum(min(int(ps.length[i, a]), t) for a in ranked[m:])
                alive = ranked[:m]
            spent += sum(int(ps.length[i, a]) for a in alive)
            best = min(alive, key=lambda a: (-(ps.reward[i, a] - lam * ps.cost[i, a]), ps.cost[i, a], a))
            cost = ps.cost[i, best] if bounds is None else min(max(ps.cost[i, best], bounds[0]), bounds[1])
            res["cost"][i] += cost / len(combos)
            res["reward"][i] += ps.reward[i, best] / len(combos)
            res["tokens"][i] += spent / len(combos)
    return res


# ---------------------------------------------------------------------------------------------
# Its settings, and the decoder as the calibration core's instance


class Scheduled:
    """What every settings class holding the schedule's keys (checkpoints, keep, n, max_new_tokens) derives from
    them: whether there is a pruned decoder, its :class:`~lara.calibrate.pruned.Schedule`, and the one check of it
    (every command that reads the schedule refuses a bad one naming the key, before any model is loaded)."""

    @property
    def enabled(self) -> bool:
        return bool(self.checkpoints)

    def schedule(self):
        return make_schedule(self.n, self.checkpoints, self.keep, self.max_new_tokens, getattr(self, "ties", "index"))

    @cross_key("decode.bon_prune.checkpoints", "decode.bon_prune.keep", "decode.bon_n",
               "generation.max_new_tokens", witness={"decode": {"bon_prune": {"checkpoints": [4, 2], "keep": [4, 2]}}})
    def schedule_valid(self):
        if not self.checkpoints and not self.keep:
            return None
        try:
            schedule = self.schedule()
        except ValueError as exc:
            return (f"decode.bon_prune.checkpoints: {exc} (checkpoints {self.checkpoints}, keep {self.keep}, N = "
                    f"{self.n})")
        if schedule.checkpoints[-1] >= self.max_new_tokens:
            return (f"decode.bon_prune.checkpoints: the last checkpoint, {schedule.checkpoints[-1]} tokens, is not "
                    f"below generation.max_new_tokens = {self.max_new_tokens}: every candidate would be finished "
                    "there, and stopping it saves nothing")
        return None


def search_checkpoints_problem(checkpoints, max_new_tokens: int) -> str | None:
    """The problem of a token-budget search space's checkpoint at or beyond the longest response (it stops
    nothing), for every step that reads decode.budget.checkpoints."""
    if any(t >= max_new_tokens for t in checkpoints):
        return (f"decode.budget.checkpoints: {max(checkpoints)} tokens is not below generation.max_new_tokens = "
                f"{max_new_tokens} (a checkpoint there stops nothing)")
    return None


@dataclass(frozen=True)
class PruneSettings(Scheduled, GridCalibration, Settings):
    """decode.bon_prune: the pruned Best-of-N decoder and its own calibration (an empty schedule: no such
    decoder)."""

    SECTION: ClassVar[str] = "decode.bon_prune"

    n: int = setting(help="Best-of-N candidates.", minimum=2, key="decode.bon_n")
    max_new_tokens: int = setting(help="Longest response in tokens (fractions of it are checkpoints).", minimum=1,
                                  key="generation.max_new_tokens")
    checkpoints: list[float] = setting(
        [], "Where candidates are stopped, in generated tokens (an integer) or as a fraction of "
            "generation.max_new_tokens (a number in (0, 1), rounded up); increasing. Empty: no pruned decoder.",
        exclusive_minimum=0)
    keep: list[float] = setting(
        [], "How many candidates survive each checkpoint: a count (an integer) or a fraction of N (a number in "
            "(0, 1), rounded up); each below the number alive before it.", exclusive_minimum=0)
    ties: Literal["index", "keep"] = setting(
        "index", "A tie at a keep cut (candidates whose prefixes score and cost the same as the last one kept, so no "
                 "signal tells them apart): index stops them by sample index; keep keeps them all (more tokens). The "
                 "share of tied cuts is recorded either way.")
    grid_points: int = setting(501, "Lambdas of the calibration grid on [0, calibration.lambda_search_max] (the "
                                    "pruned decoder's cost need not be monotone in lambda: it is searched on this "
                                    "grid and every deployed lambda is a grid point).", minimum=2)
    max_subsets: int = setting(500, "The decoder's expected cost over N of a prompt's K samples is exact over all "
                                    "C(K, N) subsets when there are at most this many (K = N: one), else over this "
                                    "many drawn uniformly (its standard error recorded).", minimum=1)
    seed: int = seed_setting()


@dataclass(frozen=True)
class ScheduleKeys(Scheduled):
    """The schedule's keys (decode.bon_prune's and N's, borrowed), for every step that reads the schedule beside
    settings of its own (a step's ``ties`` comes last: it has a default)."""

    n: int = setting(help="Best-of-N candidates.", minimum=2, key="decode.bon_n")
    max_new_tokens: int = setting(help="Longest response in tokens (fractions of it are checkpoints).", minimum=1,
                                  key="generation.max_new_tokens")
    checkpoints: list[float] = setting(help="The schedule's checkpoints.", exclusive_minimum=0,
                                       key="decode.bon_prune.checkpoints")
    keep: list[float] = setting(help="The schedule's survivors.", exclusive_minimum=0, key="decode.bon_prune.keep")


@dataclass(frozen=True)
class PruneScheduleSettings(ScheduleKeys, Settings):
    """The pruned decoder's schedule alone: what scoring the prefixes (lara score-prefixes) and running the decoder on
    drawn candidates (lara select-bon-prune) read. Its lambda comes from its record, so a new tau or bootstrap reruns
    neither the prefix scores nor its zero and max settings."""

    ties: Literal["index", "keep"] = setting("index", "A tie at a keep cut.", key="decode.bon_prune.ties")


@dataclass(frozen=True)
class PrunedBestOfN:
    """Pruned Best-of-N on the calibration samples with their prefix scores: an instance of
    :class:`lara.calibrate.decoder.Decoder` (the scorers it reads, full and partial, are its inputs' identity)."""

    ps: PrefixScores | None
    schedule: Schedule
    max_subsets: int = 500
    seed: int = 0
    kind: ClassVar[str] = "pruned_best_of_n"
    mode: ClassVar[str] = "bon_prune"
    record: ClassVar[str] = "lambda_bon_prune.json"

    @classmethod
    def from_settings(cls, st: dict, ps: PrefixScores | None = None) -> PrunedBestOfN:
        schedule = make_schedule(st["n"], st["checkpoints"], st["keep"], st["max_new_tokens"], st.get("ties", "index"))
        return cls(ps, schedule, st.get("max_subsets", 500), st.get("seed", 0))

    def identity(self) -> dict:
        k = {} if self.ps is None else {"k": int(self.ps.shape[1])}
        return {"kind": self.kind, "n": self.schedule.n, **k, "schedule": self.schedule.as_dict()}

    def describe(self) -> str:
        return self.schedule.describe()

    def curves(self, grid, bounds) -> Curves:
        return curves(self.ps, self.schedule, grid, bounds, self.max_subsets, self.seed)

    def full_tokens(self) -> float:
        return float(self.ps.length.mean(axis=1).mean() * self.schedule.n)  # full Best-of-N on an N-subset

    def facts(self, lam: float) -> dict:
        """At ``lam`` (the deployed lambda), the share of keep cuts that fell between candidates whose prefixes score
        and cost the same: cuts no signal decides (stopped by sample index, or all kept under ``ties: keep``)."""
        cols, _ = subsets(self.ps.shape[1], self.schedule.n, self.max_subsets, self.seed)
        rows = gather(self.ps, cols)
        o = run(rows.reward, rows.cost, rows.length, rows.prefix_reward, rows.prefix_cost, float(lam), self.schedule)
        share = float(o.tied_cuts.sum() / (len(o.tied_cuts) * len(self.schedule.checkpoints)))
        return {"ties": {"rule": self.schedule.ties, "tied_cut_share_at_lambda_star": share}}


def decoder_from_table(path, s, where: str) -> tuple[PrunedBestOfN, np.ndarray, np.ndarray, object]:
    """The pruned decoder of settings ``s`` on a ``lara score-prefixes`` table: (decoder, prompt ids, costs (P, K),
    the table)."""
    from lara.read.candidates import read_prefix_scores

    schedule = s.schedule()
    ids, arrays, _, df = read_prefix_scores(path, schedule.checkpoints, where, s.max_new_tokens)
    return PrunedBestOfN(PrefixScores(*arrays), schedule, s.max_subsets, s.seed), ids, arrays[1], df
