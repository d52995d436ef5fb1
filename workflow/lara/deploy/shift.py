"""``lara shift-check``: do the deployment prompts differ from the calibration prompts, and the covariate-shift
weights that would recalibrate lambda for them.

    lara shift-check --features features.parquet --calibration prompts_calibration.parquet \\
        --deployment deployment/drift/stream.parquet --settings '{"n_prompts": 100, ...}' \\
        --out shift.json --weights weights.parquet

**The two samples.** The calibration prompts (label 0), and the first ``n_prompts`` *distinct* prompts of the
deployment stream in order of first visit (label 1): a deduplicated log of the traffic. A stream visits its prompts
again and again; with repeats in the sample, a classifier would meet in its test folds prompts it was trained on
and memorise them, inflating the AUC even where there is no shift. Each prompt is its features (``lara
prompt-features``: the reward model's mean-pooled last hidden states).

**The test** (a classifier two-sample test; Lopez-Paz & Oquab 2017, Friedman 2003): a logistic regression on
standardised features (L2, ``C`` = :data:`C`) is cross-fitted over stratified folds; its out-of-fold probabilities
of "deployment" give the AUC (0.5: the classifier cannot tell the samples apart). The p-value is a permutation
test: the labels are permuted and the whole cross-fit is redone each time, p = (1 + #{permuted AUC >= AUC}) /
(1 + permutations). The cross-fit is a fixed function of (features, labels) (its fold seed is fixed), so under no
shift the p-value is valid at any sample size. ``shifted`` is p <= alpha; "not shifted" is no evidence of no
shift: the test sees only differences its classifier can learn from these features, with this many prompts.

**The weights.** For a calibration prompt with out-of-fold probability p of being a deployment prompt, the odds
p / (1 - p) times n_cal / n_dep (the samples' sizes, which set the classifier's prior odds) estimate the density
ratio dP_deploy / dP_cal at that prompt; p is clipped to [1e-6, 1 - 1e-6] so no weight is 0 or infinite; the
weights are normalised to mean 1. Their effective sample size ESS = (sum w)^2 / sum w^2 is how many equally weighted
calibration prompts the reweighted calibration is worth; below ``min_ess`` (config key deployment.shift.min_ess)
the weighted lambda is not certified (``lara calibrate --weights``, which reads min_ess from the weights' identity).
Weighting covers only deployment prompts the calibration prompts resemble: a kind of prompt that no calibration
prompt is like gets no weight at all. ``deployment_above_max_weight`` is the share of deployment prompts whose own
(out-of-fold, same scale) weight exceeds the largest calibration weight: the weighted CRC assumes it is zero.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np
import pandas as pd

from lara import identity
from lara.data.errors import DataError
from lara.settings import Settings, add_settings_arguments, cross_key, read_settings, seed_setting, setting

log = logging.getLogger(__name__)

# inverse L2 strength of the logistic regression on standardised features (scikit-learn's default). It trades the
# weights' noise against their bias: on the toy run's 64 features (200 calibration prompts, 100 test prompts of
# which 80 harmful), C = 1 reweighted the calibration prompts' mean cost from -2.94 to -1.87 (the deployment
# sample's own: -1.89) at ESS 54; C = 0.1 to -2.17 at ESS 107; C = 0.001 to -2.80 at ESS 193. Shrunk weights look
# safe (a high ESS) and under-correct; the test's size does not depend on C, its power little did there.
C = 1.0
P_CLIP = 1e-6  # out-of-fold probabilities are clipped to [P_CLIP, 1 - P_CLIP]: no weight is 0 or infinite
FEATURE = re.compile(r"f(\d+)")  # feature columns f0 .. f{d-1} (lara prompt-features)


@dataclass(frozen=True)
class ShiftSettings(Settings):
    """deployment.shift: the shift check (calibration vs deployment prompts) and its covariate-shift weights."""

    SECTION: ClassVar[str] = "deployment.shift"

    n_prompts: int = setting(100, "Deployment prompts the check compares with the calibration prompts: the first "
                                  "n_prompts distinct prompts of the stream, in order of first visit (a "
                                  "deduplicated traffic log; all of them when the stream has fewer).", minimum=2)
    folds: int = setting(5, "Stratified folds of the classifier's cross-fit (out-of-fold probabilities give the AUC "
                            "and the weights).", minimum=2)
    permutations: int = setting(200, "Label permutations of the AUC's permutation test (each redoes the whole "
                                     "cross-fit); the smallest p-value is 1 / (permutations + 1).", minimum=1)
    alpha: float = setting(0.05, "Level of the shift test: shifted when the permutation p-value is <= alpha.",
                           exclusive_minimum=0, exclusive_maximum=1)
    min_ess: float = setting(50.0, "The smallest effective sample size (sum w)^2 / sum w^2 of the weighted "
                                   "calibration prompts with which a covariate-shift weighted lambda is certified "
                                   "(below it lara calibrate --weights writes certified: false, which no decoder "
                                   "reads).", exclusive_minimum=0)
    seed: int = seed_setting()

    @cross_key("deployment.shift.alpha", "deployment.shift.permutations",
               witness={"deployment": {"shift": {"alpha": 0.001, "permutations": 200}}})
    def alpha_reachable(self):
        if self.alpha * (self.permutations + 1) < 1:
            return (f"deployment.shift.alpha: {self.alpha:g} is below the smallest p-value of {self.permutations} "
                    f"permutations, 1 / {self.permutations + 1}: the test could never find a shift; raise "
                    "deployment.shift.permutations")

    @cross_key("deployment.shift.folds", "deployment.shift.n_prompts",
               witness={"deployment": {"shift": {"folds": 20, "n_prompts": 10}}})
    def folds_filled(self):
        if self.folds > self.n_prompts:
            return (f"deployment.shift.folds: {self.folds} folds need at least as many deployment prompts in the "
                    f"check, but deployment.shift.n_prompts is {self.n_prompts}")


# ---------------------------------------------------------------------------------------------
# the test and the weights (pure numpy / scikit-learn)


def cross_fit(x: np.ndarray, y: np.ndarray, folds: int, seed: int) -> np.ndarray:
    """Out-of-fold probability of label 1 for every row: stratified ``folds``, each fold's classifier (scaler and
    logistic regression) fitted on the others. A fixed function of (x, y) for a seed."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    out = np.empty(len(y))
    for train, test in StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed).split(x, y):
        model = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=2000)).fit(x[train], y[train])
        out[test] = model.predict_proba(x[test])[:, 1]
    return out


@dataclass(frozen=True)
class TwoSample:
    auc: float
    p_value: float
    probabilities: np.ndarray  # out-of-fold P(label 1) of every row
    null: np.ndarray  # the permuted AUCs


def two_sample_test(x: np.ndarray, y: np.ndarray, folds: int, permutations: int, seed: int,
                    progress: str | None = None) -> TwoSample:
    """The cross-fitted classifier's AUC and its permutation p-value (module docstring)."""
    from sklearn.metrics import roc_auc_score
    from threadpoolctl import threadpool_limits
    from tqdm import tqdm

    y = np.asarray(y, dtype=np.int64)
    smaller = int(min(y.sum(), len(y) - y.sum()))
    if smaller < folds:
        raise ValueError(f"{folds} folds need at least {folds} prompts in each sample; the smaller has {smaller}")
    rng = np.random.default_rng([seed, 1])  # the permutations' own stream
    null = np.empty(permutations)
    # small fits: one BLAS thread each (two threads fighting over a 300 x 64 problem made a fit 25x slower)
    with threadpool_limits(1):
        prob = cross_fit(x, y, folds, seed)
        auc = float(roc_auc_score(y, prob))
        for b in tqdm(range(permutations), desc=progress, unit="permutation", mininterval=10,
                      disable=progress is None):
            perm = rng.permutation(y)
            null[b] = roc_auc_score(perm, cross_fit(x, perm, folds, seed))
    p = (1 + int((null >= auc).sum())) / (1 + permutations)
    return TwoSample(auc, float(p), prob, null)


def odds(p: np.ndarray, n_cal: int, n_dep: int) -> np.ndarray:
    """Density ratio dP_deploy / dP_cal from P(deployment | x): (p / (1 - p)) * (n_cal / n_dep), p clipped to
    [P_CLIP, 1 - P_CLIP]."""
    p = np.clip(np.asarray(p, dtype=float), P_CLIP, 1 - P_CLIP)
    return p / (1 - p) * (n_cal / n_dep)


def check(x: np.ndarray, y: np.ndarray, s: ShiftSettings, progress: str | None = None) -> dict:
    """The shift check of features ``x`` with labels ``y`` (0 calibration, 1 deployment): the test, the calibration
    prompts' weights (``weights``, in the order of their rows: :func:`odds` normalised to mean 1) and the summary
    shift.json holds."""
    from lara.calibrate.certify import effective_sample_size

    test = two_sample_test(x, y, s.folds, s.permutations, s.seed, progress)
    cal, dep = y == 0, y == 1
    n_cal, n_dep = int(cal.sum()), int(dep.sum())
    raw = odds(test.probabilities, n_cal, n_dep)
    scale = raw[cal].mean()
    w = raw[cal] / scale
    ess = effective_sample_size(w)
    above = float((raw[dep] / scale > w.max()).mean())
    shifted = test.p_value <= s.alpha
    return {"weights": w, "null": test.null, "n_calibration": n_cal, "n_deployment": n_dep, "auc": test.auc,
            "p_value": test.p_value, "permutations": s.permutations, "alpha": s.alpha, "shifted": bool(shifted),
            "ess": ess, "min_ess": s.min_ess, "weights_usable": bool(ess >= s.min_ess),
            "max_weight": float(w.max()), "deployment_above_max_weight": above,
            "statement": statement(test.auc, test.p_value, s.alpha, shifted, ess, s.min_ess, n_cal, n_dep, above)}


def statement(auc: float, p: float, alpha: float, shifted: bool, ess: float, min_ess: float, n_cal: int, n_dep: int,
              above: float) -> str:
    """What the check found, in one plain sentence."""
    found = f"cross-fitted AUC {auc:.2f}, permutation p = {p:.3g}"
    if ess >= min_ess:
        weights = (f"the calibration prompts reweighted to the deployment prompts are worth {ess:.0f} of {n_cal} "
                   f"(effective sample size, at least {min_ess:g} needed), so a weighted lambda can be certified "
                   "for them")
    else:
        weights = (f"too few calibration prompts resemble them to reweight (effective sample size {ess:.1f} of "
                   f"{n_cal}, below {min_ess:g}): calibrate on deployment-like prompts, or follow the cost online")
    if above > 0:
        weights += (f"; {above:.0%} of the deployment prompts weigh more than any calibration prompt (prompts the "
                    "calibration set barely covers)")
    if shifted:
        return (f"the deployment prompts differ from the calibration prompts ({found} <= alpha = {alpha:g}): the "
                f"offline guarantee, about prompts like the calibration prompts, does not carry over; {weights}")
    return (f"no detectable shift between the calibration prompts and {n_dep} deployment prompts ({found} > alpha = "
            f"{alpha:g}; this does not prove there is none: the test sees only differences its classifier learns "
            f"from these features with this many prompts); {weights}")


# ---------------------------------------------------------------------------------------------
# CLI: lara shift-check

HELP = "classifier two-sample test of calibration vs deployment prompts, and covariate-shift weights"
OUTPUTS = ("out", "weights")


def add_arguments(parser) -> None:
    parser.add_argument("--features", required=True, help="prompt features (lara prompt-features) of both samples")
    parser.add_argument("--calibration", required=True, help="the calibration prompts (prompt_id[, prompt])")
    parser.add_argument("--deployment", required=True, help="a scenario's stream (t, prompt_id, ...; lara "
                                                            "make-stream)")
    add_settings_arguments(parser, ShiftSettings)
    parser.add_argument("--out", required=True, help="output shift.json")
    parser.add_argument("--weights", required=True, help="output parquet: prompt_id, weight of every calibration "
                                                         "prompt")


def read_features(path) -> tuple[dict, np.ndarray]:
    """id key -> row, and the (P, d) float64 features (columns f0 .. f{d-1}, finite)."""
    from lara.read.files import read_table

    df = read_table(path, required=("prompt_id",))
    cols = sorted((c for c in df.columns if FEATURE.fullmatch(str(c))), key=lambda c: int(c[1:]))
    if not cols or [int(c[1:]) for c in cols] != list(range(len(cols))):
        raise DataError(f"--features {path}: feature columns f0 .. f{{d-1}} expected (lara prompt-features), found "
                        f"{', '.join(map(str, df.columns))}")
    x = df[cols].to_numpy(np.float64)
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise DataError(f"--features {path}: prompt {df['prompt_id'].iloc[int(np.flatnonzero(bad)[0])]!r} has a "
                        "non-finite feature")
    keys = df["prompt_id"].map(identity.id_key)
    if keys.duplicated().any():
        raise DataError(f"--features {path}: prompt {df['prompt_id'][keys.duplicated().to_numpy()].iloc[0]!r} has "
                        "two rows")
    return dict(zip(keys, range(len(keys)), strict=True)), x


def deployment_sample(stream: pd.DataFrame, n: int) -> pd.DataFrame:
    """The first ``n`` distinct prompts of a stream in order of first visit (all of them if fewer; columns
    prompt_id and, where the stream has it, prompt): a deduplicated traffic log (module docstring)."""
    cols = ["prompt_id"] + (["prompt"] if "prompt" in stream.columns else [])
    ordered = stream.sort_values("t", kind="stable")
    return ordered.drop_duplicates("prompt_id")[cols].head(n).reset_index(drop=True)


def _rows(prompts: pd.DataFrame, index: dict, flag: str, path, features) -> np.ndarray:
    keys = prompts["prompt_id"].map(identity.id_key)
    missing = [pid for pid, k in zip(prompts["prompt_id"], keys, strict=True) if k not in index]
    if missing:
        raise DataError(f"{flag} {path}: prompt {missing[0]!r} has no features in --features {features} "
                        f"({len(missing)} of {len(keys)} have none): features of other prompts?")
    return np.array([index[k] for k in keys])


def run(args) -> None:
    from lara.io import write_json
    from lara.provenance import code_version
    from lara.read.files import read_table, write_table

    s = read_settings(args, ShiftSettings)
    log.info("settings %s", s)
    index, x = read_features(args.features)
    cal = read_table(args.calibration, required=("prompt_id",))
    cal_set = identity.prompt_set(cal, f"--calibration {args.calibration}", per_prompt=1)
    stream = read_table(args.deployment, required=("t", "prompt_id"))
    scenario = identity.read_identity(args.deployment).get("scenario")
    dep = deployment_sample(stream, s.n_prompts)
    dep_set = identity.prompt_set(dep, f"--deployment {args.deployment}")
    if len(dep) < s.n_prompts:
        log.warning("the stream visits %d distinct prompts, fewer than deployment.shift.n_prompts = %d: all of "
                    "them are the deployment sample", len(dep), s.n_prompts)
    both = set(cal["prompt_id"].map(identity.id_key)) & set(dep["prompt_id"].map(identity.id_key))
    shared = len(both) or identity.disjoint(cal_set, dep_set, "")
    if shared:
        raise DataError(f"--deployment {args.deployment}: {shared} of its first {len(dep)} distinct prompts are "
                        f"calibration prompts of {args.calibration}; the two samples must be disjoint (the "
                        "deployment pool never holds a calibration prompt)")
    rows = np.concatenate([_rows(cal, index, "--calibration", args.calibration, args.features),
                           _rows(dep, index, "--deployment", args.deployment, args.features)])
    y = np.r_[np.zeros(len(cal), dtype=np.int64), np.ones(len(dep), dtype=np.int64)]
    log.info("%d calibration and %d deployment prompts (%s), %d features; %d permutations of a %d-fold cross-fit",
             len(cal), len(dep), scenario or "no scenario", x.shape[1], s.permutations, s.folds)
    try:
        found = check(x[rows], y, s, progress="shift check")
    except ValueError as exc:
        raise DataError(f"--deployment {args.deployment}: {exc}") from None
    weights, null = found.pop("weights"), found.pop("null")
    made_from = {"--features": args.features, "--calibration": args.calibration, "--deployment": args.deployment}
    record = {"scenario": scenario, **found,
              "null_auc": {"mean": float(null.mean()), "quantile_95": float(np.quantile(null, 0.95))},
              "settings": asdict(s), "code": code_version(),
              "identity": identity.stamp("shift_check", args.out, scenario=scenario,
                                         stream=identity.file_digest(args.deployment), made_from=made_from)}
    table = pd.DataFrame({"prompt_id": cal["prompt_id"].to_numpy(), "weight": weights})
    made = identity.stamp("shift_weights", args.weights, scenario=scenario, ess=found["ess"], min_ess=s.min_ess,
                          n_calibration=found["n_calibration"], n_deployment=found["n_deployment"], auc=found["auc"],
                          p_value=found["p_value"], prompts=cal_set.record(),
                          prompt_texts=cal_set.digest if cal_set.keys else None,
                          stream=identity.file_digest(args.deployment), made_from=made_from)
    write_table(table, args.weights, {"settings": asdict(s), "code": code_version(), identity.KEY: made})
    write_json(args.out, record)
    log.info("AUC %.3f, permutation p = %.4g (null AUC mean %.3f, 95%% %.3f): %s", found["auc"], found["p_value"],
             null.mean(), np.quantile(null, 0.95), "SHIFTED" if found["shifted"] else "no detectable shift")
    log.info("weights: ESS %.1f of %d (min_ess %g: %s), largest weight %.3g, %.1f%% of deployment prompts above it",
             found["ess"], found["n_calibration"], s.min_ess, "usable" if found["weights_usable"] else "NOT usable",
             found["max_weight"], 100 * found["deployment_above_max_weight"])
    log.info("%s", found["statement"])
