"""Scorer specs as the configuration writes them, judged without loading a model: the named scorers (entry points
of ``lara.scorers``) and what a spec may say to one (:func:`spec_problem`). :mod:`lara.scoring` loads them;
:mod:`lara.config.plan` checks every spec of a configuration with this module alone (no model library imported)."""

from __future__ import annotations

from pathlib import Path

SCORER_ENTRY_POINTS = "lara.scorers"  # the entry-point group of named scorers (pyproject.toml)


def named_scorers() -> dict:
    """Scorers registered by name under the ``lara.scorers`` entry-point group (``name = "module:factory"``
    in a package's metadata, e.g. the toy world's ``oracle``); a factory takes ``role`` and keyword options, and
    one that declares an ``argument`` parameter also takes the part of a spec ``name:argument`` after the colon
    (``fluency:results/real-text/import/smollm2-135m-instruct``, ``hatesonar:offensive``)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=SCORER_ENTRY_POINTS)}


WORKFLOW_SPECS = ("reward", "cost")  # the experiment's own trained models (a constraint's cost or reward)


def spec_problem(spec: str, role: str) -> str | None:
    """What :func:`load_scorer` would refuse about a scorer spec given ``role``, decided without loading a model: a
    named scorer given a role it does not have (its factory's ``check``), an argument it does not take or lacks,
    or a bare word that is no named scorer (a typo: the closest name is suggested). None: nothing to say (model
    folders and hub ids are checked as references)."""
    import difflib

    if spec in WORKFLOW_SPECS or spec.startswith("category:"):
        return None
    named = named_scorers()
    name, colon, argument = spec.partition(":")
    if name in named:
        factory = named[name].load()
        if colon and argument_problem(factory, name, argument):
            return argument_problem(factory, name, argument)
        check = getattr(factory, "check", None)
        return check(role, argument if colon else None) if check else None
    if "/" not in spec and not Path(spec).exists():
        close = difflib.get_close_matches(name, list(named), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        return (f"not a model directory, not a hub id (owner/name), and not a named scorer (named: "
                f"{', '.join(sorted(named)) or 'none installed'}){hint}")
    return None


def argument_problem(factory, name: str, argument: str) -> str | None:
    """Why the named scorer ``name`` (its ``factory``) cannot take the spec ``name:argument``: a factory without an
    ``argument`` parameter (which would ignore it), or nothing after the colon. None: it can."""
    import inspect

    takes = inspect.signature(factory).parameters.get("argument")
    if takes is None or takes.kind not in (takes.POSITIONAL_OR_KEYWORD, takes.KEYWORD_ONLY):
        return f"the named scorer {name!r} takes no argument (spec: {name})"
    return None if argument else f"nothing after '{name}:' (spec: {name}:ARGUMENT)"


def _score_of(spec: str, role: str, named) -> tuple[str, str | None]:
    """Which score a spec gives a role: a named scorer's (its name, and its argument where it takes one that names
    the score, else the role), or a model's (the spec; a model gives one score whatever the role)."""
    name, colon, argument = spec.partition(":")
    if name in named:
        return name, argument if colon else role
    return spec, None


def judge_problem(judge: str, costs: dict[str, str], reward: str | None = None) -> str | None:
    """Why ``judge`` is no judge of the constraints ``costs`` (name -> decoding cost spec, each given its name as the
    role): an empty spec, one of the experiment's own models (``reward``, ``cost``, ``category:<c>``: what decoders
    are held to), a score of the reward, or for some constraint the very score a constraint's decoding cost or the
    decoding reward gives (``hatesonar:hate`` beside ``{hate: hatesonar}``). None: a scorer the decoder never saw."""
    if not isinstance(judge, str) or not judge.strip():
        return "an empty scorer spec"
    if judge in WORKFLOW_SPECS or judge.startswith("category:"):
        return ("one of this experiment's own trained models, which the decoders are held to; a judge is a scorer "
                "the decoder never saw")
    named = named_scorers()
    held = {_score_of(spec, name, named): f"the decoding cost of constraint {name}" for name, spec in costs.items()}
    if reward is not None:
        held[_score_of(reward, "reward", named)] = "the decoding reward"
    for name in costs:
        score = _score_of(judge, name, named)
        if score[1] == "reward":
            return "it gives a reward, not a harm score: a judge scores what the constraints bound"
        if score in held or (score[1] is None and (judge, None) in held):
            return f"for constraint {name} it gives {held[score]} (the decoder was held to it)"
    return None
