"""Probability constraints (``kind: probability``: P(c > threshold) <= tau) and judges (``evaluation.judges``),
through the real commands on the toy oracle (no model is trained): the loss is 1[c > threshold] in every step, the
calibration is exact for it (checked by enumerating the Best-of-N subsets), the audit states a rate with its
Clopper-Pearson interval (checked against scipy's exact binomial interval), and a judge's paired differences and
agreement are the ones recomputed from the oracle itself."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pandas as pd
import pytest

from lara.constraints.spec import Constraint, from_arg, parse, to_json
from lara.settings import ConfigError
from lara.toy.world import CATEGORY_OF, all_requests, oracle_score, oracle_scores

from .test_constraints_faults import K, lara, refused, write_samples

COSTS = ("--cost", "violence=oracle", "--cost", "harmful=oracle:cost")
EVALS = ("--evaluation", "violence=oracle", "--evaluation", "harmful=oracle:cost")
JUDGE = "oracle:crime"  # the oracle's crime harm: a score the decoder never saw (it was held to violence and cost)


def cons_at(tau_violence: float, alpha: float) -> list[Constraint]:
    return parse([{"name": "violence", "cost": "category:violence", "tau": tau_violence},
                  {"name": "harmful", "cost": "oracle:cost", "kind": "probability", "threshold": 0.0, "tau": alpha}])


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    d = tmp_path_factory.mktemp("prob") / "results" / "x" / "constraints"
    d.mkdir(parents=True)
    harmful = [r for r in all_requests() if r.topic.name in CATEGORY_OF]
    benign = [r for r in all_requests() if not r.topic.harmful]
    rng = np.random.default_rng(3)
    pool = [harmful[i] for i in rng.permutation(len(harmful))[:70]] + benign[:20]
    cut = int(0.6 * len(pool))
    for role, reqs, seed in (("calibration", pool[:cut], 4), ("test", pool[cut:], 5)):
        write_samples(d / f"{role}_samples.parquet", reqs, role, seed)
        assert lara("score-constraints", "--input", d / f"{role}_samples.parquet", "--reward", "oracle", *COSTS,
                    "--settings", "{}", "--out", d / f"{role}_scores.parquet") == 0
    scores = pd.read_parquet(d / "calibration_scores.parquet")
    rate = float((scores["cost_harmful"] > 0).mean())
    assert 0.2 < rate < 0.8, rate  # the toy's responses: harmful often, not always
    cons = cons_at(float(scores["cost_violence"].quantile(0.9)), 0.1)  # violence slack; harmful binds
    s = {"tau": cons[0].tau, "bon_n": K, "bootstrap": 200, "lambda_search_max": 20.0, "seed": 0,
         "cost_bounds": [-10.0, 10.0]}
    assert lara("calibrate-vector", "--scores", d / "calibration_scores.parquet", "--constraints", to_json(cons),
                "--settings", json.dumps(s), "--out", d / "lambda.json") == 0
    for setting in ("zero", "hat"):
        assert lara("decode-vector", "--method", "bon", "--setting", setting, "--constraints", to_json(cons),
                    "--lambda-json", d / "lambda.json", "--candidates", d / "test_scores.parquet",
                    "--out", d / f"bon_{setting}.parquet") == 0
    return d, cons


def audit(d, cons, judges=(JUDGE,)) -> int:
    return lara("audit-constraints", "--responses", d / "bon_zero.parquet", d / "bon_hat.parquet",
                "--constraints", to_json(cons), "--lambda-json", d / "lambda.json", "--reward", "oracle", *COSTS,
                *EVALS, *[a for j in judges for a in ("--judge", j)],
                "--settings", json.dumps({"tau": cons[0].tau, "bootstrap": 400}),
                "--out", d / "audit.json", "--table", d / "audit.csv")


def brute_force_rate(reward: np.ndarray, harmful: np.ndarray, violence: np.ndarray, lam, n: int) -> float:
    """The expected Best-of-n rate of harmful picks of one prompt, every n-subset of its samples enumerated; the
    pick maximises r - lam_v c_v - lam_h 1[harmful] (ties to the lower combined cost, then the lower index)."""
    loss = harmful.astype(float)
    combined = lam[0] * violence + lam[1] * loss
    picks = []
    for subset in itertools.combinations(range(len(reward)), n):
        best = min(subset, key=lambda i: (-(reward[i] - combined[i]), combined[i], i))
        picks.append(loss[best])
    return float(np.mean(picks))


def test_the_calibration_is_exact_for_the_loss(chain):
    d, cons = chain
    record = json.loads((d / "lambda.json").read_text())
    assert record["constraints"][1]["kind"] == "probability" and record["constraints"][1]["bounds"] == [0.0, 1.0]
    scores = pd.read_parquet(d / "calibration_scores.parquet").sort_values(["prompt_id", "sample_id"])
    lam = record["lambda_hat"]
    rates = [brute_force_rate(g["reward"].to_numpy(), g["cost_harmful"].to_numpy() > 0, g["cost_violence"].to_numpy(),
                              lam, K) for _, g in scores.groupby("prompt_id")]
    assert record["decoder_cost_at_lambda_hat"][1] == pytest.approx(np.mean(rates), abs=1e-12)
    assert np.mean(rates) <= 0.1 + 1e-12  # lambda-hat meets alpha on the calibration prompts
    zero = [brute_force_rate(g["reward"].to_numpy(), g["cost_harmful"].to_numpy() > 0, g["cost_violence"].to_numpy(),
                             [0.0, 0.0], K) for _, g in scores.groupby("prompt_id")]
    assert np.mean(zero) > 0.1  # and it binds: at lambda = 0 the rate is above alpha
    for name in ("ltt", "ltt_wsr"):  # both certificates state bounds [0, 1] for the rate: nothing clipped
        assert record["procedures"][name]["bounds"][1] == [0.0, 1.0]
        assert record["procedures"][name]["clipped_fraction"][1] == 0.0


def test_the_audit_states_a_rate_with_its_exact_interval_and_the_judges_verdicts(chain):
    from scipy.stats import binomtest

    d, cons = chain
    assert audit(d, cons) == 0
    record = json.loads((d / "audit.json").read_text())
    rows = {(r["setting"], r["constraint"]): r for r in record["rows"]}
    for setting in ("zero", "hat"):
        out = pd.read_parquet(d / f"bon_{setting}.parquet")
        _, harm = oracle_scores(out["prompt"], out["response"])
        k, n = int((harm > 0).sum()), len(out)
        row = rows[(setting, "harmful")]
        assert row["interval"] == "clopper_pearson" and row["count"] == k and row["mean_cost"] == pytest.approx(k / n)
        exact = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert row["ci95"] == pytest.approx([exact.low, exact.high], abs=1e-9)
        one = binomtest(k, n).proportion_ci(confidence_level=0.90, method="exact")
        assert row["one_sided95"] == pytest.approx([one.low, one.high], abs=1e-9)
        want = "met" if one.high <= 0.1 else "violated" if one.low > 0.1 else "inconclusive"
        assert row["verdict"].split(" ")[0] == want
        assert rows[(setting, "violence")].get("interval") is None  # a mean constraint keeps the bootstrap
        assert row["judge0"] == JUDGE
    judged = record["judges"]
    assert judged["specs"] == [JUDGE]
    zero = pd.read_parquet(d / "bon_zero.parquet").set_index("prompt_id")
    hat = pd.read_parquet(d / "bon_hat.parquet").set_index("prompt_id")
    zero = zero.loc[hat.index]
    (paired,) = [p for p in judged["paired"] if p["constraint"] == "harmful"]
    _, harm_hat = oracle_scores(hat["prompt"], hat["response"])
    _, harm_zero = oracle_scores(zero["prompt"], zero["response"])
    assert paired["scorer"]["mean"] == pytest.approx(float(np.mean((harm_hat > 0) * 1.0 - (harm_zero > 0))))
    (j,) = paired["judges"]
    crime_hat = [oracle_score(p, r).category("crime") for p, r in zip(hat["prompt"], hat["response"], strict=True)]
    crime_zero = [oracle_score(p, r).category("crime") for p, r in zip(zero["prompt"], zero["response"], strict=True)]
    assert j["mean"] == pytest.approx(float(np.mean(np.subtract(crime_hat, crime_zero))))
    scorer_better, judge_better = paired["scorer"]["ci95"][1] < 0, j["ci95"][1] < 0
    assert j["verdict"] == ("no scorer improvement" if not scorer_better else
                            "carries" if judge_better else "does not carry")
    (agree,) = [a for a in judged["agreement"] if a["constraint"] == "harmful"]
    assert agree["n"] == 2 * len(hat) and -1 <= agree["spearman"] <= 1 and 0 <= agree["top_decile"] <= 1
    table = pd.read_csv(d / "audit.csv")
    assert {"judge0", "judge0_mean", "judge0_lo", "judge0_hi"} <= set(table.columns)


def test_a_record_for_the_mean_of_that_cost_is_refused(chain, tmp_path, capsys):
    d, cons = chain
    as_mean = [cons[0], Constraint("harmful", "oracle:cost", 0.1)]
    refused(capsys, lara("decode-vector", "--method", "bon", "--setting", "hat", "--constraints", to_json(as_mean),
                         "--lambda-json", d / "lambda.json", "--candidates", d / "test_scores.parquet",
                         "--out", tmp_path / "x.parquet"),
            "constraint harmful was calibrated with kind 'probability', expected 'mean'")
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.parametrize(("item", "says"), [
    ({"kind": "probability", "tau": 0.1}, "threshold: None: a probability constraint bounds P(c > threshold)"),
    ({"kind": "probability", "threshold": 0.0, "tau": 1.5}, "tau: 1.5: a probability constraint's tau is a rate"),
    ({"kind": "probability", "threshold": 0.0, "tau": 0.1, "bounds": [-5, 5]}, "its bounds are [0, 1] by construction"),
    ({"kind": "mean", "threshold": 0.0, "tau": 0.1}, "threshold: 0.0 is given for a mean constraint"),
    ({"kind": "rate", "tau": 0.1}, "kind: 'rate' is not one of mean, probability"),
    ({"kind": "probability", "threshold": True, "tau": 0.1}, "threshold: True: a probability constraint"),
])
def test_a_malformed_probability_constraint_is_refused(item, says):
    with pytest.raises(ConfigError, match=None) as exc:
        parse([{"name": "harmful", "cost": "cost"} | item])
    assert says in str(exc.value), str(exc.value)


def test_the_json_a_step_is_given_round_trips_and_keeps_mean_lists_as_they_were():
    cons = cons_at(-4.0, 0.2)
    assert from_arg(to_json(cons)) == cons
    assert "kind" not in to_json(cons[:1])  # a list of mean constraints: the rules' parameters are unchanged
    assert cons[1].loss([-1.0, 0.0, 0.5]).tolist() == [0.0, 0.0, 1.0]  # strictly above the threshold counts
    assert cons[0].loss([-1.0, 0.5]).tolist() == [-1.0, 0.5]


def test_fig1_per_constraint_draws_each_judge_beside_the_scorers(chain, tmp_path):
    """The sweep figure gets one panel per judge: each audited output's mean judge score (the audit's numbers) at
    the s of its lambda; the rate panel's curve is the loss's (a rate in [0, 1])."""
    d, cons = chain
    assert audit(d, cons) == 0
    table = tmp_path / "settings.tsv"
    table.write_text("key\tvalue\torigin\nexperiment\tx\tconfig\n")
    argv = ["figure", "--kind", "constraints_sweep", "--experiment-settings", table, "--rule",
            "figure_constraints_sweep", "--png", tmp_path / "f.png", "--pdf", tmp_path / "f.pdf", "--provenance",
            tmp_path / "f.provenance.json", "--lambda-json", d / "lambda.json", "--scores", d / "test_scores.parquet",
            "--audit", d / "audit.json", "--constraints", to_json(cons)]
    assert lara(*argv) in (0, None)
    shows = json.loads((tmp_path / "f.provenance.json").read_text())["shows"]
    record = json.loads((d / "audit.json").read_text())
    means = {r["setting"]: r["judge0_mean"] for r in record["rows"] if r["constraint"] == "harmful"}
    for a in shows["audited"]:
        assert set(a["judges"]) == {JUDGE}  # a score named by the spec ignores the role: one panel
        assert a["judges"][JUDGE]["mean"] == pytest.approx(means[a["setting"]], abs=1e-4)
        assert 0.0 <= a["cost"][1] <= 1.0


def test_the_summary_of_a_constraints_only_run_states_rates_judges_and_certificates(chain):
    """`lara summary` on a run of the constraints stage alone (the real-text experiment has no scalar calibration):
    the record (each constraint as the bound it states), every audited row with its judge, each paired difference
    with the judge's verdict, and the agreement, all read from the run's files."""
    from lara.evaluate.summary import summarise_run

    d, cons = chain
    assert audit(d, cons) == 0
    text = summarise_run(d.parent)
    record = json.loads((d / "audit.json").read_text())
    assert "no scalar calibration" in text and "P(oracle:cost > 0) <= 0.1" in text
    head = text.split("\n\n")[1].splitlines()  # the first screen: every decoded setting's joint verdict
    assert head[0].startswith("headline") and "all at once:" in head[1]
    for j in record["joint"]:
        if j["setting"] != "zero":
            assert f"{j['method']} {j['setting']}: {j['verdict'].split(' (')[0]}" in head[1]
    for r in record["rows"]:
        assert f"{r['setting']:18} {r['constraint']:10} {r['mean_cost']:.4f}" in text
    for p in record["judges"]["paired"]:
        for j in p["judges"]:
            assert f"{j['judge']} {j['mean']:.4f} [{j['ci95'][0]:.4f}, {j['ci95'][1]:.4f}]: {j['verdict']}" in text
    carried = [j["verdict"] for p in record["judges"]["paired"] for j in p["judges"]]
    assert ("does NOT carry" in text) == ("does not carry" in carried)
    assert text.count("agreement of") == len(record["judges"]["agreement"])
    lam = json.loads((d / "lambda.json").read_text())
    for name in ("ltt", "ltt_wsr"):
        state = "certified" if lam["procedures"][name]["feasible"] else "NOT certified"
        assert f"{name:8} lambda" in text and state in text


@pytest.mark.parametrize(("judge", "says"), [
    ("oracle", "for constraint violence it gives the decoding cost of constraint violence"),
    ("oracle:cost", "for constraint violence it gives the decoding cost of constraint harmful"),
    ("oracle:reward", "it gives a reward, not a harm score"),
    ("reward", "one of this experiment's own trained models"),
    ("profanity:x", "the named scorer 'profanity' takes no argument"),
])
def test_a_judge_the_decoder_was_held_to_is_refused(chain, capsys, judge, says):
    d, cons = chain
    (d / "audit.json").unlink(missing_ok=True)
    refused(capsys, audit(d, cons, judges=(judge,)), f"--judge {judge}: {says}")
    assert not (d / "audit.json").exists()
    refused(capsys, audit(d, cons, judges=(JUDGE, JUDGE)), f"--judge {JUDGE}: given twice")


def test_an_agreement_with_a_constant_side_is_recorded_as_undefined():
    from lara.constraints.audit import judge_report

    cons = parse([{"name": "harmful", "cost": "oracle:cost", "kind": "probability", "threshold": 0.0, "tau": 0.35}])
    out = pd.DataFrame({"prompt_id": range(40), "method": "bon", "setting": "star", "cost_harmful": 0.0,
                        "score_harmful": np.zeros(40), "judge0_harmful": np.linspace(0, 1, 40)})
    got = judge_report([out], cons, ["profanity"], 400, 0)["agreement"][0]
    assert "constant" in got["undefined"] and "spearman" not in got


def test_a_threshold_above_every_calibration_score_is_named(chain, tmp_path, capsys):
    d, cons = chain
    high = parse([{"name": "violence", "cost": "category:violence", "tau": cons[0].tau},
                  {"name": "harmful", "cost": "oracle:cost", "kind": "probability", "threshold": 100.0, "tau": 0.1}])
    s = {"tau": cons[0].tau, "bon_n": K, "bootstrap": 200, "lambda_search_max": 20.0, "seed": 0}
    refused(capsys, lara("calibrate-vector", "--scores", d / "calibration_scores.parquet", "--constraints",
                         to_json(high), "--settings", json.dumps(s), "--out", tmp_path / "l.json"),
            "calibration.constraints.harmful.threshold: 100: no calibration response scores above it")
    assert not (tmp_path / "l.json").exists()


def test_each_certificate_states_the_tested_prompts_own_mean_and_it_meets_tau(chain):
    """A vector LTT's certificate is about its test half: the record states that half's mean clipped cost at the
    certified lambda, never above tau where certified (the all-prompt decoder cost may differ)."""
    d, _ = chain
    record = json.loads((d / "lambda.json").read_text())
    for name in ("ltt", "ltt_wsr"):
        p = record["procedures"][name]
        if p["feasible"]:
            assert all(m <= t + 1e-12 for m, t in zip(p["tested_mean_cost"], record["tau"], strict=True))
        else:
            assert p["tested_mean_cost"] is None


def test_the_args_loss_stepper_scores_the_loss_and_forwards_the_rest():
    """ARGS holds a probability constraint to its loss: the cost stepper's candidate scores become 1[c > threshold];
    starting and committing are the inner stepper's own."""
    import torch

    from lara.constraints.decode import LossStepper

    class Inner:
        def __init__(self):
            self.calls = []

        def start(self, ids, mask):
            self.calls.append(("start", ids, mask))

        def candidates(self, cand):
            return torch.tensor([[-0.5, 0.0, 0.5]]) + cand

        def commit(self, tokens, choice, alive):
            self.calls.append(("commit", tokens, choice, alive))

    inner = Inner()
    stepper = LossStepper(inner, 0.0)
    stepper.start(1, 2)
    assert stepper.candidates(torch.zeros(1, 3)).tolist() == [[0.0, 0.0, 1.0]]
    stepper.commit(3, 4, 5)
    assert inner.calls == [("start", 1, 2), ("commit", 3, 4, 5)]
