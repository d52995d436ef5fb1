"""A judge the decoder never saw: P(profane) of a response from ``alt-profanity-check``'s bundled classifier
(docs/real-text.md, "A judge the decoder never saw": the model, its training data shared with hatesonar's, what
agreement between the two can say, and how it is read).

alt-profanity-check 1.9.1 ships two scikit-learn objects pickled with joblib (a TF-IDF vectorizer and a calibrated
linear classifier; classes 0 clean, 1 profane), found through the installed distribution's file list. Unpickling
runs code, so each file is read once as bytes and those bytes are checked against their pinned sha256
(``config/real-text/files.tsv``) each time a scorer is built, before they are unpickled; a scikit-learn or joblib
other than the pinned versions is refused (a pickle is vouched for only under the version that saved it). The score
is a cost: any role but ``reward`` is accepted; the spec takes no argument (``profanity``).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

PACKAGE = "alt-profanity-check"
VECTORIZER_FILE = "profanity_check/data/vectorizer.joblib"
MODEL_FILE = "profanity_check/data/model.joblib"
FILES = (VECTORIZER_FILE, MODEL_FILE)
RUNTIME = ("scikit-learn", "joblib")  # must be the pinned versions: they unpickle the two files
PROFANE = 1  # the model's class whose probability is the score
CHUNK = 4096  # texts per vectorizer call: bounds memory only (the scores of a text do not depend on its chunk)

_LOADED: dict[tuple[str, str], tuple] = {}  # (vectorizer sha256, model sha256) -> (vectorizer, model)


def data_files() -> dict[str, Path]:
    """The installed alt-profanity-check's two joblib files (``FILES`` -> path), from the distribution's file list."""
    from lara.realtext.pins import installed_files

    return installed_files(PACKAGE, "profanity", FILES)


def pinned_bytes(path: Path, name: str) -> tuple[bytes, str]:
    """The bytes of ``path`` and their sha256, refused (a ConfigError naming the file and both hashes) unless the
    sha256 is the pin of ``name``. What is hashed is what is later unpickled (one read)."""
    from lara.realtext.pins import check_sha256, pin

    data = Path(path).read_bytes()
    return data, check_sha256(path, pin(PACKAGE, name), "profanity judge", data, "; refused before unpickling it")


def check_runtime() -> None:
    """Refuse a scikit-learn or joblib other than the pinned one (the pickles' own versions)."""
    from lara.realtext.pins import pin, version_mismatches
    from lara.settings import ConfigError

    for package, got, want in version_mismatches(RUNTIME):  # the first is refused
        raise ConfigError(f"profanity judge: {package} {got} is installed, but {PACKAGE} {pin(PACKAGE).version}'s "
                          f"pickles need {package}=={want} (config/real-text/files.tsv; pyproject.toml pins it)")


def _unpickle(data: bytes, what: str):
    """One joblib pickle from pinned bytes; scikit-learn's warning of a version mismatch is an error here."""
    import warnings

    import joblib
    from sklearn.exceptions import InconsistentVersionWarning

    with warnings.catch_warnings():
        warnings.simplefilter("error", InconsistentVersionWarning)
        try:
            return joblib.load(io.BytesIO(data))
        except InconsistentVersionWarning as e:
            from lara.settings import ConfigError

            raise ConfigError(f"profanity judge {what}: {e}") from None


def _objects(vectorizer: tuple[bytes, str], model: tuple[bytes, str]):
    """The (vectorizer, model) of the pinned bytes, unpickled once per process and pair of hashes, and checked to
    be what the scorer calls."""
    key = (vectorizer[1], model[1])
    if key not in _LOADED:
        vec, clf = _unpickle(vectorizer[0], VECTORIZER_FILE), _unpickle(model[0], MODEL_FILE)
        if not hasattr(vec, "transform") or not hasattr(clf, "predict_proba"):
            raise RuntimeError(f"{PACKAGE}: {type(vec).__name__} / {type(clf).__name__} are not a vectorizer and a "
                               "probabilistic classifier")
        if list(getattr(clf, "classes_", [])) != [0, 1]:
            raise RuntimeError(f"{PACKAGE}: the model's classes are {list(getattr(clf, 'classes_', []))}, not [0, 1]")
        _LOADED[key] = (vec, clf)
    return _LOADED[key]


class ProfanityScorer:
    """P(profane | response) under alt-profanity-check's classifier, a cost-like judge (any role but reward)."""

    def __init__(self, role: str = "cost"):
        from lara.settings import ConfigError

        problem = profanity_role_problem(role)
        if problem:
            raise ConfigError(problem)
        self.role = role
        check_runtime()
        files = data_files()
        vectorizer = pinned_bytes(files[VECTORIZER_FILE], VECTORIZER_FILE)
        model = pinned_bytes(files[MODEL_FILE], MODEL_FILE)
        self.paths = files
        self.sha256 = {VECTORIZER_FILE: vectorizer[1], MODEL_FILE: model[1]}
        self.vectorizer, self.model = _objects(vectorizer, model)
        self.column = list(self.model.classes_).index(PROFANE)

    def probabilities(self, texts: Sequence[str]) -> np.ndarray:
        """(n,) float64 P(profane) of each text, checked finite and in [0, 1]."""
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"profanity judge: text {i} is a {type(t).__name__}, not a string")
        out = np.empty(len(texts), dtype=np.float64)
        for lo in range(0, len(texts), CHUNK):
            chunk = list(texts[lo:lo + CHUNK])
            out[lo:lo + len(chunk)] = self.model.predict_proba(self.vectorizer.transform(chunk))[:, self.column]
        bad = ~np.isfinite(out) | (out < 0) | (out > 1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise RuntimeError(f"profanity judge: P(profane) {out[i]!r} for text {i} is not a probability")
        return out

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        """P(profane) of each response (the prompts are not read)."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        return self.probabilities(list(responses))


def profanity_role_problem(role: str, argument: str | None = None) -> str | None:
    """Why the profanity judge cannot play ``role`` (a reward; an argument it does not take), or None."""
    if argument is not None:
        return f"profanity scorer: takes no argument (spec: profanity, not profanity:{argument})"
    if role == "reward":
        return ("profanity scorer: gives P(profane), a cost (higher = more profane), not a reward; use it as a cost, "
                "a constraint's scorer or a judge")
    if not isinstance(role, str) or not role:
        return f"profanity scorer: role {role!r} is not a name (cost, or the constraint's name)"
    return None


def profanity_scorer(role: str = "cost", **_options) -> ProfanityScorer:
    """Factory of the named scorer ``profanity`` (``load_scorer("profanity", role="cost")``). ``batch_size``, dtype
    and device do not apply: a call scores all its texts, in chunks of ``CHUNK``."""
    return ProfanityScorer(role)


profanity_scorer.check = profanity_role_problem  # lara.scorer_specs.spec_problem
