"""The ``profanity`` judge (alt-profanity-check's classifier; docs/real-text.md): what it scores, the roles it
takes, and the pinned files it refuses to unpickle otherwise."""

import hashlib
import shutil

import numpy as np
import pytest

from lara.config import ConfigError

CLEAN = ["I had a lovely walk in the park with my family this morning.",
         "The meeting was moved to Thursday afternoon.",
         "Thank you for the detailed answer, it helped a lot."]
PROFANE = ["fuck you", "this is fucking bullshit", "shut up you stupid bitch"]


def test_profane_text_scores_above_clean_text_as_float64_probabilities():
    from lara.realtext.profanity import ProfanityScorer

    scorer = ProfanityScorer("cost")
    texts = CLEAN + PROFANE + [""]
    got = scorer.score(["a prompt"] * len(texts), texts)
    assert got.dtype == np.float64 and got.shape == (len(texts),)
    assert np.isfinite(got).all() and ((got >= 0) & (got <= 1)).all()
    assert got[3:6].min() > 0.5 > got[:3].max()  # the profane sentences are profane, the clean ones are not
    assert got[:3].max() < got[3:6].min()


def test_the_score_is_deterministic_and_the_response_alone_whatever_the_batch():
    from lara.realtext.profanity import ProfanityScorer

    texts = CLEAN + PROFANE + [""]
    one, other = ProfanityScorer("cost"), ProfanityScorer("hate")
    base = one.score([""] * 7, texts)
    assert np.array_equal(base, one.score([""] * 7, texts))  # the same call twice
    assert np.array_equal(base, other.score(PROFANE * 2 + ["x"], texts))  # another role, other prompts
    alone = np.concatenate([one.score([""], [t]) for t in texts])
    assert np.array_equal(base, alone)  # a text's score does not depend on the others in its call
    assert np.array_equal(one.score([""] * 7, [t.upper() for t in texts]), base)  # the vectorizer lower-cases
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        one.score(["a", "b"], ["c"])
    with pytest.raises(TypeError, match="text 1 is a NoneType, not a string"):
        one.score(["a", "b"], ["c", None])


def test_the_judge_is_a_cost_of_any_name_but_never_a_reward():
    from lara.realtext.profanity import profanity_scorer
    from lara.scorer_specs import named_scorers, spec_problem
    from lara.scoring import load_scorer

    assert named_scorers()["profanity"].value == "lara.realtext.profanity:profanity_scorer"
    for role in ("cost", "hate", "offensive"):
        assert spec_problem("profanity", role) is None
        assert load_scorer("profanity", role=role, batch_size=16, dtype="float32").role == role
    assert spec_problem("profanity:x", "cost") == "the named scorer 'profanity' takes no argument (spec: profanity)"
    reason = spec_problem("profanity", "reward")
    assert reason.startswith("profanity scorer: gives P(profane), a cost") and "\n" not in reason
    with pytest.raises(ConfigError, match=r"profanity scorer: gives P\(profane\), a cost .* not a reward"):
        load_scorer("profanity", role="reward")
    with pytest.raises(ConfigError, match="the named scorer 'profanity' takes no argument"):
        load_scorer("profanity:x", role="cost")
    assert profanity_scorer.check("cost", "x").startswith("profanity scorer: takes no argument")
    assert profanity_scorer.check("", None).startswith("profanity scorer: role '' is not a name")


@pytest.fixture
def copied_files(tmp_path, monkeypatch):
    """Copies of the installed joblib files, which the scorer then reads in place of the installed ones."""
    import lara.realtext.profanity as profanity

    copies = {}
    for name, path in profanity.data_files().items():
        copies[name] = tmp_path / name.replace("/", "_")
        shutil.copyfile(path, copies[name])
    monkeypatch.setattr(profanity, "data_files", lambda: dict(copies))
    return copies


def test_the_scorer_reads_the_files_the_lookup_gives_and_refuses_a_tampered_one(copied_files):
    import lara.realtext.profanity as profanity
    from lara.realtext.pins import pin

    texts = CLEAN + PROFANE
    installed = profanity.ProfanityScorer("cost")
    assert installed.paths == copied_files  # the copies, unchanged: accepted, the same scores
    assert np.array_equal(installed.score(texts, texts), installed.score([""] * 6, texts))
    for name in (profanity.MODEL_FILE, profanity.VECTORIZER_FILE):
        original = copied_files[name].read_bytes()
        tampered = bytearray(original)
        tampered[len(tampered) // 2] ^= 1  # one bit
        copied_files[name].write_bytes(bytes(tampered))
        got = hashlib.sha256(tampered).hexdigest()
        with pytest.raises(ConfigError) as refused:
            profanity.ProfanityScorer("cost")
        message = str(refused.value)
        assert str(copied_files[name]) in message and got in message and pin(profanity.PACKAGE, name).sha256 in message
        assert "refused before unpickling" in message
        copied_files[name].write_bytes(original)
    profanity.ProfanityScorer("cost")  # restored: accepted again


def test_the_pins_are_the_installed_files_and_another_runtime_is_refused(monkeypatch):
    import importlib.metadata

    import lara.realtext.profanity as profanity
    from lara.io import sha256_file
    from lara.realtext.pins import pin

    files = profanity.data_files()
    assert set(files) == {profanity.MODEL_FILE, profanity.VECTORIZER_FILE}
    for name, path in files.items():
        assert sha256_file(path) == pin(profanity.PACKAGE, name).sha256, name
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda p: "0.0" if p == "scikit-learn" else real(p))
    with pytest.raises(ConfigError, match=r"profanity judge: scikit-learn 0\.0 is installed, but alt-profanity-check "
                                          r"1\.9\.1's pickles need scikit-learn==1\.9\.1"):
        profanity.ProfanityScorer("cost")


def test_the_package_is_absent_or_incomplete(monkeypatch):
    import importlib.metadata

    import lara.realtext.profanity as profanity

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ConfigError, match=r"needs the alt-profanity-check package \(pip install "
                                          r"alt-profanity-check==1\.9\.1"):
        profanity.data_files()
