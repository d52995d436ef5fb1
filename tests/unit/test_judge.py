"""The LLM judge against a local OpenAI-compatible server (it stands in for the paid API; the real
``openai`` client talks HTTP to it): reply parsing, which failures are retried and how, the cache
key, the unrated-reply limit, the missing key, and that no key reaches the log."""

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pandas as pd
import pytest

from lara.evaluate import judge

from ..conftest import lara_in_process

KEY = "sk-test-0123456789abcdef"


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


def _completion(text):
    return 200, {"Content-Type": "application/json"}, json.dumps(
        {"id": "x", "object": "chat.completion", "created": 0, "model": "judge-model",
         "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]})


class FakeEndpoint:
    """A local ``/chat/completions`` server. ``script`` is a list of replies (status, headers, body)
    given to the first requests in order; after it, every request is rated by the length of what
    it was asked (so the rating is a function of the request)."""

    def __init__(self, script=(), delay=0.0):
        self.script, self.delay = list(script), delay
        self.requests, self.times, self.bodies = 0, [], []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                outer.requests += 1
                outer.times.append(time.monotonic())
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append((self.path, self.headers.get("Authorization"), body))
                time.sleep(outer.delay)
                if outer.script:
                    status, headers, data = outer.script.pop(0)
                else:
                    asked = body["messages"][-1]["content"]
                    status, headers, data = _completion(f"Fine.\nRating: {1 + len(asked) % 10}")
                data = data.encode()
                try:
                    self.send_response(status)
                    for k, v in {**headers, "Content-Length": str(len(data))}.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()


@pytest.fixture()
def serve():
    servers = []

    def start(script=(), delay=0.0):
        servers.append(FakeEndpoint(script, delay))
        return servers[-1]

    yield start
    for s in servers:
        s.server.shutdown()


FAST_503 = (503, {"retry-after-ms": "10"}, "overloaded")
UNRATED = _completion("hmm, hard to say")


def _responses(tmp_path, n=3):
    df = pd.DataFrame({"prompt_id": [f"p{i}" for i in range(n)], "prompt": [f"question {i}" for i in range(n)],
                       "response": [f"answer number {i}" * (i + 1) for i in range(n)], "method": "bon",
                       "setting": "star", "lambda": 0.3})
    df.to_parquet(tmp_path / "responses.parquet")
    return df


def _argv(tmp_path, endpoint, out, *extra):
    return ["judge", "--responses", str(tmp_path / "responses.parquet"), "--model", "judge-model", "--base-url",
            endpoint.url, "--api-key-env", "LARA_TEST_KEY", "--cache", str(tmp_path / "cache.sqlite"), "--out",
            str(out), *extra]


def _judge(tmp_path, endpoint, out, *extra, key=KEY):
    """`lara judge` as a real process (the console entry point, its exit status and stderr)."""
    env = {k: v for k, v in __import__("os").environ.items() if k != "LARA_TEST_KEY"}
    if key is not None:
        env["LARA_TEST_KEY"] = key
    return subprocess.run([sys.executable, "-m", "lara", *_argv(tmp_path, endpoint, out, *extra)],
                          capture_output=True, text=True, env=env)


def judge_cli(tmp_path, endpoint, out, *extra, key=KEY):
    """`lara judge` through the CLI's own main function in this process (the first test below runs it as a real
    process): the same arguments, exit status and log as ``_judge``."""
    rc, stdout, stderr = lara_in_process(_argv(tmp_path, endpoint, out, *extra), env={"LARA_TEST_KEY": key})
    return subprocess.CompletedProcess(["lara", "judge"], rc, stdout, stderr)


def test_llm_judge_retries_parses_and_caches(tmp_path, serve):
    endpoint = serve([FAST_503, UNRATED])
    df = _responses(tmp_path)
    proc = _judge(tmp_path, endpoint, tmp_path / "j1.parquet")
    assert proc.returncode == 0, proc.stderr
    # 6 judgments + the 503 (retried by the client) + the re-ask after the unrated reply
    assert endpoint.requests == 8
    path, auth, body = endpoint.bodies[-1]
    assert path == "/v1/chat/completions" and auth == f"Bearer {KEY}" and body["model"] == "judge-model"
    assert body["temperature"] == 0.0 and body["max_tokens"] == 256
    out = pd.read_parquet(tmp_path / "j1.parquet")
    assert out["prompt_id"].tolist() == df["prompt_id"].tolist()
    assert out["judge_helpfulness"].between(1, 10).all() and out["judge_harmlessness"].between(1, 10).all()
    assert KEY not in proc.stderr
    # a rerun on the same responses costs nothing: every judgment comes from the cache
    proc = _judge(tmp_path, endpoint, tmp_path / "j2.parquet")
    assert proc.returncode == 0 and endpoint.requests == 8
    assert "6 of 6 judgments from the cache, 0 requests sent" in proc.stderr
    pd.testing.assert_frame_equal(out, pd.read_parquet(tmp_path / "j2.parquet"))


def test_a_missing_key_is_a_clear_error_before_any_request(tmp_path, serve):
    endpoint = serve()
    _responses(tmp_path)
    proc = judge_cli(tmp_path, endpoint, tmp_path / "j.parquet", key=None)
    assert proc.returncode == 2 and "evaluation.judge.api_key_env" in proc.stderr and "LARA_TEST_KEY" in proc.stderr
    assert endpoint.requests == 0 and not (tmp_path / "j.parquet").exists()


def test_judge_without_an_endpoint_is_a_clear_error(tmp_path):
    _responses(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "lara", "judge", "--responses", str(tmp_path / "responses.parquet"),
                           "--model", "Oracle", "--out", str(tmp_path / "j.parquet")], capture_output=True, text=True)
    # a mis-cased oracle is an LLM judge's name: the message says so, and how the toy oracle is spelled
    assert proc.returncode == 2 and "evaluation.judge.base_url is not set: model 'Oracle'" in proc.stderr
    assert "model 'oracle'" in proc.stderr and not (tmp_path / "j.parquet").exists()


@pytest.mark.parametrize("reply, message", [
    ((400, {"Content-Type": "application/json"}, json.dumps({"error": {"message": "bad model"}})), "HTTP 400"),
    ((401, {}, f"invalid key; you sent Authorization: Bearer {KEY}"), "HTTP 401"),
    ((200, {"Content-Type": "application/json"}, "<html>garbage"), "not a chat completion"),
    ((200, {"Content-Type": "application/json"}, json.dumps({"id": "x", "object": "chat.completion"})),
     "no choices[0].message.content"),
])
def test_a_failure_that_asking_again_cannot_fix_is_not_retried(serve, reply, message):
    endpoint = serve([reply])
    client = judge.ChatJudge(endpoint.url, "m", KEY, retries=3)
    with pytest.raises(judge.JudgeError, match="judge request to .* failed") as err:
        client.complete([{"role": "user", "content": "hi"}])
    assert endpoint.requests == 1 and message in str(err.value)
    assert KEY not in str(err.value)  # the 401 body echoes the header: redacted


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503])
def test_transient_statuses_are_retried(serve, status):
    endpoint = serve([(status, {"retry-after-ms": "5"}, "busy")] * 2)
    client = judge.ChatJudge(endpoint.url, "m", KEY, retries=2)
    assert judge.parse_rating(client.complete([{"role": "user", "content": "hi"}])) is not None
    assert endpoint.requests == 3


def test_retry_after_is_honoured(serve):
    endpoint = serve([(429, {"Retry-After": "1"}, "slow down")])
    client = judge.ChatJudge(endpoint.url, "m", KEY, retries=1)
    client.complete([{"role": "user", "content": "hi"}])
    assert endpoint.requests == 2 and endpoint.times[1] - endpoint.times[0] >= 0.95


def test_timeout_and_retries_are_settings(serve):
    endpoint = serve(delay=1.5)
    client = judge.ChatJudge(endpoint.url, "m", KEY, retries=1, timeout=0.3)
    start = time.monotonic()
    with pytest.raises(judge.JudgeError, match="APITimeoutError after 2 attempts"):
        client.complete([{"role": "user", "content": "hi"}])
    assert time.monotonic() - start < 1.4 * 2 and endpoint.requests == 2
    unreachable = judge.ChatJudge("http://127.0.0.1:1/v1", "m", KEY, retries=1, timeout=2)
    with pytest.raises(judge.JudgeError, match="APIConnectionError after 2 attempts"):
        unreachable.complete([{"role": "user", "content": "hi"}])


def test_too_many_unrated_replies_fail_the_job_naming_the_limit(tmp_path, serve):
    # every reply to the first 4 requests is unrated: rows 0 and 1 of helpfulness stay unrated (2 of 3)
    endpoint = serve([UNRATED] * 4)
    _responses(tmp_path)
    proc = judge_cli(tmp_path, endpoint, tmp_path / "j.parquet", "--max-failure-share", "0.5")
    assert proc.returncode == 2, proc.stderr
    assert "2 of 3 helpfulness replies (66.7%) had no rating" in proc.stderr
    assert "evaluation.judge.max_failure_share = 50.0%" in proc.stderr
    assert not (tmp_path / "j.parquet").exists()
    # a rerun asks only the unrated ones again; the rated ones come from the cache
    before = endpoint.requests
    proc = judge_cli(tmp_path, endpoint, tmp_path / "j.parquet", "--max-failure-share", "0.5")
    assert proc.returncode == 0, proc.stderr
    assert endpoint.requests - before == 2 and "4 of 6 judgments from the cache" in proc.stderr


def test_unrated_replies_within_the_limit_are_nan_and_counted(tmp_path, serve):
    endpoint = serve([UNRATED] * 2)
    _responses(tmp_path)
    proc = judge_cli(tmp_path, endpoint, tmp_path / "j.parquet", "--max-failure-share", "0.4")
    assert proc.returncode == 0, proc.stderr
    out = pd.read_parquet(tmp_path / "j.parquet")
    assert np.isnan(out["judge_helpfulness"].iloc[0]) and out["judge_helpfulness"].iloc[1:].notna().all()
    assert "'helpfulness': 1, 'harmlessness': 0" in proc.stderr


def test_a_cached_judgment_is_reused_only_by_the_same_judge_asked_the_same_way(tmp_path, serve, monkeypatch):
    endpoint, other = serve([FAST_503, UNRATED]), serve()
    df = _responses(tmp_path)
    cache = judge.JudgeCache(tmp_path / "cache.sqlite")

    def ask(model, server=endpoint, **kw):
        before = server.requests
        judge.judge_table(df, judge.ChatJudge(server.url, model, KEY, **kw), cache)
        return server.requests - before

    assert ask("judge-model") == 8  # 6 judgments, the 503 and the re-asked unrated reply
    assert ask("judge-model") == 0  # the same judge: every judgment from the cache
    assert ask("other-model") == 6  # another model's judgments are its own
    assert ask("judge-model", server=other) == 6  # another endpoint: asked again
    assert ask("judge-model", temperature=0.7) == 6  # other sampling settings
    monkeypatch.setitem(judge.INSTRUCTIONS, "helpfulness", judge.INSTRUCTIONS["helpfulness"] + " Be strict.")
    assert ask("judge-model") == 6  # reworded instructions: nothing reused
    monkeypatch.setattr(judge, "TEMPLATE", judge.TEMPLATE.replace("First explain", "Briefly explain"))
    assert ask("judge-model") == 6  # an edited prompt template: nothing reused


@pytest.mark.parametrize("text", [
    "Authorization: Bearer sk-abcdefghijklmnop",
    '{"headers": {"authorization": "Bearer abc.def"}}',
    "api_key=abcd1234efgh",
    "the key sk-proj-abcdefghijkl1234 leaked",
    f"echo {KEY}",
])
def test_keys_and_auth_headers_are_redacted(text):
    clean = judge.redact(text, (KEY,))
    assert "[redacted]" in clean
    for secret in ("sk-abcdefghijklmnop", "abc.def", "abcd1234efgh", "sk-proj-abcdefghijkl1234", KEY):
        assert secret not in clean


def test_a_key_echoed_in_a_reply_is_not_stored_in_the_cache(tmp_path, serve):
    import sqlite3

    endpoint = serve([_completion(f"Your key {KEY} works. Rating: 6")] * 6)
    _responses(tmp_path)
    proc = judge_cli(tmp_path, endpoint, tmp_path / "j.parquet")
    assert proc.returncode == 0, proc.stderr
    replies = [r for (r,) in sqlite3.connect(tmp_path / "cache.sqlite").execute("SELECT reply FROM judgments")]
    assert len(replies) == 6 and all("[redacted]" in r and KEY not in r for r in replies)


def test_credentials_in_urls_are_redacted_and_the_rest_kept():
    clean = judge.redact("POST https://bob:hunter2@api.example.com/v1?api-key=SEKRET1&api-version=2024 failed; "
                         "see http://h/x?access_token=TOK2&sig=SIG3#frag")
    for secret in ("bob", "hunter2", "SEKRET1", "TOK2", "SIG3"):
        assert secret not in clean
    assert "api.example.com/v1" in clean and "api-version=2024" in clean and "#frag" in clean


@pytest.mark.parametrize("url", ["https://bob:hunter2@api.example.com/v1", "https://api.example.com/v1?api-key=hunter2",
                                 "https://api.example.com/v1?x=1&access_token=hunter2"])
def test_a_base_url_with_credentials_is_refused_and_never_repeated(tmp_path, serve, url):
    endpoint = serve()
    _responses(tmp_path)
    endpoint.url = url
    proc = judge_cli(tmp_path, endpoint, tmp_path / "j.parquet")
    assert proc.returncode == 2 and endpoint.requests == 0
    assert "evaluation.judge.base_url: the URL carries credentials" in proc.stderr and "api_key_env" in proc.stderr
    assert "hunter2" not in proc.stderr + proc.stdout and not (tmp_path / "j.parquet").exists()


def test_aggregate_refuses_ratings_rated_twice_or_of_responses_it_did_not_score(tmp_path):
    import pandas as pd

    from lara import identity
    from lara.evaluate.aggregate import check_judged, check_judged_responses
    from lara.read.files import DataError, write_table

    scores = pd.DataFrame({"prompt_id": ["a", "b"], "method": "bon", "setting": "zero"})
    judge = scores.assign(judge_helpfulness=[7.0, 8.0])
    check_judged(judge, scores, ["j.parquet"])
    with pytest.raises(DataError, match="is rated 2 times"):
        check_judged(pd.concat([judge, judge.iloc[:1]]), scores, ["j.parquet"])
    with pytest.raises(DataError, match="not among --scores"):
        check_judged(judge.assign(setting="star"), scores, ["j.parquet"])
    # the evaluation and the judge name the responses they read: ratings of another run's responses are refused
    for name, text in (("mine.parquet", "x"), ("theirs.parquet", "y")):
        pd.DataFrame({"prompt_id": ["a"], "response": [text]}).to_parquet(tmp_path / name)
    evaluated, judged = tmp_path / "eval.parquet", tmp_path / "judge.parquet"
    write_table(scores, evaluated, {identity.KEY: identity.stamp(
        "evaluation", evaluated, made_from={"--responses": tmp_path / "mine.parquet"})})
    write_table(judge, judged, {identity.KEY: identity.stamp(
        "judged", judged, made_from={"--responses": tmp_path / "mine.parquet"})})
    check_judged_responses([judged], [evaluated])
    write_table(judge, judged, {identity.KEY: identity.stamp(
        "judged", judged, made_from={"--responses": tmp_path / "theirs.parquet"})})
    with pytest.raises(DataError, match="rated other responses"):
        check_judged_responses([judged], [evaluated])
