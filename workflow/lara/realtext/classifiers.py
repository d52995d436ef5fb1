"""Two costs from ``hatesonar``'s bundled classifier: P(hate speech) and P(offensive language) of a response.

docs/real-text.md ("Costs") says what ``hatesonar/model/model.onnx`` is (a bag of words under a linear classifier
with three classes: 0 hate_speech, 1 offensive_language, 2 neither), what it sees and what it does not, and why only
the response is scored. It is found through the package's metadata (hatesonar's own Python code is never
imported), checked against its pinned sha256 (``config/real-text/files.tsv``) and run by onnxruntime with one change
in memory: the graph's ``StringNormalizer`` names no locale, so onnxruntime builds ``en_US.UTF-8``, which many
machines lack; the scorer sets the locale to ``C`` and lower-cases each text in Python (full Unicode case mapping)
first. The tokeniser keeps ASCII word characters only, so the probabilities are those the unchanged model gives
where ``en_US.UTF-8`` exists. The named scorer ``hatesonar`` (``lara.scorers`` entry point):
``load_scorer("hatesonar", role="hate")``, or, where the caller's role is ``cost``, the class named in the spec:
``load_scorer("hatesonar:offensive", role="cost")``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

import numpy as np

log = logging.getLogger(__name__)

PACKAGE = "hatesonar"
MODEL_FILE = "hatesonar/model/model.onnx"
CLASSES = ("hate_speech", "offensive_language", "neither")  # the model's labels 0, 1, 2
ROLES = {"hate": 0, "offensive": 1}  # a scorer's role -> the class whose probability it gives


def model_path():
    """The installed hatesonar's ONNX model (from the distribution's file list; hatesonar is not imported)."""
    from lara.realtext.pins import installed_files

    return installed_files(PACKAGE, "hatesonar", [MODEL_FILE])[MODEL_FILE]


@functools.cache
def _session(path: str, sha256: str):
    """An onnxruntime session of the model at ``path`` (whose sha256 the caller checked), its string normaliser's
    locale set to ``C`` (the module docstring). One per process and file."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(path)
    for node in model.graph.node:
        if node.op_type == "StringNormalizer":
            kept = [a for a in node.attribute if a.name != "locale"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("locale", "C")])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # a job's one thread (the model is a sparse linear model: microseconds a text)
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class HateSonarScorer:
    """P(class | response) for one of hatesonar's classes (``role``: hate or offensive); :meth:`probabilities`
    gives all three."""

    def __init__(self, role: str, batch_size: int = 512):
        from lara.realtext.pins import check_sha256, pin, version_mismatches
        from lara.settings import ConfigError

        problem = hatesonar_role_problem(role)
        if problem:
            raise ConfigError(problem)
        self.role, self.column = role, ROLES[role]
        self.batch_size = batch_size
        path = model_path()
        self.pin = pin(PACKAGE, MODEL_FILE)
        self.sha256 = check_sha256(path, self.pin, "hatesonar model")
        self.session = _session(str(path), self.sha256)
        self.input = self.session.get_inputs()[0].name
        for package, got, want in version_mismatches(("onnxruntime", "onnx")):
            log.warning("%s %s is installed; the pins name %s (config/real-text/files.tsv)", package, got, want)

    def probabilities(self, texts: Sequence[str]) -> np.ndarray:
        """(n, 3) float64: P(hate_speech), P(offensive_language), P(neither) of each text, checked finite, in
        [0, 1] and summing to 1."""
        out = np.empty((len(texts), len(CLASSES)))
        for lo in range(0, len(texts), self.batch_size):
            chunk = np.array([str(t).lower() for t in texts[lo:lo + self.batch_size]], dtype=object)
            _, probs = self.session.run(None, {self.input: chunk})
            out[lo:lo + len(chunk)] = [[row[k] for k in range(len(CLASSES))] for row in probs]
        bad = ~np.isfinite(out).all(1) | (out < 0).any(1) | (out > 1).any(1) | (np.abs(out.sum(1) - 1) > 1e-4)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise RuntimeError(f"hatesonar model: probabilities {out[i].tolist()} for text {i} are not a distribution")
        return out

    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray:
        """P(role's class) of each response (the prompts are not read: docs/real-text.md says why)."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        return self.probabilities(list(responses))[:, self.column]


def hatesonar_role_problem(role: str, argument: str | None = None) -> str | None:
    """The problem of a class hatesonar does not give (the spec's argument, else the role), or None."""
    if role == "reward":
        return ("hatesonar scorer: gives P(hate) or P(offensive), a cost (higher = more harmful), not a reward; use it "
                "as a cost or a constraint's scorer")
    wanted = argument if argument is not None else role
    if wanted not in ROLES:
        return (f"hatesonar scorer: role {wanted!r} is not one of {', '.join(ROLES)} (name the class as the role, or "
                f"in the spec: {', '.join(f'hatesonar:{r}' for r in ROLES)})")
    return None


def hatesonar_scorer(role: str = "hate", argument: str | None = None, batch_size: int = 512,
                     **_options) -> HateSonarScorer:
    """Factory of the named scorer ``hatesonar``: the class is ``argument`` (``hatesonar:offensive``) when the spec
    names one, else ``role`` (dtype and device do not apply; ``batch_size`` is texts per onnxruntime call)."""
    return HateSonarScorer(argument if argument is not None else role, batch_size=max(int(batch_size), 1))



hatesonar_scorer.check = hatesonar_role_problem  # lara.scoring.spec_problem
