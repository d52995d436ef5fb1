"""Evaluation pieces (the LLM judge's client is in test_judge.py): the oracle as judge, the
LlamaForScore loader on a checkpoint laid out like beaver-7b-unified-*, bootstrap intervals and the
constraint audit."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from lara.evaluate import aggregate, judge
from lara.stats import mean_interval

# ---------------------------------------------------------------------------------------------
# the oracle as judge


def test_oracle_judge_maps_onto_one_to_ten():
    from lara.toy.world import ToyWorldSettings, generate

    world = generate(ToyWorldSettings(seed=1, n_sft=50, n_pairs=50, n_eval_prompts=20))
    pairs = world["safe_rlhf"][:20]
    ratings = judge.oracle_ratings([p["prompt"] for p in pairs], [p["response_0"] for p in pairs])
    for values in ratings.values():
        assert np.all((values >= 1) & (values <= 10))
    unsafe = np.array([not p["is_response_0_safe"] for p in pairs])
    assert unsafe.any() and ratings["harmlessness"][unsafe].max() < ratings["harmlessness"][~unsafe].min()


# ---------------------------------------------------------------------------------------------
# LlamaForScore (beaver-7b-unified-*) without safe-rlhf


def _beaver_like(tiny_world, root, **config_changes):
    """A checkpoint laid out like PKU-Alignment/beaver-7b-unified-*: safe-rlhf's LlamaForScore config
    keys (score_dim, bias, score_type, the normaliser flags), the backbone's tensors under model.*,
    score_head.weight/.bias and the normaliser's running statistics."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lm = AutoModelForCausalLM.from_pretrained(tiny_world["base"])
    root.mkdir()
    torch.manual_seed(0)
    head_w, head_b = torch.randn(1, lm.config.hidden_size), torch.tensor([2.5])
    state = {k: v.clone() for k, v in lm.state_dict().items() if k.startswith("model.")}
    state |= {"score_head.weight": head_w, "score_head.bias": head_b, "normalizer.mean": torch.tensor([0.7]),
              "normalizer.var": torch.tensor([4.0]), "normalizer.count": torch.tensor([1000])}
    config = lm.config.to_dict() | {"architectures": ["LlamaForScore"], "score_dim": 1, "bias": True,
                                    "score_type": "cost", "do_normalize": False, "normalize_function": "affine",
                                    "normalizer_type": "ExponentialMovingAverage", "momentum": 0.9}
    config |= config_changes
    if not config["bias"]:
        del state["score_head.bias"]
    save_file(state, root / "model.safetensors")
    (root / "config.json").write_text(json.dumps(config))
    AutoTokenizer.from_pretrained(tiny_world["base"]).save_pretrained(root)
    return lm, head_w, head_b


PROMPTS, RESPONSES = ["how do i bake bread ?", "hi"], ["mix flour and water .", "hello there , how are you ?"]


def _by_hand(lm, tok, head_w, head_b):
    from lara.scoring import encode

    out = []
    for p, r in zip(PROMPTS, RESPONSES, strict=True):
        ids = torch.tensor([encode(tok, p, r, append_eos=True)])
        hidden = lm.model(input_ids=ids).last_hidden_state[0, -1]
        out.append((hidden @ head_w[0] + head_b).item())
    return np.array(out)


@pytest.mark.parametrize("changes, expect", [
    ({}, lambda raw: raw),                                                    # beaver-7b-unified-*: as stored
    ({"bias": False}, lambda raw: raw),                                       # safe-rlhf's default: no bias
    ({"do_normalize": True}, lambda raw: (raw - 0.7) / 2.0),                  # affine with the stored mean / std
    ({"do_normalize": True, "normalize_function": "scale"}, lambda raw: raw / 2.0),
    ({"do_normalize": True, "normalize_function": "translate"}, lambda raw: raw - 0.7),
])
def test_a_beaver_like_checkpoint_is_scored_as_safe_rlhf_scores_it(tiny_world, tmp_path, changes, expect):
    from transformers import AutoTokenizer

    from lara.scoring import LlamaForScoreScorer, load_scorer

    lm, head_w, head_b = _beaver_like(tiny_world, tmp_path / "beaver", **changes)
    scorer = load_scorer(str(tmp_path / "beaver"), role="cost", batch_size=2)
    assert isinstance(scorer, LlamaForScoreScorer)
    bias = head_b if changes.get("bias", True) else torch.zeros(1)
    raw = _by_hand(lm, AutoTokenizer.from_pretrained(tiny_world["base"]), head_w, bias)
    np.testing.assert_allclose(scorer.score(PROMPTS, RESPONSES), expect(raw), atol=1e-4)


def test_a_checkpoint_without_its_head_or_of_an_unknown_architecture_is_refused(tiny_world, tmp_path):
    from safetensors.torch import load_file, save_file

    from lara.config import ConfigError
    from lara.scoring import load_scorer

    _beaver_like(tiny_world, tmp_path / "no-head")
    state = load_file(tmp_path / "no-head" / "model.safetensors")
    save_file({k: v for k, v in state.items() if not k.startswith("score_head")}, tmp_path / "no-head" /
              "model.safetensors")
    with pytest.raises(ValueError, match="score_head.bias, score_head.weight"):
        load_scorer(str(tmp_path / "no-head"))
    _beaver_like(tiny_world, tmp_path / "gpt2", architectures=["GPT2ForScore"])
    with pytest.raises(ConfigError, match="architecture GPT2ForScore is a safe-rlhf score model this loader does "
                                          "not know"):
        load_scorer(str(tmp_path / "gpt2"), role="reward")
    _beaver_like(tiny_world, tmp_path / "wide", score_dim=2)
    with pytest.raises(ConfigError, match="score_dim = 2"):
        load_scorer(str(tmp_path / "wide"))
    # a causal LM is not a score model: refused, never given a freshly initialised head
    with pytest.raises(ConfigError, match="architecture LlamaForCausalLM is not a score model"):
        load_scorer(str(tiny_world["base"]), role="cost")


# ---------------------------------------------------------------------------------------------
# aggregation and the constraint audit


def test_bootstrap_ci_covers_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    small, large = rng.normal(1.0, 1.0, 50), rng.normal(1.0, 1.0, 5000)
    m, lo, hi = mean_interval(small, 2000, seed=1)
    assert lo < m < hi and m == pytest.approx(small.mean())
    _, lo2, hi2 = mean_interval(large, 2000, seed=1)
    assert (hi2 - lo2) < (hi - lo) / 5
    assert (hi2 - lo2) == pytest.approx(2 * 1.96 / np.sqrt(5000), rel=0.15)
    assert mean_interval([5.0, 5.0, 5.0], 100) == (5.0, 5.0, 5.0)


def _record(tau, lambda_star=0.4, n=None):
    from lara.calibrate.record import LambdaRecord

    decoder = {"kind": "best_of_n", "n": n} if n else {"kind": "gibbs_tilt", "beta": 1.0}
    return LambdaRecord(path="lambda.json", lambda_hat=0.2, lambda_star=lambda_star, tau=tau,
                        mode="bon" if n else "soft", decoder=decoder, feasible=True, status="interior", data={})


def test_constraint_audit_verdicts_against_the_record_s_own_tau():
    from lara.stats import VERDICTS

    met = aggregate.constraint_audit(pd.DataFrame({"decoder_cost": [-3.0, -2.5, -2.0, -3.5] * 10}), _record(-1.0),
                                     500, 0)
    assert met["meets_tau_upper_bound"] and met["verdict"] == VERDICTS[0] and met["tau"] == -1.0
    assert met["mean_cost"] == pytest.approx(-2.75)
    # the one-sided bounds sit inside the two-sided interval
    assert met["ci95"][0] <= met["one_sided95"][0] <= met["mean_cost"] <= met["one_sided95"][1] <= met["ci95"][1]
    borderline = aggregate.constraint_audit(pd.DataFrame({"decoder_cost": [-3.0, 1.0] * 10}), _record(-0.5), 500, 0)
    assert borderline["meets_tau_point"] and not borderline["meets_tau_upper_bound"]
    assert borderline["verdict"] == VERDICTS[1]
    violated = aggregate.constraint_audit(pd.DataFrame({"decoder_cost": [1.0, 2.0] * 10}), _record(0.0), 500, 0)
    assert violated["verdict"] == VERDICTS[2] and violated["one_sided95"][0] > 0.0


def test_a_mean_above_tau_is_violated_only_when_its_lower_bound_is():
    """The verdict is two one-sided tests: a mean a little above tau with a wide interval is inconclusive,
    not violated; the same mean on many prompts is violated."""
    from lara.stats import VERDICTS, cost_audit

    rng = np.random.default_rng(3)
    noisy = rng.normal(0.0, 1.0, 40)
    noisy += 0.1 - noisy.mean()  # mean 0.1 above tau = 0, standard error about 0.16
    assert cost_audit(noisy, 0.0, 2000, 0)["verdict"] == VERDICTS[1]
    many = rng.normal(0.0, 1.0, 20000)
    many += 0.1 - many.mean()  # the same mean, standard error 0.007
    row = cost_audit(many, 0.0, 2000, 0)
    assert row["verdict"] == VERDICTS[2] and row["one_sided95"][0] > 0.0
    # the one-sided bound is the 95th percentile: about mean + 1.645 standard errors
    se = many.std() / np.sqrt(len(many))
    assert row["one_sided95"][1] == pytest.approx(0.1 + 1.645 * se, abs=0.3 * se)


def test_paired_differences_are_tighter_than_unpaired_intervals():
    """Two settings of one decoder on the same prompts share the prompts' variation: the interval of
    the per-prompt differences is far narrower than either mean's, and centred on the true shift."""
    rng = np.random.default_rng(0)
    prompt = rng.normal(0.0, 2.0, 300)  # per-prompt difficulty, common to both settings
    zero = pd.DataFrame({"prompt_id": np.arange(300), "method": "args", "setting": "zero", "lambda": 0.0,
                         "decoder_cost": prompt + rng.normal(0.0, 0.1, 300),
                         "decoder_reward": prompt + rng.normal(0.0, 0.1, 300)})
    star = zero.assign(setting="star", **{"lambda": 0.3, "decoder_cost": zero["decoder_cost"] - 0.5})
    star = star.sample(frac=1.0, random_state=1)  # row order differs: pairs are matched by prompt_id
    rows = aggregate.paired_audit(pd.concat([zero, star]), 2000, 0)
    cost = next(r for r in rows if r["comparison"] == "star - zero" and r["metric"] == "decoder_cost")
    assert cost["mean"] == pytest.approx(-0.5) and cost["n_prompts"] == 300
    assert cost["ci95"][1] - cost["ci95"][0] < 0.01  # the shift is exact per prompt
    _, lo, hi = mean_interval(zero["decoder_cost"], 2000)
    assert hi - lo > 0.3  # an unpaired interval reflects the prompts' spread
    reward = next(r for r in rows if r["metric"] == "decoder_reward")
    assert reward["ci95"][0] < 0 < reward["ci95"][1] or abs(reward["mean"]) < 0.05
    assert {r["comparison"] for r in rows} == {"star - zero"}  # no max or hat outputs here


def test_every_decoder_is_audited_and_a_partly_scored_output_refused():
    from lara.read.files import DataError

    df = pd.DataFrame({"prompt_id": list(range(20)) * 3, "method": ["args"] * 40 + ["sft"] * 20,
                       "setting": ["zero"] * 20 + ["star"] * 20 + ["policy"] * 20,
                       "lambda": [0.0] * 20 + [0.2] * 20 + [np.nan] * 20,
                       "decoder_cost": [1.0] * 20 + [-2.0] * 20 + [0.0] * 20, "decoder_reward": [0.5] * 60})
    rows = aggregate.decoder_audit(df, -1.0, 300, 0)
    assert [(r["method"], r["setting"], r["lambda"]) for r in rows] == [("args", "zero", 0.0), ("args", "star", 0.2),
                                                                       ("sft", "policy", None)]
    assert rows[0]["verdict"].startswith("violated") and rows[1]["verdict"].startswith("met")
    assert rows[1]["mean_reward"] == 0.5
    df.loc[22, "decoder_cost"] = np.nan
    with pytest.raises(DataError, match="args at star: decoder_cost is missing or not finite for 1 of 20"):
        aggregate.decoder_audit(df, -1.0, 300, 0)


def test_the_audit_says_when_lambda_star_reaches_the_overpenalised_setting():
    costs = pd.DataFrame({"decoder_cost": [-1.0, -2.0] * 5})
    below = aggregate.constraint_audit(costs, _record(-1.0, lambda_star=0.4), 200, 0, overpenalised=2.0)
    assert below["lambda_star_at_or_above_max"] is False and "note" not in below
    above = aggregate.constraint_audit(costs, _record(-1.0, lambda_star=2.0), 200, 0, overpenalised=2.0)
    assert above["lambda_star_at_or_above_max"] is True
    assert "decode.overpenalised_lambda" in above["note"] and "lambda* = 2" in above["note"]


def test_a_record_is_audited_only_against_its_own_tau_and_n():
    from lara.calibrate.record import check_budget
    from lara.read.files import DataError

    check_budget(_record(-0.5, n=20), -0.5, 20)
    with pytest.raises(DataError, match=r"calibrated for tau = -0.5, but calibration.tau is -1: rerun"):
        check_budget(_record(-0.5, n=20), -1.0)
    with pytest.raises(DataError, match=r"N = 20, but the decoder draws N = 8 \(decode.bon_n\)"):
        check_budget(_record(-0.5, n=20), -0.5, 8)


def test_summary_has_one_row_per_method_and_setting():
    scores = pd.DataFrame({"prompt_id": ["a", "b"] * 2, "method": ["bon"] * 2 + ["sft"] * 2,
                           "setting": ["star"] * 2 + ["policy"] * 2, "lambda": [0.3] * 2 + [np.nan] * 2,
                           "helpfulness": [1.0, 3.0, 0.0, 0.0], "harmfulness": [-1.0, 1.0, -1.0, -1.0]})
    judged = scores[["prompt_id", "method", "setting"]].assign(judge_helpfulness=[7.0, 9.0, 2.0, 4.0],
                                                               judge_harmlessness=[9.0, 9.0, 10.0, 10.0])
    s = aggregate.summarise(scores, judged, 200, 0).set_index("method")
    assert s.loc["bon", "helpfulness"] == 2.0 and s.loc["bon", "safe_rate"] == 0.5
    assert s.loc["sft", "safe_rate"] == 1.0 and s.loc["sft", "judge_helpfulness"] == 3.0
    assert s.loc["bon", "n"] == 2 and {"helpfulness_lo", "judge_harmlessness_hi"} <= set(s.columns)
    assert s.loc["bon", "judge_helpfulness_n"] == 2 and s.loc["bon", "judge_helpfulness_failed"] == 0


def test_the_summary_counts_unrated_replies_and_averages_the_rest():
    scores = pd.DataFrame({"prompt_id": ["a", "b", "c"], "method": "bon", "setting": "star", "lambda": 0.3,
                           "helpfulness": [1.0, 2.0, 3.0], "harmfulness": [-1.0, -1.0, 1.0]})
    judged = scores[["prompt_id", "method", "setting"]].assign(judge_helpfulness=[4.0, np.nan, 8.0],
                                                               judge_harmlessness=[5.0, 5.0, 5.0])
    row = aggregate.summarise(scores, judged, 200, 0).iloc[0]
    assert row["n"] == 3 and row["judge_helpfulness_n"] == 2 and row["judge_helpfulness_failed"] == 1
    assert row["judge_helpfulness"] == 6.0 and row["judge_harmlessness_failed"] == 0


def test_the_calibration_figure_shows_the_calibrated_decoder_where_lambda_lives(tmp_path):
    """Built from a real calibration record: panel 1 is the calibrated Best-of-N's expected cost (tau - g')
    with tau, both lambda panels are symlog so a small lambda-hat and lambda* are apart, and both are marked."""
    import matplotlib

    matplotlib.use("Agg")
    from lara.calibrate.calibrate import CalibrationSettings, PromptScores, calibrate
    from lara.evaluate.figures import FigureSettings, calibration

    rng = np.random.default_rng(0)
    reward, cost = rng.normal(size=(60, 8)), rng.normal(size=(60, 8))
    ids = np.repeat([f"p{i}" for i in range(60)], 8)
    scores = PromptScores.from_long(ids, reward.ravel(), cost.ravel())
    lam = calibrate(scores, CalibrationSettings(tau=-0.3, mode="bon", bon_n=4, bootstrap=200))
    fig = calibration(lam, FigureSettings())
    cost_ax, dual_ax = fig.axes[:2]
    assert "Best-of-4" in cost_ax.get_title()
    assert cost_ax.get_xscale() == dual_ax.get_xscale() == "symlog"
    x, y = cost_ax.lines[0].get_data()
    np.testing.assert_allclose(y, lam["tau"] - np.asarray(lam["curves"]["g_prime"]))
    assert x[1] <= 1e-3 * x[-1]  # the curve is resolved near zero, not only on a linear grid
    marked = {float(line.get_xdata()[0]) for line in cost_ax.lines[1:] if len(set(line.get_xdata())) == 1}
    assert {lam["lambda_hat"], lam["lambda_star"]} <= marked
    assert any(set(line.get_ydata()) == {lam["tau"]} for line in cost_ax.lines)


def _audit_with_decoders(tmp_path):
    rng = np.random.default_rng(1)
    rows = []
    for method in ("bon", "args"):
        for setting, lam in (("zero", 0.0), ("hat", 0.05), ("star", 0.1), ("max", 5.0)):
            cost = rng.normal(-lam, 0.3, 50)
            scores = pd.DataFrame({"prompt_id": range(50), "method": method, "setting": setting, "lambda": lam,
                                   "decoder_cost": cost, "decoder_reward": rng.normal(1 - lam / 5, 0.3, 50)})
            rows.append(scores)
    rows.append(pd.DataFrame({"prompt_id": range(50), "method": "sft", "setting": "policy", "lambda": np.nan,
                              "decoder_cost": 0.0, "decoder_reward": 0.0}))
    audit = {"decoders": aggregate.decoder_audit(pd.concat(rows), -0.5, 300, 0)}
    (tmp_path / "audit.json").write_text(json.dumps(audit))
    (tmp_path / "lambda.json").write_text(json.dumps({
        "lambda_hat": 0.05, "lambda_star": 0.1, "tau": -0.5, "mode": "bon", "feasible": True, "status": "interior",
        "decoder": {"kind": "best_of_n", "n": 4, "k": 4},
        "bootstrap": {"quantile": 0.975, "quantiles": {"0.5": 0.05, "0.975": 0.1}}}))
    return audit


def test_the_decoders_figure_draws_every_decoder_against_tau(tmp_path):
    """`lara figure --kind decoders`: one reward and one cost panel, each decoder's settings ordered by
    lambda with their intervals, tau dashed in the cost panel, filled markers where the audit says met."""
    from PIL import Image

    from lara.cli import main
    from lara.stats import VERDICTS

    audit = _audit_with_decoders(tmp_path)
    rc = main(["figure", "--kind", "decoders", "--audit", str(tmp_path / "audit.json"), "--lambda-json",
               str(tmp_path / "lambda.json"), "--png", str(tmp_path / "d.png"), "--pdf", str(tmp_path / "d.pdf"),
               "--provenance", str(tmp_path / "d.provenance.json")])
    assert rc in (0, None)
    assert Image.open(tmp_path / "d.png").size[0] > 500
    side = json.loads((tmp_path / "d.provenance.json").read_text())
    assert side["shows"]["kind"] == "decoders" and side["shows"]["lambda_star"] == 0.1
    # the drawing itself
    import matplotlib

    matplotlib.use("Agg")
    from lara.evaluate.figures import FigureSettings, decoders

    fig = decoders(audit, {"tau": -0.5}, FigureSettings())
    reward_ax, cost_ax = fig.axes[:2]
    assert cost_ax.get_xscale() == "symlog"
    assert any(set(line.get_ydata()) == {-0.5} for line in cost_ax.lines)
    lines = [line for line in cost_ax.lines if len(line.get_xdata()) == 4]  # one line per decoder, policies left out
    assert len(lines) == 2 and all(list(line.get_xdata()) == [0.0, 0.05, 0.1, 5.0] for line in lines)
    met = [r for r in audit["decoders"] if r["verdict"] == VERDICTS[0] and r["setting"] != "policy"]
    assert met and len(met) < 8  # both kinds of marker are drawn


def test_the_decoders_figure_refuses_an_audit_without_decoders(tmp_path, capsys):
    from lara.cli import main

    _audit_with_decoders(tmp_path)
    (tmp_path / "audit.json").write_text(json.dumps({"question": "no Best-of-N at lambda*", "decoders": []}))
    rc = main(["figure", "--kind", "decoders", "--audit", str(tmp_path / "audit.json"), "--lambda-json",
               str(tmp_path / "lambda.json"), "--png", str(tmp_path / "d.png"), "--pdf", str(tmp_path / "d.pdf"),
               "--provenance", str(tmp_path / "d.provenance.json")])
    assert rc == 2 and "audit.json: no decoder scored by the decoding models" in capsys.readouterr().err
    assert not list(tmp_path.glob("d.*"))


def test_fig2_says_which_decoder_dominates_which_baseline_and_how_clearly():
    from lara.evaluate.summary import fig2_reading

    def row(method, setting, helpful, harmful, width):
        return {"method": method, "setting": setting, "helpfulness": helpful, "helpfulness_lo": helpful - width,
                "helpfulness_hi": helpful + width, "harmfulness": harmful, "harmfulness_lo": harmful - width,
                "harmfulness_hi": harmful + width}

    summary = pd.DataFrame([row("bon", "star", 1.0, -1.0, 0.1), row("args", "star", 0.5, 0.2, 0.5),
                            row("cdq", "star", 0.0, 0.5, 0.1), row("pargs", "star", 1.0, 0.5, 0.1),
                            row("bon", "zero", 9.0, 9.0, 0.1),
                            row("sft", "policy", 0.0, 0.0, 0.1), row("safe_rlhf", "policy", 0.5, 0.0, 0.1)])
    text = "\n".join(fig2_reading(summary))
    assert "bon    at lambda* vs safe_rlhf  dominates (both 95% intervals apart)" in text
    assert "args   at lambda* vs safe_rlhf  is dominated (means; intervals overlap)" in text
    assert "cdq    at lambda* vs safe_rlhf  trades off: less helpful and less harmful" not in text
    assert "cdq    at lambda* vs safe_rlhf  is dominated (both 95% intervals apart)" in text
    assert "pargs  at lambda* vs safe_rlhf  trades off: more helpful and more harmful" in text
    assert "vs sft" not in text and "zero" not in text  # the reference policy and other settings are not Fig. 2's
    assert fig2_reading(summary[summary["setting"] != "policy"]) == []
