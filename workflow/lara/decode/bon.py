"""Best-of-N with the calibrated reward r - lambda c.

N candidates per test prompt are sampled and scored once; selection for any lambda is an
argmax over the stored scores (ties go to the lower cost, then the lower sample index: the
order that ``lara calibrate --mode bon`` uses, :func:`lara.calibrate.bestofn.order`), so a
whole lambda sweep needs no new generation.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

# select(reward, cost, lams): (L, P) index of the chosen candidate per lambda and prompt, the very order that
# ``lara calibrate --mode bon`` calibrates (one shared function)
from lara.calibrate.bestofn import select_grid as select
from lara.calibrate.record import add_lambda_arguments, read_lambda, resolve_lambda
from lara.read.candidates import score_matrix

log = logging.getLogger(__name__)


def check_calibrated_for(n: int, setting: str, lambda_json: str | Path | None, weighted: bool = False) -> None:
    """A lambda read from a record calibrated for Best-of-N with another N is refused (its lambda* meets tau
    for that N only), and so is a soft-mode record (the Gibbs tilt's lambda: Best-of-N is calibrated in bon mode,
    which the config requires wherever Best-of-N is decoded; the soft lambda* reaches Fig. 1 as the sweep's
    soft_beta rows). A covariate-shift weighted record is for its scenario's stream only: refused unless
    ``weighted`` (the deployment steps, which check its scenario and stream)."""
    from lara.read.files import DataError

    if setting in ("zero", "max") or not (lambda_json and Path(lambda_json).is_file()):
        return
    record = read_lambda(lambda_json)
    decoder = record.decoder
    if record.weighted and not weighted:
        raise DataError(f"--lambda-json {lambda_json}: a covariate-shift weighted record (lara calibrate --weights, "
                        f"scenario {(record.get('weights') or {}).get('scenario')!r}): its lambda is for that "
                        f"deployment scenario's prompts, not setting {setting!r} on these prompts; pass the "
                        "unweighted calibration/lambda.json")
    if decoder.get("kind") == "gibbs_tilt":
        raise DataError(f"--lambda-json {lambda_json}: calibrated in soft mode (the Gibbs tilt at beta = "
                        f"{decoder.get('beta')}), not for argmax Best-of-{n}: setting {setting!r} would deploy another "
                        "decoder's lambda (calibrate in bon mode; bon-sweep --soft-lambda-json shows the soft one)")
    if decoder.get("kind") == "best_of_n" and decoder.get("n") not in (None, n):
        raise DataError(f"--lambda-json {lambda_json}: calibrated for Best-of-{decoder['n']}, but the candidates "
                        f"give Best-of-{n}: calibrate for N = {n} (decode.bon_n) or draw N = {decoder['n']} candidates")


# ---------------------------------------------------------------------------------------------
# CLI: lara select-bon (its reader serves bon-sweep, its writer select-bon-prune)

HELP = "select the Best-of-N candidate by r - lambda c for a named lambda setting"


def add_arguments(parser) -> None:
    parser.add_argument("--candidates", required=True, help="scored candidates (prompt_id, sample_id, reward, cost)")
    add_lambda_arguments(parser)
    parser.add_argument("--out", required=True, help="output parquet: one response per prompt")


def read_scored(path, text=()) -> tuple:
    """A scored candidates table (``--candidates``: prompt_id, sample_id, ``text``, reward, cost) and its (P, N)
    matrices: (table, prompt ids, reward, cost, row index) (:func:`lara.read.candidates.score_matrix`)."""
    from lara.read.files import DataError, read_table, require_in_range

    df = read_table(path, required=("prompt_id", "sample_id", *text, "reward", "cost"))
    require_in_range(df, ("reward", "cost"), path)
    try:
        return (df, *score_matrix(df))
    except ValueError as exc:
        raise DataError(f"{path}: {exc}") from None


def write_choice(chosen, args, method: str, lam: float, n: int, prompts, meta=None, columns=None, **fields) -> None:
    """Write the Best-of-``n`` decoder's choice per prompt (``chosen``, rows of ``--candidates``) to ``--out``: the
    ``method``, setting and ``lam`` columns (then ``columns``, the decoder's own), the identity of an output decoded at
    ``lam`` from ``--lambda-json`` (with ``fields``, the decoder's own: its schedule), and ``meta`` beside it: the
    one writer of select-bon and select-bon-prune."""
    from lara import identity
    from lara.read.files import write_table

    chosen["method"], chosen["setting"], chosen["lambda"] = method, args.setting, lam
    for name, values in (columns or {}).items():
        chosen[name] = values
    made = identity.decoded_identity("responses", args.out, method, args.setting, lam, args.lambda_json, n=n,
                                     role=identity.role_of(args.candidates), prompts=prompts.record(),
                                     made_from={"--candidates": args.candidates}, **fields)
    write_table(chosen.reset_index(drop=True), args.out, {"setting": args.setting, "lambda": lam, **(meta or {}),
                                                          "candidates": args.candidates, identity.KEY: made})


def run(args) -> None:
    from lara import identity

    df, ids, reward, cost, index = read_scored(args.candidates, ("prompt", "response"))
    lam = resolve_lambda(args.setting, args.overpenalised_lambda, args.lambda_json)
    check_calibrated_for(reward.shape[1], args.setting, args.lambda_json)
    prompts = identity.prompt_set(df, f"--candidates {args.candidates}")
    chosen = df.loc[index[np.arange(len(ids)), select(reward, cost, [lam])[0]]].copy()
    log.info("Best-of-%d at lambda=%s (%.6g): mean reward %.4f, mean cost %.4f, safe %.3f", reward.shape[1],
             args.setting, lam, chosen["reward"].mean(), chosen["cost"].mean(), (chosen["cost"] <= 0).mean())
    write_choice(chosen, args, "bon", lam, reward.shape[1], prompts)
