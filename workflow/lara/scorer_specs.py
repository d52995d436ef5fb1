"""Scorer specs as the configuration writes them, judged without loading a model: the named scorers (entry points
of ``lara.scorers``) and what a spec may say to one (:func:`spec_problem`). :mod:`lara.scoring` loads them;
:mod:`lara.config_plan` checks every spec of a configuration with this module alone (no model library imported)."""

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
    import inspect

    if spec in WORKFLOW_SPECS or spec.startswith("category:"):
        return None
    named = named_scorers()
    name, colon, argument = spec.partition(":")
    if name in named:
        factory = named[name].load()
        if colon:
            takes = inspect.signature(factory).parameters.get("argument")
            if takes is None or takes.kind not in (takes.POSITIONAL_OR_KEYWORD, takes.KEYWORD_ONLY):
                return f"the named scorer {name!r} takes no argument (spec: {name})"
            if not argument:
                return f"nothing after '{name}:' (spec: {name}:ARGUMENT)"
        check = getattr(factory, "check", None)
        return check(role, argument if colon else None) if check else None
    if "/" not in spec and not Path(spec).exists():
        close = difflib.get_close_matches(name, list(named), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        return (f"not a model directory, not a hub id (owner/name), and not a named scorer (named: "
                f"{', '.join(sorted(named)) or 'none installed'}){hint}")
    return None
