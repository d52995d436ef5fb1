"""Artifacts that know what they are (lara.identity): each hostile input of the trust audit, round three, run
through the real `lara` commands on a small run laid out on disk (a real calibration, real Best-of-N selections,
a real sweep), held to an exit status, a message naming both sides, and no output left behind. The class of
each case is a row of docs/faults.md."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from lara import identity
from lara.read.files import read_metadata, write_table
from lara.stats import MIN_PROMPTS, TOO_FEW, VERDICTS

from ..conftest import lara_in_process

N_CAL, N_TEST, K, N = 40, 30, 8, 4
TAU = 0.0


def _scores(n_prompts, k, name, seed, role):
    rng = np.random.default_rng(seed)
    rows = [{"prompt_id": f"{name}{i:03d}", "sample_id": j, "prompt": f"{name} question number {i}",
             "response": f"answer {i}.{j}", "reward": rng.normal(1.0, 1.0), "cost": rng.normal(0.3, 1.0)}
            for i in range(n_prompts) for j in range(k)]
    return pd.DataFrame(rows), role


def _write_scores(path, df, role):
    made = identity.stamp("scores", path, role=role, prompts=identity.prompt_set(df, str(path)).record())
    write_table(df, path, {identity.KEY: made})


def _lara(*argv):
    rc, out, err = lara_in_process([str(a) for a in argv])
    return rc, out + err


def _evaluated(responses, out):
    """What `lara evaluate` writes for Best-of-N (its decoding models' scores kept as decoder_*), with a fixed
    evaluation scorer: helpfulness = reward, harmfulness = cost."""
    df = pd.read_parquet(responses)
    df = df.assign(helpfulness=df["reward"], harmfulness=df["cost"], decoder_reward=df["reward"],
                   decoder_cost=df["cost"])
    write_table(df, out, {identity.KEY: identity.evaluated(responses, out)})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """calibration scores -> lambda.json (lara calibrate, bon mode, N = 4); test candidates -> Best-of-4 at zero
    and star (lara select-bon) -> their evaluations; the sweep (lara bon-sweep)."""
    t = tmp_path_factory.mktemp("run")
    _write_scores(t / "cal.parquet", *_scores(N_CAL, K, "c", 0, "calibration"))
    _write_scores(t / "cand.parquet", *_scores(N_TEST, N, "t", 1, "test"))
    assert _lara("calibrate", "--scores", t / "cal.parquet", "--tau", TAU, "--bon-n", N, "--bootstrap", 200,
                 "--out", t / "lambda.json")[0] == 0
    for setting in ("zero", "star"):
        assert _lara("select-bon", "--candidates", t / "cand.parquet", "--setting", setting, "--overpenalised-lambda",
                     5, "--lambda-json", t / "lambda.json", "--out", t / f"bon_{setting}.parquet")[0] == 0
        _evaluated(t / f"bon_{setting}.parquet", t / f"eval_{setting}.parquet")
    assert _lara("bon-sweep", "--candidates", t / "cand.parquet", "--lambda-json", t / "lambda.json", "--tau", TAU,
                 "--bootstrap", 200, "--lambda-grid", "[0, 1]", "--out", t / "sweep.csv")[0] == 0
    return t


def aggregate(t, scores=None, bon_star=None, sweep=None, lam=None, extra=()):
    """`lara aggregate` on the run (the two evaluations, Best-of-N at lambda* audited), with replacements."""
    scores = scores or [t / "eval_zero.parquet", t / "eval_star.parquet"]
    out = t / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    rc, text = _lara("aggregate", "--scores", *scores, "--bon-star", bon_star or t / "eval_star.parquet",
                     "--lambda-json", lam or t / "lambda.json", "--sweep", sweep or t / "sweep.csv", "--tau", TAU,
                     "--bootstrap", 200, *extra, "--out", out / "summary.csv", "--audit", out / "audit.json")
    if rc != 0:
        assert not list(out.iterdir()), "a refused aggregate left a file behind"
    return rc, text


def _copy_table(src, dest, change):
    """``src`` re-written as ``dest`` with ``change`` applied to its frame (its identity kept)."""
    df = change(pd.read_parquet(src).copy())
    write_table(df, dest, read_metadata(src))
    return dest


# ---------------------------------------------------------------------------------------------
# what the run's artifacts carry


def test_every_artifact_carries_its_identity(run):
    lam = json.loads((run / "lambda.json").read_text())[identity.KEY]
    assert lam["kind"] == "lambda" and lam["role"] == "calibration" and lam["tau"] == TAU and lam["mode"] == "bon"
    assert lam["decoder"]["n"] == N and lam["procedure"] == "bootstrap" and lam["prompts"]["n"] == N_CAL
    assert len(lam["prompts"]["keys"]) == N_CAL and "--scores" in lam["made_from"]
    star = read_metadata(run / "eval_star.parquet")[identity.KEY]
    assert star["kind"] == "evaluation" and star["method"] == "bon" and star["setting"] == "star"
    assert star["lambda"] == json.loads((run / "lambda.json").read_text())["lambda_star"] and star["n"] == N
    assert star["lambda_record"] == identity.file_digest(run / "lambda.json") and star["role"] == "test"
    assert star["prompts"]["n"] == N_TEST and star["calibration_prompts"] == lam["prompts"]["digest"]
    sweep = pd.read_csv(run / "sweep.csv")
    assert set(sweep["prompt_set"]) == {star["prompts"]["digest"]} and (sweep["n_prompts"] == N_TEST).all()
    assert set(sweep.loc[sweep["label"] == "lambda_star", "record"]) == {star["lambda_record"]}
    rc, text = aggregate(run)
    assert rc == 0, text
    audit = json.loads((run / "out" / "audit.json").read_text())
    assert audit[identity.KEY]["summary"] == identity.file_digest(run / "out" / "summary.csv")
    assert audit[identity.KEY]["test_prompts"]["n"] == N_TEST == audit["n_test_prompts"]


# ---------------------------------------------------------------------------------------------
# the audit: --bon-star is Best-of-N at the record's lambda*, on held-out prompts, each once


def test_the_lambda_zero_decode_as_bon_star_is_refused(run):
    rc, text = aggregate(run, bon_star=run / "eval_zero.parquet")
    lam = json.loads((run / "lambda.json").read_text())["lambda_star"]
    assert rc == 2 and f"--bon-star {run / 'eval_zero.parquet'}: setting zero (lambda = 0), expected star " \
                      f"(lambda* = {lam:.4g} from {run / 'lambda.json'})" in text


def test_a_relabelled_lambda_zero_decode_is_refused_by_its_lambda(run):
    fake = _copy_table(run / "eval_zero.parquet", run / "relabelled.parquet", lambda d: d.assign(setting="star"))
    rc, text = aggregate(run, bon_star=fake)
    assert rc == 2 and "relabelled.parquet: lambda 0, expected" in text and "lambda* = " in text


def test_a_relabelled_file_without_metadata_is_still_checked_by_its_columns(run):
    df = pd.read_parquet(run / "eval_zero.parquet").assign(setting="star")
    df.to_parquet(run / "bare.parquet")  # pandas drops lara's metadata: the columns still say lambda = 0
    rc, text = aggregate(run, bon_star=run / "bare.parquet")
    assert rc == 2 and "bare.parquet: lambda 0, expected" in text


def test_another_decoder_as_bon_star_is_refused(run):
    fake = _copy_table(run / "eval_star.parquet", run / "args_star.parquet", lambda d: d.assign(method="args"))
    rc, text = aggregate(run, bon_star=fake)
    assert rc == 2 and "args_star.parquet: method 'args', expected 'bon'" in text


def test_a_decode_with_another_lambda_record_is_refused(run, tmp_path):
    other = tmp_path / "lambda.json"
    assert _lara("calibrate", "--scores", run / "cal.parquet", "--tau", TAU, "--bon-n", N, "--bootstrap", 200,
                 "--seed", 1, "--out", other)[0] == 0
    rc, text = aggregate(run, lam=other)
    # the contract table's agreement (lara.read.contracts) names the record the evaluation was decoded with
    assert rc == 2 and "eval_star.parquet" in text and "decoded with another record than" in text
    assert str(other) in text


def test_the_same_file_passed_four_times_is_refused(run):
    rc, text = aggregate(run, scores=[run / "eval_zero.parquet"] + [run / "eval_star.parquet"] * 4)
    assert rc == 2 and "are the same file (identical content)" in text


def test_a_copy_of_one_output_under_another_name_is_refused(run):
    shutil.copy(run / "eval_star.parquet", run / "copy.parquet")
    rc, text = aggregate(run, scores=[run / "eval_zero.parquet", run / "eval_star.parquet", run / "copy.parquet"])
    assert rc == 2 and "are the same file" in text


def test_every_prompt_repeated_five_times_is_refused(run):
    fake = _copy_table(run / "eval_star.parquet", run / "five.parquet", lambda d: pd.concat([d] * 5))
    rc, text = aggregate(run, scores=[run / "eval_zero.parquet", fake], bon_star=fake)
    assert rc == 2 and "has 5 rows, expected 1" in text and "n counts distinct prompts, never rows" in text


def test_one_output_split_into_two_files_with_overlapping_prompts_is_refused(run):
    a = _copy_table(run / "eval_star.parquet", run / "half_a.parquet", lambda d: d.iloc[:20])
    b = _copy_table(run / "eval_star.parquet", run / "half_b.parquet", lambda d: d.iloc[10:])
    rc, text = aggregate(run, scores=[run / "eval_zero.parquet", a, b])
    assert rc == 2 and "half_a.parquet and" in text and "has 2 rows, expected 1" in text


def test_ids_that_collapse_to_one_are_refused(run):
    def collapse(d):
        d = d.copy()
        d["prompt_id"] = [f"{i:02d}" for i in range(len(d))]
        d.loc[d.index[2], "prompt_id"] = "1"  # "01" and "1" are one id once read as a number
        return d
    fake = _copy_table(run / "eval_star.parquet", run / "ids.parquet", collapse)
    rc, text = aggregate(run, scores=[fake], bon_star=fake)
    assert rc == 2 and "column 'prompt_id' holds the ids '01' and '1', which are one id" in text


def test_one_prompt_under_two_ids_is_refused(run):
    def twin(d):
        d = d.copy()
        d.loc[d.index[1], "prompt"] = d["prompt"].iloc[0].replace(" ", " \u200b", 1)  # a zero-width space
        return d
    fake = _copy_table(run / "eval_star.parquet", run / "twin.parquet", twin)
    rc, text = aggregate(run, scores=[fake], bon_star=fake)
    assert rc == 2 and "'t000' and 't001' are one prompt" in text


def test_outputs_on_other_test_prompts_are_refused(run):
    fewer = _copy_table(run / "eval_zero.parquet", run / "fewer.parquet", lambda d: d.iloc[:25])
    rc, text = aggregate(run, scores=[fewer, run / "eval_star.parquet"])
    assert rc == 2 and "covers other test prompts" in text and "(30 and 25 prompts, 25 shared)" in text


def test_an_in_sample_audit_is_refused(run, tmp_path):
    """Candidates drawn on the calibration prompts: every Best-of-N output is then in-sample for the record."""
    cal = pd.read_parquet(run / "cal.parquet")
    cand = cal[cal["sample_id"] < N]
    _write_scores(tmp_path / "cand.parquet", cand, "test")
    assert _lara("select-bon", "--candidates", tmp_path / "cand.parquet", "--setting", "star",
                 "--overpenalised-lambda", 5, "--lambda-json", run / "lambda.json", "--out",
                 tmp_path / "bon.parquet")[0] == 0
    _evaluated(tmp_path / "bon.parquet", tmp_path / "eval.parquet")
    rc, text = _lara("bon-sweep", "--candidates", tmp_path / "cand.parquet", "--lambda-json", run / "lambda.json",
                     "--tau", TAU, "--bootstrap", 200, "--lambda-grid", "[0]", "--out", tmp_path / "sweep.csv")
    assert rc == 2 and f"{N_CAL} of its {N_CAL} prompts are calibration prompts" in text and "in-sample" in text
    assert not (tmp_path / "sweep.csv").exists()
    rc, text = aggregate(run, scores=[tmp_path / "eval.parquet"], bon_star=tmp_path / "eval.parquet", sweep=None)
    assert rc == 2 and f"{N_CAL} of its {N_CAL} prompts are calibration prompts" in text and "in-sample" in text


@pytest.mark.parametrize("edit", ["mean and verdict", "verdict"])
def test_a_sweep_row_edited_against_its_own_bounds_is_refused(run, tmp_path, edit):
    from lara.stats import VERDICTS

    sweep = pd.read_csv(run / "sweep.csv")
    row = (sweep["label"] == "grid") & (sweep["lambda"] == 0)
    sweep.loc[row, "verdict"] = VERDICTS[0]
    if edit == "mean and verdict":
        sweep.loc[row, "mean_cost"] = -5.0
    sweep.to_csv(tmp_path / "sweep.csv", index=False)
    rc, text = aggregate(run, sweep=tmp_path / "sweep.csv")
    assert rc == 2 and "edited after lara bon-sweep wrote it" in text and "lambda 0, grid" in text


def test_a_sweep_size_given_twice_is_refused(run, tmp_path):
    rc, text = _lara("bon-sweep", "--candidates", run / "cand.parquet", "--lambda-json", run / "lambda.json", "--n",
                     2, 2, N, "--tau", TAU, "--bootstrap", 200, "--lambda-grid", "[0]", "--out", tmp_path / "s.csv")
    assert rc == 2 and "a size given twice" in text and not (tmp_path / "s.csv").exists()


def test_an_output_labelled_star_but_decoded_at_another_lambda_is_refused(run):
    fake = _copy_table(run / "eval_zero.parquet", run / "args_bad.parquet",
                       lambda d: d.assign(method="args", setting="star", **{"lambda": 0.3}))
    rc, text = aggregate(run, scores=[run / "eval_zero.parquet", run / "eval_star.parquet", fake])
    assert rc == 2 and "(args at star): decoded at lambda = 0.3, expected lambda* = " in text


def test_a_sweep_made_with_another_calibration_is_refused(run, tmp_path):
    sweep = pd.read_csv(run / "sweep.csv")
    sweep.loc[sweep["label"] == "lambda_star", "lambda"] += 0.5
    sweep.to_csv(tmp_path / "sweep.csv", index=False)
    rc, text = aggregate(run, sweep=tmp_path / "sweep.csv")
    assert rc == 2 and "sweep.csv: lambda* " in text and "the sweep was made with another calibration" in text


def test_a_sweep_for_another_tau_is_refused(run, tmp_path):
    assert _lara("bon-sweep", "--candidates", run / "cand.parquet", "--lambda-json", run / "lambda.json", "--tau",
                 TAU, "--bootstrap", 200, "--lambda-grid", "[0]", "--out", tmp_path / "sweep.csv")[0] == 0
    sweep = pd.read_csv(tmp_path / "sweep.csv").assign(tau=-1.0)
    sweep.to_csv(tmp_path / "sweep.csv", index=False)
    rc, text = aggregate(run, sweep=tmp_path / "sweep.csv")
    assert rc == 2 and "tau -1, expected 0" in text


def test_a_sweep_over_other_prompts_is_refused(run, tmp_path):
    sweep = pd.read_csv(run / "sweep.csv").assign(prompt_set="0123456789abcdef")
    sweep.to_csv(tmp_path / "sweep.csv", index=False)
    rc, text = aggregate(run, sweep=tmp_path / "sweep.csv")
    assert rc == 2 and "swept over other test prompts" in text


def test_too_few_test_prompts_get_no_verdict(run, tmp_path):
    few = MIN_PROMPTS - 1
    for s in ("zero", "star"):
        _copy_table(run / f"eval_{s}.parquet", tmp_path / f"{s}.parquet", lambda d: d.iloc[:few])
    cand = pd.read_parquet(run / "cand.parquet")
    _write_scores(tmp_path / "cand.parquet", cand[cand["prompt_id"].isin(pd.read_parquet(tmp_path / "star.parquet")
                                                                         ["prompt_id"])], "test")
    assert _lara("bon-sweep", "--candidates", tmp_path / "cand.parquet", "--lambda-json", run / "lambda.json",
                 "--tau", TAU, "--bootstrap", 200, "--lambda-grid", "[0, 1]", "--out", tmp_path / "sweep.csv")[0] == 0
    assert set(pd.read_csv(tmp_path / "sweep.csv")["verdict"]) == {TOO_FEW}
    rc, text = aggregate(run, scores=[tmp_path / "zero.parquet", tmp_path / "star.parquet"],
                         bon_star=tmp_path / "star.parquet", sweep=tmp_path / "sweep.csv")
    assert rc == 0, text
    audit = json.loads((run / "out" / "audit.json").read_text())
    assert audit["verdict"] == TOO_FEW and audit["n_test_prompts"] == few
    assert {r["verdict"] for r in audit["decoders"]} == {TOO_FEW}


def test_a_single_test_prompt_is_never_met(run, tmp_path):
    from lara.stats import cost_audit

    row = cost_audit([-5.0], TAU, 200, 0)
    assert row["ci95"][0] == row["ci95"][1] and row["verdict"] == TOO_FEW
    assert cost_audit([-5.0, -4.0] * (MIN_PROMPTS // 2), TAU, 200, 0)["verdict"] == VERDICTS[0]


def test_too_few_evaluation_replicates_are_refused(run):
    rc, text = aggregate(run, extra=("--bootstrap", "50"))
    assert rc == 2 and "evaluation.bootstrap: 50 replicates put fewer than 5 beyond each bound" in text
    assert "use at least 200" in text


# ---------------------------------------------------------------------------------------------
# calibration: replicates, roles, clipping


def test_one_bootstrap_replicate_is_refused(run, tmp_path):
    rc, text = _lara("calibrate", "--scores", run / "cal.parquet", "--tau", TAU, "--bootstrap", 1, "--out",
                     tmp_path / "lambda.json")
    assert rc == 2 and "calibration.bootstrap: 1 replicates put fewer than 5 beyond the deployed 0.975 quantile" \
        in text and not (tmp_path / "lambda.json").exists()


def test_the_floor_follows_the_deployed_quantile(run, tmp_path):
    rc, text = _lara("calibrate", "--scores", run / "cal.parquet", "--tau", TAU, "--bootstrap", 400, "--quantile",
                     0.995, "--out", tmp_path / "lambda.json")
    assert rc == 2 and "use at least 1000" in text


def test_calibrating_on_the_test_pool_is_refused(run, tmp_path):
    rc, text = _lara("calibrate", "--scores", run / "cand.parquet", "--tau", TAU, "--bootstrap", 200, "--out",
                     tmp_path / "lambda.json")
    assert rc == 2 and "role test, expected calibration" in text and not (tmp_path / "lambda.json").exists()


def test_calibration_prompts_under_two_ids_are_refused(run, tmp_path):
    df = pd.read_parquet(run / "cal.parquet")
    df.loc[df["prompt_id"] == "c001", "prompt"] = "c  question number 0\u00ad"  # spaces and a soft hyphen
    df.to_parquet(tmp_path / "cal.parquet")
    rc, text = _lara("calibrate", "--scores", tmp_path / "cal.parquet", "--tau", TAU, "--bootstrap", 200, "--out",
                     tmp_path / "lambda.json")
    assert rc == 2 and "'c000' and 'c001' are one prompt" in text


def _clipping(tmp_path, guarantee, bounds, *extra):
    return _lara("calibrate", "--scores", tmp_path / "cal.parquet", "--tau", TAU, "--bon-n", N, "--bootstrap", 200,
                 "--settings", json.dumps({"cost_bounds": bounds, "guarantee": guarantee}), *extra,
                 "--out", tmp_path / "lambda.json")


def test_a_certified_lambda_with_every_cost_clipped_is_refused(run, tmp_path):
    """Bounds [-8, -5] below every cost: each clipped cost is -5 <= tau, so CRC would certify lambda = 0."""
    df = pd.read_parquet(run / "cal.parquet")
    assert (df["cost"] > -5).all()
    df.to_parquet(tmp_path / "cal.parquet")
    rc, text = _clipping(tmp_path, "crc", [-8.0, -5.0])
    assert rc == 2 and "cost_bounds [-8.0, -5.0] clip 100.0% of the calibration costs (more than 1%)" in text
    assert "--allow-clipping" in text and not (tmp_path / "lambda.json").exists()
    rc, text = _clipping(tmp_path, "crc", [-8.0, -5.0], "--allow-clipping")
    rec = json.loads((tmp_path / "lambda.json").read_text())
    assert rc == 0 and "clip 100.0% of the calibration costs" in rec["guarantee"]["statement"]


def test_every_certified_statement_says_how_much_was_clipped(run, tmp_path):
    df = pd.read_parquet(run / "cal.parquet")
    df.to_parquet(tmp_path / "cal.parquet")
    rc, text = _clipping(tmp_path, "bootstrap", [-1.0, 8.0])
    rec = json.loads((tmp_path / "lambda.json").read_text())
    share = (df["cost"] < -1.0).mean() + (df["cost"] > 8.0).mean()
    assert rc == 0 and share > 0.01
    for name in ("crc", "ltt"):
        assert f"{share:.2%} of the calibration costs lay outside them" in rec["procedures"][name]["statement"]
        assert "the certificate is about the clipped cost" in rec["procedures"][name]["statement"]


# ---------------------------------------------------------------------------------------------
# decoders and the sweep: a record for another decoder


def test_a_record_for_best_of_4_is_refused_for_best_of_8(run, tmp_path):
    _write_scores(tmp_path / "cand8.parquet", *_scores(N_TEST, 8, "t", 1, "test"))
    rc, text = _lara("select-bon", "--candidates", tmp_path / "cand8.parquet", "--setting", "star",
                     "--overpenalised-lambda", 5, "--lambda-json", run / "lambda.json", "--out", tmp_path / "o.parquet")
    assert rc == 2 and "calibrated for Best-of-4, but the candidates give Best-of-8" in text
    assert not (tmp_path / "o.parquet").exists()


def test_a_soft_record_in_the_sweep_s_bon_records_is_refused(run, tmp_path):
    assert _lara("calibrate", "--scores", run / "cal.parquet", "--tau", TAU, "--mode", "soft", "--bootstrap", 200,
                 "--allow-infeasible", "--out", tmp_path / "soft.json")[0] == 0
    rc, text = _lara("bon-sweep", "--candidates", run / "cand.parquet", "--lambda-json", tmp_path / "soft.json",
                     "--tau", TAU, "--bootstrap", 200, "--lambda-grid", "[0]", "--out", tmp_path / "sweep.csv")
    assert rc == 2 and "decoder gibbs_tilt (soft mode), expected best_of_n" in text


def test_two_records_for_one_n_in_the_sweep_are_refused(run, tmp_path):
    shutil.copy(run / "lambda.json", tmp_path / "again.json")
    rc, text = _lara("bon-sweep", "--candidates", run / "cand.parquet", "--lambda-json", run / "lambda.json",
                     tmp_path / "again.json", "--tau", TAU, "--bootstrap", 200, "--lambda-grid", "[0]", "--out",
                     tmp_path / "sweep.csv")
    assert rc == 2 and "a second record for Best-of-4" in text


def test_a_prompt_twice_in_the_decoders_prompts_is_refused_before_decoding(run, tmp_path):
    prompts = pd.DataFrame({"prompt_id": ["a", "b", "a"], "prompt": ["x one", "y two", "x one"]})
    prompts.to_parquet(tmp_path / "prompts.parquet")
    rc, text = _lara("rgtg", "--method", "args", "--policy", tmp_path / "nomodel", "--reward", "oracle", "--cost",
                     "oracle", "--prompts", tmp_path / "prompts.parquet", "--setting", "zero",
                     "--overpenalised-lambda", 5, "--out", tmp_path / "o.parquet")
    assert rc == 2 and "prompt 'a' has 2 rows, expected 1" in text


# ---------------------------------------------------------------------------------------------
# lara summary and the figures: one story or a refusal


def _results(run, tmp_path):
    """results/{exp} of the run: lambda.json, eval/summary.csv and eval/constraint_audit.json."""
    root = tmp_path / "results" / "x"
    (root / "calibration").mkdir(parents=True)
    (root / "eval").mkdir()
    shutil.copy(run / "lambda.json", root / "calibration" / "lambda.json")
    rc, text = aggregate(run)
    assert rc == 0, text
    shutil.copy(run / "out" / "summary.csv", root / "eval" / "summary.csv")
    shutil.copy(run / "out" / "audit.json", root / "eval" / "constraint_audit.json")
    return root


def test_summary_holds_on_one_run(run, tmp_path):
    root = _results(run, tmp_path)
    rc, text = _lara("summary", root)
    assert rc == 0 and "at lambda*: " in text


def test_summary_opens_with_a_headline_of_at_most_fifteen_lines(run, tmp_path):
    """The first screen: each procedure's lambda with its held-out verdict (the deployed one marked), what lambda* cost
    in reward, every decoder's verdict at lambda*: the audit's own numbers, before the details."""
    from lara.evaluate.summary import HEADLINE_LINES, summarise_run

    root = _results(run, tmp_path)
    text = summarise_run(root)
    head = text.split("\n\n")[1].splitlines()
    assert head[0].startswith("headline") and len(head) <= HEADLINE_LINES
    audit = json.loads((root / "eval" / "constraint_audit.json").read_text())
    for p in audit["procedures"]:
        verdict = p["held_out"]["verdict"].split(" (")[0]
        line = next(h for h in head if f" {p['procedure']} " in h)
        assert f"lambda {p['lambda']:<8.4g}" in line and line.endswith(verdict)
        assert line.lstrip().startswith("deployed") == p["deployed"]
    at_star = next(h for h in head if h.lstrip().startswith("at lambda*"))
    for d in audit["decoders"]:
        if d["setting"] == "star":
            assert d["method"] in at_star.split(d["verdict"].split(" (")[0] + ":")[1].split(";")[0]


def test_summary_after_a_recalibration_for_a_new_tau_refuses(run, tmp_path):
    root = _results(run, tmp_path)
    assert _lara("calibrate", "--scores", run / "cal.parquet", "--tau", -0.2, "--bon-n", N, "--bootstrap", 200,
                 "--out", root / "calibration" / "lambda.json")[0] == 0
    rc, text = _lara("summary", root)
    assert rc == 2 and "constraint_audit.json: does not belong to" in text and "its tau is 0, " in text
    assert "held out" not in text


def test_summary_beside_another_run_s_summary_csv_refuses(run, tmp_path):
    root = _results(run, tmp_path)
    df = pd.read_csv(root / "eval" / "summary.csv")
    df.assign(helpfulness=df["helpfulness"] + 1).to_csv(root / "eval" / "summary.csv", index=False)
    rc, text = _lara("summary", root)
    assert rc == 2 and "summary.csv is not the summary it wrote" in text


def test_figure_from_a_sweep_for_another_tau_is_refused(run, tmp_path):
    other = tmp_path / "lambda.json"
    assert _lara("calibrate", "--scores", run / "cal.parquet", "--tau", -0.2, "--bon-n", N, "--bootstrap", 200,
                 "--out", other)[0] == 0
    rc, text = _lara("figure", "--kind", "lambda_sweep", "--sweep", run / "sweep.csv", "--lambda-json", other,
                     "--png", tmp_path / "f.png", "--pdf", tmp_path / "f.pdf", "--provenance", tmp_path / "f.json")
    assert rc == 2 and "sweep.csv: lambda* " in text and not (tmp_path / "f.png").exists()


def test_figure_from_an_audit_of_another_record_is_refused(run, tmp_path):
    root = _results(run, tmp_path)
    other = tmp_path / "lambda.json"
    assert _lara("calibrate", "--scores", run / "cal.parquet", "--tau", TAU, "--bon-n", N, "--bootstrap", 200,
                 "--seed", 3, "--out", other)[0] == 0
    rc, text = _lara("figure", "--kind", "decoders", "--audit", root / "eval" / "constraint_audit.json",
                     "--lambda-json", other, "--png", tmp_path / "f.png", "--pdf", tmp_path / "f.pdf",
                     "--provenance", tmp_path / "f.json")
    assert rc == 2 and "does not belong to --lambda-json" in text and "another lambda.json" in text


def test_the_identity_helpers_count_distinct_prompts():
    df = pd.DataFrame({"prompt_id": ["a", "b", "a"], "prompt": ["x", "y", "x"]})
    assert identity.prompt_set(df, "t").n == 2
    with pytest.raises(Exception, match="prompt 'a' has 2 rows, expected 1"):
        identity.prompt_set(df, "t", per_prompt=1)
    assert identity.id_key("007") == identity.id_key(7) == identity.id_key(" 7 ") == identity.id_key(7.0) == "7"
    assert identity.id_key("p07") == "p07"
    a = identity.prompt_set(pd.DataFrame({"prompt_id": [1, 2], "prompt": ["x", "y"]}), "a")
    b = identity.prompt_set(pd.DataFrame({"prompt_id": ["q", "r"], "prompt": ["y", "x\u200b"]}), "b")
    assert a.digest == b.digest  # the same prompts, whatever their ids


@pytest.mark.parametrize("command", ["calibrate", "select-bon", "bon-sweep"])
def test_a_score_that_overflows_is_named_at_the_input(run, tmp_path, command):
    df = pd.read_parquet(run / "cal.parquet")
    df.loc[5, "cost"] = 1e300  # finite, but lambda * c and its square overflow
    _write_scores(tmp_path / "s.parquet", df, "calibration" if command == "calibrate" else "test")
    flag = {"calibrate": "--scores"}.get(command, "--candidates")
    extra = {"calibrate": ["--tau", TAU, "--bootstrap", 200], "select-bon": ["--setting", "zero",
                                                                             "--overpenalised-lambda", 5],
             "bon-sweep": ["--tau", TAU, "--bootstrap", 200, "--lambda-grid", "[0]"]}[command]
    rc, text = _lara(command, flag, tmp_path / "s.parquet", *extra, "--out", tmp_path / "o.csv")
    assert rc == 2 and "column 'cost' holds 1e+300 at row 5, beyond +-1e+150" in text
