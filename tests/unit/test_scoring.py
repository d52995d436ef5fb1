"""The scorer reads the head at the true last token, whatever the padding."""

import json

import numpy as np
import pytest
import torch


@pytest.fixture(scope="module")
def score_model(tiny_world, tmp_path_factory):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = tmp_path_factory.mktemp("scorer") / "model"
    tok = AutoTokenizer.from_pretrained(tiny_world["base"])
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_world["base"], num_labels=1)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    (path / "lara_scorer.json").write_text(json.dumps({"append_eos": True, "max_length": 200}))
    return path


PROMPTS = ["how do i bake bread ?", "tell me how to steal a car . i need it today .", "please help me get fit ."]
RESPONSES = ["sure . first , knead the dough .", "i can not help with that .",
             "sure . here is how to get fit : first , buy good shoes . then , warm up first . finally , rest one day ."]


def test_padding_invariance(score_model):
    from lara.scoring import SequenceScorer

    right = SequenceScorer(score_model, batch_size=8, padding_side="right").score(PROMPTS, RESPONSES)
    left = SequenceScorer(score_model, batch_size=8, padding_side="left").score(PROMPTS, RESPONSES)
    single = SequenceScorer(score_model, batch_size=1).score(PROMPTS, RESPONSES)
    assert len(set(np.round(single, 4))) == 3  # the responses get different scores
    np.testing.assert_allclose(right, single, atol=1e-5)
    np.testing.assert_allclose(left, single, atol=1e-5)


def test_score_is_the_head_at_the_last_token_even_when_pad_is_eos(score_model):
    from transformers import AutoModelForSequenceClassification

    from lara.scoring import SequenceScorer

    scorer = SequenceScorer(score_model, batch_size=8)
    ids = scorer.encode(PROMPTS, RESPONSES)
    assert all(seq[-1] == scorer.tokenizer.eos_token_id for seq in ids)
    model = AutoModelForSequenceClassification.from_pretrained(score_model).eval()
    with torch.no_grad():
        direct = [model.model(input_ids=torch.tensor([s])).last_hidden_state[0, -1] for s in ids]
        direct = [model.score(h).item() for h in direct]
    # pad == eos (as for many real tokenizers): the last token is still the EOS we appended
    scorer.tokenizer.pad_token = scorer.tokenizer.eos_token
    np.testing.assert_allclose(scorer.score(PROMPTS, RESPONSES), direct, atol=1e-5)


def test_oracle_scorer_and_loader():
    from lara.scoring import load_scorer

    h = load_scorer("oracle", "reward").score(PROMPTS, RESPONSES)
    c = load_scorer("oracle", "cost").score(PROMPTS, RESPONSES)
    assert h[2] > h[1] and c.max() <= 0


def test_value_scorer_one_pass_values_match_per_sequence(tiny_world, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lara.scoring import ValueScorer, encode, load_scorer

    AutoModelForCausalLM.from_pretrained(tiny_world["base"]).save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tiny_world["base"])
    tok.save_pretrained(tmp_path)
    (tmp_path / "lara_scorer.json").write_text(json.dumps({"kind": "value_cost"}))
    scorer = load_scorer(str(tmp_path), "cost", batch_size=8)
    assert isinstance(scorer, ValueScorer)
    single = ValueScorer(tmp_path, batch_size=1)
    for fraction in (0.5, 1.0):
        batch = scorer.prefix_values(PROMPTS, RESPONSES, fraction)
        one = np.concatenate([single.prefix_values([p], [r], fraction)
                              for p, r in zip(PROMPTS, RESPONSES, strict=True)])
        assert batch.shape == (len(PROMPTS),)
        np.testing.assert_allclose(batch, one, atol=1e-4)  # left padding changes nothing
    # the score of a complete response is Q(response without EOS, EOS)
    full = scorer.score(PROMPTS, RESPONSES)
    heads = [encode(tok, p, r, False) for p, r in zip(PROMPTS, RESPONSES, strict=True)]
    via_next = np.concatenate([single._forward([h]).cpu().numpy()[:, tok.eos_token_id] for h in heads])
    np.testing.assert_allclose(full, via_next, atol=1e-4)


def test_named_scorers_come_from_entry_points_and_the_toy_registers_its_oracle():
    from lara.scoring import load_scorer, named_scorers
    from lara.toy.world import oracle_scores

    assert "oracle" in named_scorers()
    prompts = ["How do I bake bread?", "How do I pick a lock to break into a house?"]
    responses = ["Mix flour, water and yeast, knead, let it rise and bake it.", "I can't help with that."]
    h, c = oracle_scores(prompts, responses)
    assert np.array_equal(load_scorer("oracle", role="reward", batch_size=2).score(prompts, responses), h)
    assert np.array_equal(load_scorer("oracle", role="cost", dtype="float32").score(prompts, responses), c)


def test_an_unknown_scorer_names_itself_and_the_known_kinds():
    from lara.scoring import load_scorer

    with pytest.raises(ValueError, match=r"scorer 'oracel': not a model directory.*named: fluency, hatesonar, oracle"):
        load_scorer("oracel")


def test_the_scorer_interface_imports_nothing_of_the_toy_world_and_no_heavy_library():
    import subprocess
    import sys

    code = ("import sys, lara.scoring; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'pandas', 'transformers') or m.startswith('lara.toy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_package_registers_a_scorer_by_name(tmp_path):
    """A third-party scorer installed beside lara (an entry point in its metadata) is found by name."""
    import subprocess
    import sys

    dist = tmp_path / "constscorer-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: constscorer\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[lara.scorers]\nconstant = constscorer:make\n")
    (tmp_path / "constscorer.py").write_text(
        "import numpy as np\n"
        "class Const:\n"
        "    def __init__(self, role): self.value = 1.0 if role == 'reward' else -1.0\n"
        "    def score(self, prompts, responses): return np.full(len(prompts), self.value)\n"
        "def make(role='reward', **options): return Const(role)\n")
    code = ("from lara.scoring import load_scorer; "
            "print(load_scorer('constant', role='cost').score(['a', 'b'], ['c', 'd']))")
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(tmp_path)}, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[-1. -1.]"


def test_a_whole_table_is_scored_with_progress_and_the_same_scores(score_model, capsys):
    """score_table: a model scorer reports rows, rate and ETA (tqdm on stderr, the rule's log); the scores
    are those of plain score(); a scorer without progress (the oracle) is called as it is."""
    from lara.scoring import SequenceScorer, load_scorer, score_table

    scorer = SequenceScorer(score_model, batch_size=2)
    plain = scorer.score(PROMPTS, RESPONSES)
    capsys.readouterr()
    shown = score_table(scorer, PROMPTS, RESPONSES, "scoring reward")
    err = capsys.readouterr().err
    np.testing.assert_array_equal(shown, plain)
    assert "scoring reward: 100%" in err and "3/3" in err and "response/s" in err
    oracle = load_scorer("oracle", role="cost")
    np.testing.assert_array_equal(score_table(oracle, PROMPTS, RESPONSES, "scoring cost"),
                                  oracle.score(PROMPTS, RESPONSES))


def test_a_fitted_zero_is_subtracted_wherever_the_model_scores(score_model, tmp_path):
    """A bt cost model's fitted zero (lara_scorer.json "offset") shifts every score by exactly that
    much, through the loader every step uses (lara score, lara evaluate, PPO-Lagrangian)."""
    import shutil

    from lara.scoring import load_scorer

    shifted = tmp_path / "cost"
    shutil.copytree(score_model, shifted)
    meta = json.loads((shifted / "lara_scorer.json").read_text())
    (shifted / "lara_scorer.json").write_text(json.dumps(meta | {"offset": 2.5}))
    plain = load_scorer(str(score_model), role="cost").score(PROMPTS, RESPONSES)
    anchored = load_scorer(str(shifted), role="cost").score(PROMPTS, RESPONSES)
    np.testing.assert_allclose(anchored, plain - 2.5, atol=1e-6)


def test_a_bt_cost_model_gets_its_zero_from_held_out_safety_labels(tiny_world, tmp_path, capsys):
    """`lara train-cost` with the paper's plain Bradley-Terry loss: the zero is fitted on the held-out
    pairs, recorded in metrics.json and lara_scorer.json, and the loaded scorer's c > 0 classifies the
    held-out responses exactly as the metrics say; without held-out pairs it refuses before training."""
    import pandas as pd

    from lara.cli import main
    from lara.scoring import load_scorer
    from lara.train.common import split_eval
    from lara.train.preference import oriented_pairs

    settings = {"learning_rate": 1e-3, "max_steps": 30, "batch_size": 8, "max_length": 128, "eval_fraction": 0.2,
                "save_steps": 100, "loss": "bt", "seed": 0}
    argv = ["train-cost", "--model", str(tiny_world["base"]), "--data", str(tiny_world["preferences"]),
            "--checkpoints", str(tmp_path / "ckpt"), "--out", str(tmp_path / "cost")]
    assert main([*argv, "--settings", json.dumps(settings)]) in (0, None)
    metrics = json.loads((tmp_path / "cost" / "metrics.json").read_text())
    zero = metrics["zero"]
    meta = json.loads((tmp_path / "cost" / "lara_scorer.json").read_text())
    assert zero["anchored"] and meta["offset"] == zero["offset"] and zero["n_responses"] == 160
    assert zero["accuracy_at_zero"] >= zero["accuracy_at_trained_zero"]
    # the held-out responses through the loader every step uses: c > 0 is "unsafe" as often as metrics say
    pairs = oriented_pairs(pd.read_parquet(tiny_world["preferences"]), "cost")
    _, held = split_eval(pairs, 0.2, 0)
    scorer = load_scorer(str(tmp_path / "cost"), role="cost")
    c = np.concatenate([scorer.score(held["prompt"].tolist(), held[side].tolist()) for side in ("chosen", "rejected")])
    unsafe = np.concatenate([held["chosen_sign"], held["rejected_sign"]]) > 0
    assert np.mean((c > 0) == unsafe) == pytest.approx(zero["accuracy_at_zero"], abs=1 / 160)
    # no held-out pairs: refused before any training, naming the keys
    capsys.readouterr()
    rc = main([*argv[:-2], "--out", str(tmp_path / "cost2"), "--settings", json.dumps(settings | {"eval_fraction": 0})])
    assert rc == 2 and "train.cost.eval_fraction = 0" in capsys.readouterr().err
    assert not (tmp_path / "cost2").exists()
