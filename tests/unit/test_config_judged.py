"""A configuration is judged before any job runs (issue 49): every refusal a step's settings can raise is one of
the settings' cross-key rules (or its schema), every rule is reached by :func:`lara.config.validate`, and
validate builds exactly the settings the plan hands the jobs.

* each rule (a settings class's :func:`lara.settings.cross_key` method or a :data:`lara.config_plan.PLAN_RULES`
  entry) carries a witness, a config overlay on config/config.yaml that breaks it: validate refuses every witness
  with the rule's own message, and a settings rule's class refuses it too when built as a rule builds it;
* no settings class refuses anything on its own (no ``__post_init__`` but the base's, no ``raise`` in a method);
* a dry run's ``--settings`` of every job (the toy config, and one with several taus, a policy variant and
  another guarantee) are among the settings validate built.
"""

import ast
import copy
import json
import shlex
from pathlib import Path

import pytest

from lara import config_plan
from lara.config import ConfigError, load_schema, load_yaml, merge, settings_json, validate
from lara.settings import SECTIONS, STEPS, Settings, settings_class

from ..conftest import REPO, copy_workflow, run_snakemake

TOY = load_yaml(REPO / "config" / "config.yaml")


def settings_rules():
    out = {}
    for name in [*SECTIONS, *STEPS]:
        for rule in settings_class(name).cross_key_rules():
            out.setdefault(rule, []).append(name)
    return out


SETTINGS_RULES = settings_rules()


def _refusal(overlay) -> str:
    with pytest.raises(ConfigError) as info:
        validate(merge(copy.deepcopy(TOY), overlay))
    return str(info.value)


def test_the_toy_and_paper_configs_pass():
    validate(copy.deepcopy(TOY))
    for name in ("paper-llama.yaml", "paper-qwen.yaml"):
        validate(load_yaml(REPO / "config" / name))


@pytest.mark.parametrize("rule", list(SETTINGS_RULES), ids=lambda r: r.__qualname__)
def test_every_settings_rule_is_refused_by_validate_and_by_its_step(rule):
    spec = rule.cross_key
    said = _refusal(spec.witness)
    first = spec.keys[0]
    assert f"{first}: " in said or f"{first}." in said, said
    # the class itself refuses the same configuration when built as the rules build it (no derived values)
    schema = load_schema()
    config = validate(merge(copy.deepcopy(TOY), {}))
    broken = merge(config, spec.witness)
    for name in SETTINGS_RULES[rule]:
        cls = settings_class(name)
        given = {"source": "toy"} if "source" in cls.__dataclass_fields__ else {}
        with pytest.raises(ConfigError) as info:
            cls.from_mapping(json.loads(settings_json(broken, name, schema)), name, **given)
        assert info.value.args[0].removeprefix("invalid settings: ") in said, (name, str(info.value), said)


@pytest.mark.parametrize("rule", config_plan.PLAN_RULES, ids=lambda r: r.name)
def test_every_plan_rule_is_refused_by_validate(rule):
    said = _refusal(rule.witness)
    assert any(key in said for key in rule.keys), said
    problems = rule.check(validate_or_fill(rule.witness))
    assert problems and all(p in said for p in problems), (problems, said)


def validate_or_fill(overlay) -> dict:
    """The witness's configuration with defaults filled in (validate would refuse it)."""
    from lara.config import _fill

    schema = load_schema()
    return _fill(merge(copy.deepcopy(TOY), overlay), schema, schema)


def test_the_count_of_rules_validate_runs():
    count = config_plan.rule_count()
    assert count["settings"] == len(SETTINGS_RULES) >= 20 and count["plan"] == len(config_plan.PLAN_RULES) >= 20
    names = [r.name for r in config_plan.PLAN_RULES]
    assert len(names) == len(set(names))


def _settings_classes():
    """Every class in workflow/lara that derives (directly or not) from Settings, with its file's AST."""
    out = []
    for name in [*SECTIONS, *STEPS]:
        cls = settings_class(name)
        for klass in cls.__mro__:
            if klass is Settings or not issubclass(klass, Settings):
                continue
            out.append(klass)
    return set(out)


def test_no_settings_class_refuses_anything_of_its_own():
    """A settings class's only refusals are its schema and its cross-key rules: no ``__post_init__`` of its own,
    no ``raise`` in its methods (a rule returns its problem; Settings.__post_init__ raises)."""
    import inspect

    offenders = []
    for klass in _settings_classes():
        if "__post_init__" in vars(klass):
            offenders.append(f"{klass.__qualname__}.__post_init__")
        tree = ast.parse(inspect.getsource(klass))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise):
                offenders.append(f"{klass.__qualname__}: raise at line {node.lineno}")
    assert offenders == []


def test_the_static_facts_match_the_libraries():
    from transformers import SchedulerType

    from lara.evaluate.figures.common import SEABORN_PALETTES
    from lara.toy.world import HARM_CATEGORIES
    from lara.train.ppo_lag import SCHEDULERS

    assert set(SCHEDULERS) == {s.value for s in SchedulerType}
    assert set(config_plan.TOY_CATEGORIES) == set(HARM_CATEGORIES)
    import seaborn

    assert set(SEABORN_PALETTES) == set(seaborn.palettes.SEABORN_PALETTES)


def test_the_plan_model_folders_are_the_workflow_s():
    """A policy variant may not take a model folder's name: the names are the folders the rules write."""
    text = "\n".join(p.read_text() for p in (REPO / "rules").glob("*.smk"))
    for folder in config_plan.MODEL_FOLDERS:
        assert f"models/{folder}" in text or "models/{kind}" in text or folder.startswith(("partial_", "value_"))


# ---------------------------------------------------------------------------------------------
# validate builds the settings of every job a dry run plans


VARIANT = """\
calibration:
  tau: [-0.5, -0.3]
  guarantee: ltt
decode:
  policies: [sft, safe_rlhf, safedpo, dpo_fast]
  policy_variants:
    dpo_fast: {base: safedpo, train: {epochs: 1}, generation: {temperature: 0.7}}
deployment:
  step_size: [0.01, 0.05]
"""


@pytest.fixture(scope="module")
def dry_workflow(tmp_path_factory):
    return copy_workflow(tmp_path_factory.mktemp("judged") / "wf")


def _planned_settings(wf: Path, tmp_path: Path, overlay: str | None) -> set[str]:
    args = ["-n", "-p", "--nolock", "--forceall"]
    if overlay is not None:
        (tmp_path / "o.yaml").write_text(overlay)
        args += ["--configfile", str(tmp_path / "o.yaml")]
    proc = run_snakemake(wf, *args)
    found = set()
    for line in (proc.stdout + proc.stderr).splitlines():
        if "--settings" not in line:
            continue
        words = shlex.split(line)
        for i, word in enumerate(words[:-1]):
            if word in ("--settings", "--calibration"):
                if words[i + 1].startswith("{"):
                    found.add(json.dumps(json.loads(words[i + 1]), sort_keys=True))
    return found


def _validated_settings(overlay: str | None) -> set[str]:
    config = validate(merge(copy.deepcopy(TOY), {} if overlay is None else __import__("yaml").safe_load(overlay)))
    schema = load_schema()
    out = {json.dumps(json.loads(settings_json(config, name, schema, **derived)), sort_keys=True)
           for name, derived in config_plan.settings_runs(config)}
    out |= {json.dumps(v, sort_keys=True) for v in config_plan.variant_runs(config, schema)}
    return out


@pytest.mark.parametrize("overlay", [None, VARIANT], ids=["toy", "variant"])
def test_validate_builds_every_settings_a_job_is_given(dry_workflow, tmp_path, overlay):
    planned = _planned_settings(dry_workflow, tmp_path, overlay)
    built = _validated_settings(overlay)
    assert len(planned) > 30
    missing = sorted(planned - built)
    assert missing == [], "\n".join(missing[:5])
