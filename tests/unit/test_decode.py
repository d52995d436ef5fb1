"""Best-of-N selection and the token-level decoders (cached scoring against the naive reference)."""

import json

import numpy as np
import pytest
import torch

from lara.calibrate.record import parse_setting, resolve_lambda
from lara.decode.bon import select
from lara.decode.rgtg import (
    CachedSequenceScorer,
    CachedValueScorer,
    NaiveSequenceScorer,
    NaiveValueScorer,
    RGTGSettings,
    decode,
)
from lara.scoring import encode, pad_batch


def test_bon_selection_against_brute_force():
    rng = np.random.default_rng(0)
    reward, cost = rng.normal(size=(30, 7)), rng.normal(size=(30, 7))
    lams = [0.0, 0.3, 1.0, 4.0]
    idx = select(reward, cost, lams)
    for li, lam in enumerate(lams):
        for p in range(30):
            assert idx[li, p] == max(range(7), key=lambda k: reward[p, k] - lam * cost[p, k])
    assert np.array_equal(idx[0], reward.argmax(1))  # lambda = 0: reward-only selection
    big = select(reward, cost, [1e9])[0]
    assert np.array_equal(big, cost.argmin(1))  # a very large lambda: the least costly candidate
    from lara.decode.sweep import sweep_table

    table = sweep_table(reward, cost, np.linspace(0, 5, 11), ["grid"] * 11, 7, None, n_boot=100)  # N = K: the argmax
    assert np.all(np.diff(table["mean_cost"]) <= 1e-12) and np.all(np.diff(table["mean_reward"]) <= 1e-12)


def test_lambda_settings(tmp_path):
    (tmp_path / "lambda.json").write_text(json.dumps({"lambda_hat": 0.5, "lambda_star": 0.77, "tau": 0.0, "mode": "bon",
                                                      "decoder": {"kind": "best_of_n", "n": 4}, "feasible": True,
                                                      "status": "interior", "bootstrap": {}}))
    assert resolve_lambda("zero", 3.0) == 0.0 and resolve_lambda("max", 3.0) == 3.0
    assert resolve_lambda("star", 3.0, tmp_path / "lambda.json") == 0.77
    assert resolve_lambda("0p25", 3.0) == 0.25 and parse_setting("2") == 2.0
    with pytest.raises(ValueError):
        parse_setting("half")


@pytest.fixture(scope="module")
def models(tiny_world):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_world["base"])
    torch.manual_seed(1)
    policy = AutoModelForCausalLM.from_pretrained(tiny_world["base"]).eval()
    seq = [AutoModelForSequenceClassification.from_pretrained(tiny_world["base"], num_labels=1).eval()
           for _ in range(2)]
    for m in seq:  # a random head with a larger scale, so the scores matter
        torch.nn.init.normal_(m.score.weight, std=1.0)
    val = [AutoModelForCausalLM.from_pretrained(tiny_world["base"]).eval() for _ in range(2)]
    for i, m in enumerate(val):
        torch.manual_seed(10 + i)
        for p in m.parameters():
            p.data += 0.05 * torch.randn_like(p)
    return tok, policy, seq, val


PROMPTS = ["how do i bake bread ?", "tell me how to steal a car . i need it today .", "please help me get fit .",
           "how do i write a polite email ?"]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("family", ["sequence", "value"])
def test_cached_tokens_equal_naive_tokens(models, family, temperature):
    tok, policy, seq, val = models
    r, c = seq if family == "sequence" else val
    s = RGTGSettings(top_k=8, weight=2.0, temperature=temperature, max_new_tokens=12, batch_size=4)
    with torch.no_grad():
        cached = decode(policy, r, c, tok, PROMPTS, 0.8, s, seed=3, cached=True)
        naive = decode(policy, r, c, tok, PROMPTS, 0.8, s, seed=3, cached=False)
    assert cached == naive
    assert all(len(t) >= 1 for t in cached)
    # the scores steer: a different lambda changes some tokens
    with torch.no_grad():
        other = decode(policy, r, c, tok, PROMPTS, 0.0, s, seed=3)
    assert other != cached


def _prefix_state(tok, prompts):
    ids, mask = pad_batch([encode(tok, p, "", False) for p in prompts], tok.pad_token_id, side="left")
    return ids, mask


def test_cached_candidate_scores_equal_per_candidate_forwards(models):
    tok, policy, seq, val = models
    ids, mask = _prefix_state(tok, PROMPTS)
    cand = torch.tensor([[5, 17, 300, 42]] * len(PROMPTS))
    with torch.no_grad():
        for cached_cls, naive_cls, model in ((CachedSequenceScorer, NaiveSequenceScorer, seq[0]),
                                             (CachedValueScorer, NaiveValueScorer, val[0])):
            a, b = cached_cls(model), naive_cls(model)
            a.start(ids, mask)
            b.start(ids, mask)
            torch.testing.assert_close(a.candidates(cand), b.candidates(cand), atol=1e-4, rtol=1e-4)
            # after committing a choice the caches still agree with full re-forwards
            choice = torch.tensor([0, 1, 2, 3])
            tokens = cand[torch.arange(4), choice]
            alive = torch.tensor([True, True, False, True])
            a.commit(tokens, choice, alive)
            b.commit(tokens, choice, alive)
            # rows still decoding agree (a finished row's scores are never used again)
            torch.testing.assert_close(a.candidates(cand)[alive], b.candidates(cand)[alive], atol=1e-4, rtol=1e-4)


def test_cdq_one_pass_values_equal_per_candidate_values(models):
    tok, _, _, val = models
    ids, mask = _prefix_state(tok, PROMPTS[:2])
    with torch.no_grad():
        one = CachedValueScorer(val[0])
        one.start(ids, mask)
        every = one.last  # (B, V): all next-token values from one forward
        for b, p in enumerate(PROMPTS[:2]):
            prefix = encode(tok, p, "", False)
            for z in (3, 99, 250):
                full = val[0](input_ids=torch.tensor([prefix + [z]])).logits[0, -2, z].item()
                assert every[b, z].item() == pytest.approx(full, abs=1e-4)


def test_eos_and_max_length_are_respected(models):
    tok, policy, seq, val = models
    s = RGTGSettings(top_k=8, weight=1.0, temperature=0.0, max_new_tokens=5, batch_size=4)
    with torch.no_grad():
        out = decode(policy, seq[0], seq[1], tok, PROMPTS, 0.5, s)
    assert all(1 <= len(t) <= 5 for t in out)
    assert all(tok.eos_token_id not in t[:-1] for t in out)
    # a reward value model that prizes EOS above everything: every row stops at its first token
    from transformers import AutoModelForCausalLM

    eos_lover = AutoModelForCausalLM.from_pretrained(val[0].config._name_or_path).eval()
    with torch.no_grad():
        eos_lover.lm_head = torch.nn.Linear(eos_lover.config.hidden_size, len(tok), bias=True)
        eos_lover.lm_head.weight.zero_()
        eos_lover.lm_head.bias.zero_()
        eos_lover.lm_head.bias[tok.eos_token_id] = 100.0
        s_all = RGTGSettings(top_k=len(tok), weight=1.0, temperature=0.0, max_new_tokens=6, batch_size=4)
        out = decode(policy, eos_lover, val[1], tok, PROMPTS, 0.0, s_all)
    assert out == [[tok.eos_token_id]] * len(PROMPTS)


def test_the_tree_mask_scores_alike_under_sdpa_and_eager_attention(models, tiny_world):
    """SDPA gets a boolean tree mask, eager attention an additive one: the same candidate scores."""
    from transformers import AutoModelForSequenceClassification

    tok, policy, seq, val = models
    eager = AutoModelForSequenceClassification.from_pretrained(tiny_world["base"], num_labels=1,
                                                               attn_implementation="eager").eval()
    eager.load_state_dict(seq[0].state_dict())
    assert seq[0].config._attn_implementation == "sdpa" and eager.config._attn_implementation == "eager"
    ids, mask = _prefix_state(tok, PROMPTS)
    cand = torch.tensor([[5, 17, 300, 42]] * len(PROMPTS))
    with torch.no_grad():
        scores = []
        for model in (seq[0], eager):
            scorer = CachedSequenceScorer(model)
            scorer.start(ids, mask)
            scores.append(scorer.candidates(cand))
    torch.testing.assert_close(scores[0], scores[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_several_costs_decode_with_the_sum_of_their_penalties(models, temperature):
    """ARGS with a cost list: one cost and one lambda decode exactly as the scalar decoder; two costs at (a, b)
    add their penalties (two copies of one cost at 0.4 each decode as that cost at 0.8)."""
    tok, policy, seq, _ = models
    r, c = seq
    s = RGTGSettings(top_k=8, weight=2.0, temperature=temperature, max_new_tokens=12, batch_size=4)
    with torch.no_grad():
        scalar = decode(policy, r, c, tok, PROMPTS, 0.8, s, seed=3)
        listed = decode(policy, r, [c], tok, PROMPTS, [0.8], s, seed=3)
        assert listed == scalar
        both = decode(policy, r, [c, c], tok, PROMPTS, [0.4, 0.4], s, seed=3)
        assert both == scalar  # 0.4 c + 0.4 c is 0.8 c exactly (doubling is exact in binary)
        other = decode(policy, r, [c, r], tok, PROMPTS, [0.8, 1.5], s, seed=3)
    assert other != scalar  # the second cost steers
    with pytest.raises(ValueError, match="2 cost scorers but 1 multipliers"):
        decode(policy, r, [c, c], tok, PROMPTS, [0.8], s, seed=3)


def test_policy_fluency_stepper_is_the_mean_log_probability_of_the_prefix(models):
    """ARGS's fluency reward under pi_ref itself (lara.constraints.decode.PolicyFluencyStepper): each candidate's
    score is the mean log pi_ref of the generated tokens and the candidate, as full forward passes give it."""
    from lara.constraints.decode import PolicyFluencyStepper
    from lara.scoring import encode, pad_batch

    tok, policy, _, _ = models
    prompts = PROMPTS[:2]
    seqs = [encode(tok, p, "", False) for p in prompts]
    ids, mask = pad_batch(seqs, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id, side="left")

    def full_logprobs(seq):
        with torch.no_grad():
            return torch.log_softmax(policy(input_ids=torch.tensor([seq])).logits[0, -1].float(), -1)

    stepper = PolicyFluencyStepper(policy)
    generated = [[], []]
    with torch.no_grad():
        stepper.start(ids, mask)
        for _ in range(3):
            cand = torch.tensor([[5, 9, 11], [7, 9, 13]])
            got = stepper.candidates(cand)
            for i in range(2):
                lp = full_logprobs(seqs[i] + generated[i])
                past = sum(float(full_logprobs(seqs[i] + generated[i][:t])[generated[i][t]])
                           for t in range(len(generated[i])))
                want = (past + lp[cand[i]]) / (len(generated[i]) + 1)
                assert torch.allclose(got[i], want, atol=1e-4), (i, got[i], want)
            choice = torch.tensor([0, 2])
            tokens = cand[torch.arange(2), choice]
            stepper.commit(tokens, choice, torch.tensor([True, True]))
            for i in range(2):
                generated[i].append(int(tokens[i]))
