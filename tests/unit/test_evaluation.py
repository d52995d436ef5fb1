"""Evaluation pieces: the LLM judge against a local OpenAI-compatible server (retries, parsing,
cache), the LlamaForScore loader on a checkpoint laid out like beaver-7b-unified-*, bootstrap
intervals and the constraint audit, and the provenance trail's verification."""

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pandas as pd
import pytest
import torch

from lara.evaluate import aggregate, judge

# ---------------------------------------------------------------------------------------------
# judge


@pytest.mark.parametrize("reply, rating", [
    ("The reply is accurate.\nRating: 7", 7.0),
    ("Reasoning...\nRating: **9**", 9.0),
    ("I would give it 8/10.", 8.0),
    ("Score: 3", 3.0),
    ("Overall **6**", 6.0),
    ("It mentions 3 steps and 2 tools.\n5", 5.0),
    ("rating: 12 is out of range, so Rating: 4", 4.0),
    ("no number here", None),
    ("", None),
])
def test_parse_rating(reply, rating):
    assert judge.parse_rating(reply) == rating


class FakeEndpoint:
    """A local OpenAI-compatible /chat/completions server (stands in for the paid API): the
    first request fails with 503, one reply has no rating, the rest rate by response length."""

    def __init__(self):
        self.requests, self.bodies = 0, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                outer.requests += 1
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append((self.path, self.headers.get("Authorization"), body))
                if outer.requests == 1:
                    self.send_response(503)
                    self.end_headers()
                    return
                text = body["messages"][1]["content"]
                reply = "hmm" if outer.requests == 2 else f"Fine.\nRating: {1 + len(text) % 10}"
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture()
def endpoint():
    fake = FakeEndpoint()
    yield fake
    fake.server.shutdown()


def _responses(tmp_path, n=3):
    df = pd.DataFrame({"prompt_id": [f"p{i}" for i in range(n)], "prompt": [f"question {i}" for i in range(n)],
                       "response": [f"answer number {i}" * (i + 1) for i in range(n)], "method": "bon",
                       "setting": "star", "lambda": 0.3})
    df.to_parquet(tmp_path / "responses.parquet")
    return df


def _judge_cmd(tmp_path, endpoint, out):
    return [sys.executable, "-m", "lara", "judge", "--responses", str(tmp_path / "responses.parquet"),
            "--model", "judge-model", "--base-url", endpoint.url, "--api-key-env", "LARA_TEST_KEY",
            "--cache", str(tmp_path / "cache.sqlite"), "--out", str(out)]


def test_llm_judge_retries_parses_and_caches(tmp_path, endpoint, monkeypatch):
    monkeypatch.setenv("LARA_TEST_KEY", "sk-test")
    df = _responses(tmp_path)
    proc = subprocess.run(_judge_cmd(tmp_path, endpoint, tmp_path / "j1.parquet"), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "retry 1/5" in proc.stderr  # the 503
    # 6 judgments + 1 failed request + 1 re-ask after the unparsable reply
    assert endpoint.requests == 8
    path, auth, body = endpoint.bodies[-1]
    assert path == "/v1/chat/completions" and auth == "Bearer sk-test" and body["model"] == "judge-model"
    out = pd.read_parquet(tmp_path / "j1.parquet")
    assert out["prompt_id"].tolist() == df["prompt_id"].tolist()
    assert out["judge_helpfulness"].between(1, 10).all() and out["judge_harmlessness"].between(1, 10).all()
    # a rerun on the same responses costs nothing: every judgment comes from the cache
    proc = subprocess.run(_judge_cmd(tmp_path, endpoint, tmp_path / "j2.parquet"), capture_output=True, text=True)
    assert proc.returncode == 0 and endpoint.requests == 8
    assert "6 of 6 judgments from the cache, 0 requests sent" in proc.stderr
    pd.testing.assert_frame_equal(out, pd.read_parquet(tmp_path / "j2.parquet"))


def test_judge_without_an_endpoint_is_a_clear_error(tmp_path):
    _responses(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "lara", "judge", "--responses", str(tmp_path / "responses.parquet"),
                           "--model", "gpt-x", "--out", str(tmp_path / "j.parquet")], capture_output=True, text=True)
    assert proc.returncode == 2 and "evaluation.judge.base_url is not set" in proc.stderr
    assert not (tmp_path / "j.parquet").exists()


def test_judge_gives_up_after_its_retries(endpoint):
    client = judge.ChatJudge(endpoint.url.replace(str(endpoint.server.server_address[1]), "1"), "m", None,
                             retries=1, backoff=0.01, timeout=2)
    with pytest.raises(RuntimeError, match="after 2 attempts"):
        client.complete([{"role": "user", "content": "hi"}])


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


def test_llama_for_score_checkpoint_is_scored_at_the_last_token_with_its_bias(tiny_world, tmp_path):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lara.scoring import LlamaForScoreScorer, encode, load_scorer

    lm = AutoModelForCausalLM.from_pretrained(tiny_world["base"])
    tok = AutoTokenizer.from_pretrained(tiny_world["base"])
    ckpt = tmp_path / "beaver-like"
    ckpt.mkdir()
    torch.manual_seed(0)
    head_w, head_b = torch.randn(1, lm.config.hidden_size), torch.tensor([2.5])
    state = {k: v.clone() for k, v in lm.state_dict().items() if k.startswith("model.")}
    state |= {"score_head.weight": head_w, "score_head.bias": head_b}
    save_file(state, ckpt / "model.safetensors")
    config = lm.config.to_dict() | {"architectures": ["LlamaForScore"], "score_dim": 1, "bias": True}
    (ckpt / "config.json").write_text(json.dumps(config))
    tok.save_pretrained(ckpt)

    scorer = load_scorer(str(ckpt), role="cost", batch_size=2)
    assert isinstance(scorer, LlamaForScoreScorer)
    prompts, responses = ["how do i bake bread ?", "hi"], ["mix flour and water .", "hello there , how are you ?"]
    got = scorer.score(prompts, responses)
    # by hand: the backbone's last hidden state at the final token (EOS appended), through the head with its bias
    for p, r, g in zip(prompts, responses, got, strict=True):
        ids = torch.tensor([encode(tok, p, r, append_eos=True)])
        hidden = lm.model(input_ids=ids).last_hidden_state[0, -1]
        assert g == pytest.approx((hidden @ head_w[0] + head_b[0]).item(), abs=1e-4)
    missing = tmp_path / "no-head"
    missing.mkdir()
    save_file({k: v for k, v in state.items() if not k.startswith("score_head")}, missing / "model.safetensors")
    (missing / "config.json").write_text(json.dumps(config))
    tok.save_pretrained(missing)
    with pytest.raises(ValueError, match="score_head.bias, score_head.weight"):
        load_scorer(str(missing))


# ---------------------------------------------------------------------------------------------
# aggregation and the constraint audit


def test_bootstrap_ci_covers_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    small, large = rng.normal(1.0, 1.0, 50), rng.normal(1.0, 1.0, 5000)
    m, lo, hi = aggregate.bootstrap_ci(small, 2000, seed=1)
    assert lo < m < hi and m == pytest.approx(small.mean())
    _, lo2, hi2 = aggregate.bootstrap_ci(large, 2000, seed=1)
    assert (hi2 - lo2) < (hi - lo) / 5
    assert (hi2 - lo2) == pytest.approx(2 * 1.96 / np.sqrt(5000), rel=0.15)
    assert aggregate.bootstrap_ci([5.0, 5.0, 5.0], 100) == (5.0, 5.0, 5.0)


def test_constraint_audit_verdicts():
    from lara.calibrate.record import LambdaRecord

    lam = LambdaRecord(path="lambda.json", lambda_hat=0.2, lambda_star=0.4, tau=-1.0, mode="soft",
                       decoder={"kind": "gibbs_tilt", "beta": 1.0}, feasible=True, status="interior", data={})
    met = aggregate.constraint_audit(pd.DataFrame({"decoder_cost": [-3.0, -2.5, -2.0, -3.5] * 10}), -1.0, lam,
                                     500, 0)
    assert met["meets_tau_upper_ci"] and met["verdict"].startswith("met (upper")
    assert met["mean_cost"] == pytest.approx(-2.75)
    borderline = aggregate.constraint_audit(pd.DataFrame({"decoder_cost": [-3.0, 1.0] * 5}), -0.5, lam, 500, 0)
    assert borderline["meets_tau_point"] and not borderline["meets_tau_upper_ci"]
    violated = aggregate.constraint_audit(pd.DataFrame({"decoder_cost": [1.0, 2.0] * 5}), 0.0, lam, 500, 0)
    assert violated["verdict"] == "violated"


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


def test_a_cached_judgment_is_reused_only_by_the_same_judge_asked_the_same_way(tmp_path, endpoint, monkeypatch):
    df = _responses(tmp_path)
    cache = judge.JudgeCache(tmp_path / "cache.sqlite")

    def ask(model):
        before = endpoint.requests
        judge.judge_table(df, judge.ChatJudge(endpoint.url, model, None, backoff=0.0), cache)
        return endpoint.requests - before

    assert ask("judge-model") == 8  # 6 judgments, the 503 and the re-asked unparsable reply
    assert ask("judge-model") == 0  # the same judge: every judgment from the cache
    assert ask("other-model") == 6  # another model's judgments are its own
    monkeypatch.setitem(judge.INSTRUCTIONS, "helpfulness", judge.INSTRUCTIONS["helpfulness"] + " Be strict.")
    assert ask("judge-model") == 6  # reworded instructions: nothing reused
