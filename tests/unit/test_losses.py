"""Training losses on hand-made tensors against the direct formulas."""

import math

import pytest
import torch

from lara.train.preference import cost_loss, oriented_pairs
from lara.train.value import value_loss, value_targets


def logsig(x):
    return math.log(1 / (1 + math.exp(-x)))


def test_reward_loss_matches_the_formula():
    # the reward model's loss: cost_loss's bt, with no safety signs
    rc, rr = torch.tensor([1.0, -0.5, 2.0]), torch.tensor([0.0, 0.5, 2.5])
    expected = -(logsig(1.0) + logsig(-1.0) + logsig(-0.5)) / 3
    assert cost_loss(rc, rr, None, None, loss="bt").item() == pytest.approx(expected, rel=1e-6)
    reg = 0.1 * (1 + 0.25 + 4 + 0 + 0.25 + 6.25) / 6
    assert cost_loss(rc, rr, None, None, 0.1, loss="bt").item() == pytest.approx(expected + reg, rel=1e-6)


def test_cost_loss_matches_safe_rlhf():
    # pair 1: unsafer is unsafe (s=+1), safer is safe (s=-1); pair 2: both unsafe
    c_hi, c_lo = torch.tensor([2.0, 1.0]), torch.tensor([-1.0, 0.5])
    s_hi, s_lo = torch.tensor([1.0, 1.0]), torch.tensor([-1.0, 1.0])
    terms = [-logsig(2.0 - -1.0) - logsig(-1.0 * -1.0) - logsig(1.0 * 2.0),
             -logsig(1.0 - 0.5) - logsig(1.0 * 0.5) - logsig(1.0 * 1.0)]
    expected = sum(terms) / 2
    assert cost_loss(c_hi, c_lo, s_hi, s_lo).item() == pytest.approx(expected, rel=1e-6)
    reg = 1e-3 * (4 + 1 + 1 + 0.25) / 4
    assert cost_loss(c_hi, c_lo, s_hi, s_lo, 1e-3).item() == pytest.approx(expected + reg, rel=1e-6)
    # the sign terms push a safe response below zero: the loss falls as c_safer goes negative
    assert cost_loss(c_hi, torch.tensor([-3.0, 0.5]), s_hi, s_lo) < cost_loss(c_hi, c_lo, s_hi, s_lo)


def test_cost_loss_bt_is_the_pairwise_term_alone():
    c_hi, c_lo = torch.tensor([2.0, 1.0]), torch.tensor([-1.0, 0.5])
    s_hi, s_lo = torch.tensor([1.0, 1.0]), torch.tensor([-1.0, 1.0])
    expected = (-logsig(2.0 - -1.0) - logsig(1.0 - 0.5)) / 2
    assert cost_loss(c_hi, c_lo, s_hi, s_lo, loss="bt").item() == pytest.approx(expected, rel=1e-6)
    reg = 1e-3 * (4 + 1 + 1 + 0.25) / 4
    assert cost_loss(c_hi, c_lo, s_hi, s_lo, 1e-3, loss="bt").item() == pytest.approx(expected + reg, rel=1e-6)
    # no anchor: shifting every cost by a constant leaves the bt loss unchanged, the safe_rlhf loss not
    shifted = (c_hi + 5.0, c_lo + 5.0)
    assert cost_loss(*shifted, s_hi, s_lo, loss="bt").item() == pytest.approx(expected, rel=1e-6)
    assert cost_loss(*shifted, s_hi, s_lo).item() > cost_loss(c_hi, c_lo, s_hi, s_lo).item()
    with pytest.raises(ValueError, match="safe_rlhf or bt"):
        cost_loss(c_hi, c_lo, s_hi, s_lo, loss="hinge")


def test_oriented_pairs():
    import pandas as pd

    df = pd.DataFrame({"prompt": ["p", "q"], "response_0": ["a", "c"], "response_1": ["b", "d"],
                       "better_response_id": [1, 0], "safer_response_id": [0, 1],
                       "is_response_0_safe": [True, False], "is_response_1_safe": [False, False]})
    r = oriented_pairs(df, "reward")
    assert list(r["chosen"]) == ["b", "c"] and list(r["rejected"]) == ["a", "d"]
    c = oriented_pairs(df, "cost")  # chosen = the unsafer one
    assert list(c["chosen"]) == ["b", "c"] and list(c["rejected"]) == ["a", "d"]
    assert list(c["chosen_sign"]) == [1.0, 1.0] and list(c["rejected_sign"]) == [-1.0, 1.0]


def test_value_targets_cdq_and_fudge():
    # one row, 4 tokens: 2 prompt tokens then 2 response tokens (the last one final), vocab of 3
    ids = torch.tensor([[0, 1, 2, 1]])
    resp = torch.tensor([[0, 0, 1, 1]])
    q = torch.tensor([[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0], [9.0, 10.0, 11.0]]])
    ref = torch.log(torch.tensor([[[1 / 3] * 3, [0.5, 0.25, 0.25], [0.2, 0.3, 0.5], [1 / 3] * 3]]))
    final = torch.tensor([4.0])
    pred, tgt, mask = value_targets(q, ref, ids, resp, final, "cdq")
    # pred[t] = Q(ids[:t+1], ids[t+1]) = q[t, ids[t+1]]
    assert pred.tolist() == [[1.0, 5.0, 7.0]]
    assert mask.tolist() == [[0.0, 1.0, 1.0]]
    # t=1 predicts token 2 (not final): target = sum_z pi_ref(z | ids[:3]) * q[2, z]
    assert tgt[0, 1].item() == pytest.approx(0.2 * 6 + 0.3 * 7 + 0.5 * 8)
    assert tgt[0, 2].item() == 4.0  # the final token regresses on the score
    assert value_loss(pred, tgt, mask).item() == pytest.approx(((5 - 7.3) ** 2 + (7 - 4) ** 2) / 2, rel=1e-6)
    _, tgt_f, _ = value_targets(q, None, ids, resp, final, "fudge")
    assert tgt_f[0, 1:].tolist() == [4.0, 4.0]
    with pytest.raises(ValueError):
        value_targets(q, ref, ids, resp, final, "td")


def test_the_fitted_zero_is_the_most_accurate_threshold_and_moves_with_the_scores():
    import numpy as np

    from lara.train.preference import fit_zero, zero_report

    rng = np.random.default_rng(0)
    n = 4000
    unsafe = rng.random(n) < 0.3
    scores = np.where(unsafe, rng.normal(2.0, 1.0, n), rng.normal(-1.0, 1.0, n))
    b = fit_zero(scores, unsafe)
    # the Bayes boundary of 0.3 N(2, 1) against 0.7 N(-1, 1): 0.3 phi(x - 2) = 0.7 phi(x + 1), x = 0.5 + ln(7/3)/3
    bayes = 0.5 + math.log(7 / 3) / 3
    assert abs(b - bayes) < 0.25  # the empirical optimum is flat near the boundary: a loose, derived tolerance
    # no threshold classifies more held-out responses correctly
    grid = np.linspace(scores.min() - 1, scores.max() + 1, 2001)
    best = max(np.mean((scores > t) == unsafe) for t in grid)
    report = zero_report(scores, unsafe, b)
    assert report["accuracy_at_zero"] >= best - 1e-12 and report["offset"] == b
    assert report["accuracy_at_zero_cross_fitted"] > 0.9 and report["accuracy_at_zero_cross_fitted"] <= 1.0
    # shift invariance: a bt model's arbitrary zero does not move the anchored scale
    assert fit_zero(scores + 7.0, unsafe) == pytest.approx(b + 7.0, abs=1e-9)
    assert zero_report(scores + 7.0, unsafe, b + 7.0)["accuracy_at_zero"] == report["accuracy_at_zero"]
    assert zero_report(scores + 7.0, unsafe, 0.0)["accuracy_at_trained_zero"] < 0.35  # unanchored: all "unsafe"
    # separable responses: the zero lies strictly between the classes
    sep = np.array([-3.0, -2.0, -1.5, 4.0, 5.0])
    z = fit_zero(sep, np.array([False, False, False, True, True]))
    assert -1.5 < z < 4.0
    with pytest.raises(ValueError, match="finite held-out scores"):
        fit_zero(np.array([np.nan, 1.0]), np.array([True, False]))
