"""A configuration is judged before any job runs (issue 49): every refusal a step's settings can raise is one of
the settings' cross-key rules (or its schema), every rule is reached by :func:`lara.config.validate`, and
validate builds exactly the settings the plan hands the jobs.

* each rule (a settings class's :func:`lara.settings.cross_key` method or a :data:`lara.config.plan.PLAN_RULES`
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

from lara.config import ConfigError, load_schema, load_yaml, merge, settings_json, validate
from lara.config import plan as config_plan
from lara.config import runs as config_runs
from lara.config import table as config_table
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
    assert len(config_plan.settings_rules()) == len(SETTINGS_RULES) >= 20 and len(config_plan.PLAN_RULES) >= 20
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
    import torch
    from transformers import SchedulerType, get_scheduler

    from lara.evaluate.figures.common import SEABORN_PALETTES
    from lara.toy.world import HARM_CATEGORIES
    from lara.train.ppo_lag import SCHEDULERS

    assert set(SCHEDULERS) <= {s.value for s in SchedulerType}
    for name in SCHEDULERS:  # each builds from warm-up and total steps alone, and steps, as the trainer uses it
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        sched = get_scheduler(name, opt, num_warmup_steps=1, num_training_steps=4)
        opt.step()
        sched.step()
    assert set(config_plan.TOY_CATEGORIES) == set(HARM_CATEGORIES)
    import seaborn

    assert set(SEABORN_PALETTES) == set(seaborn.palettes.SEABORN_PALETTES)


def test_the_training_rules_are_the_rules_that_launch_a_step():
    from lara.config import TRAINING_RULES

    text = "\n".join(p.read_text() for p in (REPO / "rules").glob("*.smk"))
    assert set(TRAINING_RULES) == set(__import__("re").findall(r'launcher\("([a-z_]+)"\)', text))


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
            if word in ("--settings", "--calibration") and words[i + 1].startswith("{"):
                found.add(json.dumps(json.loads(words[i + 1]), sort_keys=True))
    return found


def _validated_settings(overlay: str | None) -> set[str]:
    config = validate(merge(copy.deepcopy(TOY), {} if overlay is None else __import__("yaml").safe_load(overlay)))
    schema = load_schema()
    out = {json.dumps(json.loads(settings_json(config, name, schema, **derived)), sort_keys=True)
           for name, derived in config_runs.settings_runs(config)}
    out |= {json.dumps(v, sort_keys=True) for v in config_runs.variant_runs(config, schema)}
    return out


@pytest.mark.parametrize("overlay", [None, VARIANT], ids=["toy", "variant"])
def test_validate_builds_every_settings_a_job_is_given(dry_workflow, tmp_path, overlay):
    planned = _planned_settings(dry_workflow, tmp_path, overlay)
    built = _validated_settings(overlay)
    assert len(planned) > 30
    missing = sorted(planned - built)
    assert missing == [], "\n".join(missing[:5])


def test_docs_hold_the_current_table_of_rules():
    """docs/faults.md prints every rule with its witness and message (`python -m lara.config.table`)."""
    import os

    here = os.getcwd()
    try:
        os.chdir(REPO)
        table = config_table.rules_markdown()
    finally:
        os.chdir(here)
    assert table in (REPO / "docs" / "faults.md").read_text(), "regenerate: python -m lara.config.table"


# ---------------------------------------------------------------------------------------------
# messages that name the problem (through the real command: lara validate-config)


def _overlay(text):
    def make(t):
        (t / "o.yaml").write_text(text)
    return make


MESSAGES = [
    ("a Cyrillic lookalike key", "саlibration:\n  tau: 0.3\n",
     ["unknown key 'саlibration' (set in", "'с' (U+0441 CYRILLIC SMALL LETTER ES) at position 0", "write calibration"]),
    ("a key with a trailing space", 'calibration:\n  "tau ": 0.3\n',
     ["unknown key calibration.'tau '", "' ' (U+0020 SPACE) at position 3: write tau"]),
    ("a typo in a key", "calibration:\n  quantil: 0.9\n",
     ["unknown key calibration.quantil", "did you mean quantile?"]),
    ("a scenario named no (YAML 1.1)", "deployment:\n  scenarios: [{name: no}]\n",
     ["deployment.scenarios.0.name: false is a boolean, expected a string: YAML 1.1 reads an unquoted no/off/false",
      "quote it ('no')"]),
    ("a share outside [0, 1]", "deployment:\n  scenarios: [{name: a, harmful_share: 1.5}]\n",
     ["deployment.scenarios.0.harmful_share: 1.5 is greater than the maximum of 1"]),
    ("a drift of three values", "deployment:\n  scenarios: [{name: a, held_out_share: [0.1, 0.2, 0.3]}]\n",
     ["held_out_share: [0.1, 0.2, 0.3] has 3 value(s); this key takes exactly 2"]),
    ("a drift end outside [0, 1]", "deployment:\n  scenarios: [{name: a, held_out_share: [0.1, 1.3]}]\n",
     ["held_out_share: item [1]: 1.3 is greater than the maximum of 1"]),
    ("a quoted share", "deployment:\n  scenarios: [{name: a, held_out_share: '0.3'}]\n",
     ["held_out_share: '0.3' is a string, not a number: a quoted number is text in YAML; write 0.3 unquoted"]),
    ("a share written yes", "deployment:\n  scenarios: [{name: a, harmful_share: yes}]\n",
     ["harmful_share: true is a boolean, expected null, a number or a list of 2 values"]),
    ("a step size left empty", "deployment:\n  step_size:\n",
     ["deployment.step_size: no value (null: the key is written with nothing after it, or ~), expected a number or a "
      "list"]),
    ("a scenario name in capitals", "deployment:\n  scenarios: [{name: Heavy}]\n",
     ["'Heavy' is not a name of lower-case letters, digits and _ that starts with a letter"]),
    ("a named scorer misspelt", "evaluation:\n  cost_model: oracel\n",
     ["evaluation.cost_model: 'oracel': not a model directory, not a hub id (owner/name), and not a named scorer",
      "did you mean oracle?"]),
    ("a named scorer given an argument it does not take", "evaluation:\n  reward_model: 'profanity:x'\n",
     ["evaluation.reward_model: 'profanity:x': the named scorer 'profanity' takes no argument"]),
    ("the oracle given a score it does not have", "evaluation:\n  reward_model: 'oracle:x'\n",
     ["evaluation.reward_model: 'oracle:x': the oracle scorer's role is reward, cost or a harm category"]),
    ("hatesonar given a class it does not have", "calibration:\n  constraints:\n"
     "    - {name: hate, cost: 'hatesonar:slur', tau: 0.1, evaluation: hatesonar}\n",
     ["calibration.constraints.hate.cost: 'hatesonar:slur': hatesonar scorer: role 'slur' is not one of hate, "
      "offensive"]),
    ("fluency as a cost", "calibration:\n  constraints:\n"
     "    - {name: hate, cost: 'fluency:results/tiny/models/sft', tau: 0.1, evaluation: hatesonar}\n",
     ["fluency scorer: role 'hate'; fluency is a reward"]),
    ("a constraint's cost model folder that is not there", "calibration:\n  constraints:\n"
     "    - {name: violence, cost: ./models/nowhere, tau: -4.0}\n",
     ["calibration.constraints[0].cost: './models/nowhere' looks like a local model path, and there is nothing there"]),
    ("a paper config with the toy deployment pool", "experiment: paperdep\nextends: {paper}\n"
     "deployment:\n  scenarios: [{name: heavy, harmful_share: 0.9}]\n",
     ["deployment.prompts.source: toy (the default) draws the streams from the toy world's deployment pool, but this "
      "experiment's prompts are not the toy world's"]),
    ("a real-text overlay adding a constraint without evaluation", "experiment: rt2\nextends: {toy}\n"
     "base_model: {name_or_path: HuggingFaceTB/SmolLM2-135M-Instruct}\n"
     "data:\n  prompts: {source: lab/real-prompts}\n"
     "calibration:\n  constraints:\n    - {name: hate, cost: hatesonar, tau: 0.04}\n",
     ["calibration.constraints.hate.evaluation: 'oracle' is the toy world's oracle, but neither the prompts",
      "(a constraint without `evaluation` is audited with evaluation.cost_model)"]),
]


@pytest.mark.parametrize(("name", "text", "says"), MESSAGES, ids=[m[0] for m in MESSAGES])
def test_a_message_names_the_problem(name, text, says, tmp_path):
    from ..conftest import lara_in_process

    text = text.replace("{paper}", str(REPO / "config" / "paper-llama.yaml")).replace(
        "{toy}", str(REPO / "config" / "config.yaml")).replace(
        "{realtext}", str(REPO / "config" / "real-text.yaml"))
    (tmp_path / "o.yaml").write_text(text)
    rc, _, err = lara_in_process(["validate-config", "--quiet", str(REPO / "config" / "config.yaml"),
                                  str(tmp_path / "o.yaml")], cwd=REPO)
    assert rc == 2, err
    for part in says:
        assert part in err, (part, err)
    assert "Traceback" not in err


def test_a_config_value_given_on_the_command_line_is_blamed_on_it(tmp_path):
    from ..conftest import lara_in_process

    rc, _, err = lara_in_process(["validate-config", "--quiet", str(REPO / "config" / "config.yaml"), "--config",
                                  'calibration={"tau": "x"}'], cwd=REPO)
    assert rc == 2 and "calibration.tau: 'x' (str) is none of the forms this key takes" in err
    assert "(set in --config)" in err and ", --config: invalid configuration" in err


def test_the_fetch_step_lists_every_hub_reference():
    """A hub dataset as the deployment pool and a hub model as a constraint's scorer are fetched like the rest."""
    from lara import hub
    from lara.config import named_scorer_names

    config = validate(merge(copy.deepcopy(TOY), {
        "deployment": {"prompts": {"source": "lab/deploy-prompts", "revision": "v2"}},
        "calibration": {"constraints": [
            {"name": "violence", "cost": "lab/violence-scorer", "tau": -4.0, "evaluation": "oracle"},
            {"name": "crime", "cost": "category:crime", "tau": -4.5, "bounds": [-5.5, 5.5]}]}}))
    refs = {r.key: r for r in hub.references(config, REPO, scorers=named_scorer_names())}
    assert refs["deployment.prompts.source"].repo_type == "dataset"
    assert refs["deployment.prompts.source"].revision == "v2"
    assert refs["calibration.constraints[0].cost"].repo_id == "lab/violence-scorer"
