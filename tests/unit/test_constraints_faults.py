"""Hostile inputs to the several-constraints steps, through the real commands on the toy oracle (a named scorer: no
model is trained). A chain is built once: calibration and test samples of toy requests, scored per harm category
(lara score-constraints), the vector lambda (lara calibrate-vector), Best-of-N at zero and at lambda*
(lara decode-vector) and their audit (lara audit-constraints). Each case then hands a step a file that is not what
its flag says, or settings it cannot honour, and expects a refusal naming the file or key, nothing written."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from lara import identity
from lara.cli import main
from lara.constraints.spec import Constraint, to_json
from lara.read.files import read_metadata, write_table
from lara.toy.world import CATEGORY_OF, STYLES, all_requests, make_response

K = 4
COSTS = ("--cost", "violence=oracle", "--cost", "crime=oracle")
EVALS = ("--evaluation", "violence=oracle", "--evaluation", "crime=oracle")
SOME = tuple(s for s in STYLES if s != "redirect")  # a topic without alternatives has nothing to redirect to


def lara(*argv) -> int:
    return main([str(a) for a in argv])


def write_samples(path, requests, role: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = [{"prompt_id": f"{role[0]}{i}", "sample_id": k, "prompt": r.text,
             "response": make_response(rng, r, str(rng.choice(STYLES if r.topic.alternatives else SOME)))}
            for i, r in enumerate(requests) for k in range(K)]
    df = pd.DataFrame(rows)
    write_table(df, path, {identity.KEY: identity.stamp("samples", path, role=role, per_prompt=K,
                                                        prompts=identity.prompt_set(df, str(path)).record())})


def constraints_at(tau) -> list[Constraint]:
    return [Constraint("violence", "category:violence", float(tau[0])),
            Constraint("crime", "category:crime", float(tau[1]))]


def calibrate(d, scores, cons, out, **settings) -> int:
    s = {"tau": cons[0].tau, "bon_n": K, "bootstrap": 200, "lambda_search_max": 20.0, "seed": 0} | settings
    return lara("calibrate-vector", "--scores", scores, "--constraints", to_json(cons), "--settings", json.dumps(s),
                "--out", out)


def decode(d, setting, cons, lam, out, candidates=None) -> int:
    return lara("decode-vector", "--method", "bon", "--setting", setting, "--constraints", to_json(cons),
                "--lambda-json", lam, "--candidates", candidates or d / "test_scores.parquet", "--out", out)


def audit(d, responses, cons, lam, costs=COSTS, reward="oracle") -> int:
    return lara("audit-constraints", "--responses", *responses, "--constraints", to_json(cons), "--lambda-json", lam,
                "--reward", reward, *costs, *EVALS, "--settings", json.dumps({"tau": cons[0].tau, "bootstrap": 200}),
                "--out", d / "audit.json", "--table", d / "audit.csv")


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    from lara.calibrate.vector import expected_vector
    from lara.constraints.calibrate import load_vector_scores

    d = tmp_path_factory.mktemp("chain") / "results" / "x" / "constraints"
    d.mkdir(parents=True)
    harmful = [r for r in all_requests() if r.topic.name in CATEGORY_OF]
    benign = [r for r in all_requests() if not r.topic.harmful]
    rng = np.random.default_rng(0)
    pool = [harmful[i] for i in rng.permutation(len(harmful))[:60]] + benign[:10]
    cut = int(0.6 * len(pool))
    for role, reqs, seed in (("calibration", pool[:cut], 1), ("test", pool[cut:], 2)):
        write_samples(d / f"{role}_samples.parquet", reqs, role, seed)
        assert lara("score-constraints", "--input", d / f"{role}_samples.parquet", "--reward", "oracle", *COSTS,
                    "--settings", "{}", "--out", d / f"{role}_scores.parquet") == 0
    # taus half-way between the costs at lambda = 0 and under a heavy penalty: both bind, both can be met
    probe = load_vector_scores(d / "calibration_scores.parquet", constraints_at([0.0, 0.0]))
    zero, heavy = (expected_vector(probe.reward, probe.costs, probe.mask, np.full(2, v), K).mean(axis=0)
                   for v in (0.0, 15.0))
    assert np.all(heavy < zero - 0.05), (zero, heavy)
    cons = constraints_at(np.round((zero + heavy) / 2, 4))
    assert calibrate(d, d / "calibration_scores.parquet", cons, d / "lambda.json") == 0
    for setting in ("zero", "star"):
        assert decode(d, setting, cons, d / "lambda.json", d / f"bon_{setting}.parquet") == 0
    return d, cons


def refused(capsys, rc, *says) -> str:
    err = capsys.readouterr().err
    assert rc == 2, err[-2000:]
    for s in says:
        assert s in err, err[-2000:]
    return err


def test_the_chain_audits_both_outputs(chain):
    d, cons = chain
    assert audit(d, [d / "bon_zero.parquet", d / "bon_star.parquet"], cons, d / "lambda.json") == 0
    record = json.loads((d / "audit.json").read_text())
    assert {(j["method"], j["setting"]) for j in record["joint"]} == {("bon", "zero"), ("bon", "star")}
    made = record["identity"]
    assert made["prompts"]["n"] == pd.read_parquet(d / "bon_star.parquet")["prompt_id"].nunique()
    decoded = identity.read_identity(d / "bon_star.parquet")
    assert decoded["cost_scorers"] == {"violence": "oracle", "crime": "oracle"}
    assert decoded["reward_scorer"] == "oracle" and decoded["n"] == K


def test_the_zero_decode_relabelled_as_star_is_refused(chain, tmp_path, capsys):
    d, cons = chain
    fake = tmp_path / "bon_star.parquet"
    df = pd.read_parquet(d / "bon_zero.parquet").assign(setting="star")
    write_table(df, fake, read_metadata(d / "bon_zero.parquet"))
    refused(capsys, audit(d, [d / "bon_zero.parquet", fake], cons, d / "lambda.json"),
            f"--responses {fake}: bon at star decoded at lambda [0.0, 0.0], expected")
    # and with no metadata at all (a table written by hand)
    df.to_parquet(fake)
    refused(capsys, audit(d, [fake], cons, d / "lambda.json"), "decoded at lambda [0.0, 0.0], expected")
    assert not (tmp_path / "audit.json").exists()


def test_a_decode_with_a_record_for_other_taus_is_refused(chain, tmp_path, capsys):
    d, cons = chain
    other = constraints_at([cons[0].tau + 0.3, cons[1].tau + 0.3])
    assert calibrate(d, d / "calibration_scores.parquet", other, tmp_path / "lambda.json") == 0
    assert decode(d, "star", other, tmp_path / "lambda.json", tmp_path / "star.parquet") == 0
    refused(capsys, audit(d, [tmp_path / "star.parquet"], cons, d / "lambda.json"),
            "decoded with another record than")
    pd.read_parquet(tmp_path / "star.parquet").to_parquet(tmp_path / "bare.parquet")  # its identity stripped
    refused(capsys, audit(d, [tmp_path / "bare.parquet"], cons, d / "lambda.json"),
            f"--responses {tmp_path / 'bare.parquet'}: bon at star decoded at lambda")
    # the decoder itself refuses the record for the taus it is not given
    refused(capsys, decode(d, "star", cons, tmp_path / "lambda.json", tmp_path / "x.parquet"), "calibrated for tau")
    assert not (tmp_path / "x.parquet").exists()


def test_an_audit_with_other_scorers_than_the_decode_is_refused(chain, capsys):
    d, cons = chain
    other = ("--cost", "violence=oracle", "--cost", "crime=models/cost_crime")
    # the record keeps the scorers it was calibrated with: the audit's are compared with them first
    refused(capsys, audit(d, [d / "bon_star.parquet"], cons, d / "lambda.json", costs=other),
            "--cost crime=models/cost_crime", "was calibrated with crime=oracle")
    refused(capsys, audit(d, [d / "bon_star.parquet"], cons, d / "lambda.json", reward="models/reward"),
            "--reward models/reward", "was calibrated with the reward scorer 'oracle'")


def test_the_audit_keeps_the_picks_scores_and_refuses_them_non_finite(chain, tmp_path, capsys):
    d, cons = chain
    assert audit(d, [d / "bon_star.parquet"], cons, d / "lambda.json") == 0
    rows = pd.read_csv(d / "audit.csv")
    star = pd.read_parquet(d / "bon_star.parquet")
    for c in cons:  # the audit's decoding cost is the pick's own (the oracle's evaluation too: the same scorer)
        row = rows[rows["constraint"] == c.name].iloc[0]
        assert row["mean_cost"] == pytest.approx(star[c.column].mean(), abs=1e-12)
        assert row["eval_mean"] == pytest.approx(star[c.column].mean(), abs=1e-12)
    bad = star.copy()
    bad.loc[3, "cost_crime"] = np.nan
    write_table(bad, tmp_path / "star.parquet", read_metadata(d / "bon_star.parquet"))
    refused(capsys, audit(d, [tmp_path / "star.parquet"], cons, d / "lambda.json"), "cost_crime")


def test_a_zero_decode_from_another_n_is_refused(chain, tmp_path, capsys):
    d, cons = chain
    df = pd.read_parquet(d / "test_scores.parquet")
    two = df[df["sample_id"] < 2]
    meta = read_metadata(d / "test_scores.parquet")
    write_table(two, tmp_path / "two.parquet", meta)
    refused(capsys, decode(d, "zero", cons, d / "lambda.json", tmp_path / "z.parquet", tmp_path / "two.parquet"),
            f"Best-of-2, but {d / 'lambda.json'} was calibrated for Best-of-{K}")
    assert not (tmp_path / "z.parquet").exists()
    # a zero decode of Best-of-2 written without the record reaches the audit: its N is checked there
    assert lara("decode-vector", "--method", "bon", "--setting", "zero", "--constraints", to_json(cons),
                "--candidates", tmp_path / "two.parquet", "--out", tmp_path / "z.parquet") == 0
    refused(capsys, audit(d, [tmp_path / "z.parquet", d / "bon_star.parquet"], cons, d / "lambda.json"),
            "n 2, expected 4")


def test_a_record_for_another_cost_spec_is_refused(chain, tmp_path, capsys):
    d, cons = chain
    moved = [Constraint(c.name, "models/elsewhere" if c.name == "crime" else c.cost, c.tau) for c in cons]
    refused(capsys, decode(d, "star", moved, d / "lambda.json", tmp_path / "x.parquet"),
            "constraint crime was calibrated with cost 'category:crime', expected 'models/elsewhere'")


def test_calibrate_vector_refuses_what_the_scalar_calibration_refuses(chain, tmp_path, capsys):
    d, cons = chain
    out = tmp_path / "lambda.json"
    refused(capsys, calibrate(d, d / "calibration_scores.parquet", cons, out, bootstrap=10),
            "calibration.bootstrap: 10 replicates put fewer than")
    # bounds that clip most calibration costs: a certificate about another cost
    tight = [Constraint(c.name, c.cost, c.tau, bounds=(c.tau - 0.01, c.tau + 0.01)) for c in cons]
    refused(capsys, calibrate(d, d / "calibration_scores.parquet", tight, out, guarantee="ltt",
                              cost_bounds=[-5.5, 5.5]),  # the shared default; each constraint's own bounds win
            "calibration.guarantee ltt", "of the calibration costs (more than 1%)", "--allow-clipping")
    assert not out.exists()
    # bootstrap deployed: the LTT statement says so, the record is written
    assert calibrate(d, d / "calibration_scores.parquet", tight, out) == 0
    record = json.loads(out.read_text())
    assert "certificate is about the clipped costs" in record["procedures"]["ltt"]["statement"]
    assert all(f > 0.01 for f in record["guarantee"]["clipped_fraction"])
    out.unlink()
    # a finite cost r - lambda c overflows on
    df = pd.read_parquet(d / "calibration_scores.parquet")
    df.loc[5, "cost_crime"] = 1e300
    big = tmp_path / "big.parquet"
    write_table(df, big, read_metadata(d / "calibration_scores.parquet"))
    refused(capsys, calibrate(d, big, cons, out), f"--scores {big}: column 'cost_crime' holds 1e+300")
    refused(capsys, decode(d, "zero", cons, d / "lambda.json", tmp_path / "z.parquet", big), "holds 1e+300")
    assert not out.exists() and not (tmp_path / "z.parquet").exists()


def test_the_same_output_twice_and_calibration_prompts_are_refused(chain, tmp_path, capsys):
    d, cons = chain
    copy = tmp_path / "copy.parquet"
    shutil.copy(d / "bon_star.parquet", copy)
    refused(capsys, audit(d, [d / "bon_star.parquet", copy], cons, d / "lambda.json"), "are the same file")
    # the contract row of decode-vector refuses the calibration prompts as test candidates before anything is decoded
    refused(capsys, lara("decode-vector", "--method", "bon", "--setting", "star", "--constraints", to_json(cons),
                         "--lambda-json", d / "lambda.json", "--candidates", d / "calibration_scores.parquet",
                         "--out", tmp_path / "in.parquet"), "role calibration, expected test")
    assert not (tmp_path / "in.parquet").exists()
