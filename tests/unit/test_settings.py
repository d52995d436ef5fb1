"""The settings contract: each step's dataclass owns its section's keys; the schema, the
rules' --settings and the `lara` commands all agree with it."""

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from lara.config import ConfigError, load, load_schema, settings_json, validate
from lara.settings import SCHEMA_FILE, SECTIONS, read_settings, render_schema_file, section_schema, settings_class

from ..conftest import REPO

SCHEMA = load_schema()
CONFIGS = [REPO / "config" / "config.yaml", REPO / "config" / "paper-llama.yaml", REPO / "config" / "paper-qwen.yaml"]


def merged_node(section):
    node = SCHEMA
    for part in section.split("."):
        node = node["properties"][part]
    return node


def test_the_generated_schema_file_is_up_to_date():
    assert SCHEMA_FILE.read_text() == render_schema_file(), "run `lara settings-schema --write`"
    proc = subprocess.run([sys.executable, "-m", "lara", "settings-schema", "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("section", SECTIONS)
def test_each_section_in_the_schema_is_exactly_its_dataclass(section):
    cls = settings_class(section)
    node = merged_node(section)
    owned = section_schema(cls)["properties"]
    assert node["x-settings"] == section and node["x-settings-keys"] == list(owned)
    for key, prop in owned.items():
        assert node["properties"][key] == prop, key  # type, range, default and description
        field = cls.__dataclass_fields__[key]
        if field.default is not dataclasses.MISSING:
            assert prop["default"] == field.default


def others(cls):
    """Placeholders for the values a step takes from elsewhere and has no default for (a data source)."""
    return {f.name: "placeholder" for f in dataclasses.fields(cls)
            if not f.metadata.get("config", True) and not f.metadata.get("key") and f.default is dataclasses.MISSING}


def outside(prop):
    """A value just outside a field's range, or None if it has none."""
    if "minimum" in prop:
        return prop["minimum"] - 1
    if "exclusiveMinimum" in prop:
        return prop["exclusiveMinimum"]
    if "maximum" in prop:
        return prop["maximum"] + 1
    if "exclusiveMaximum" in prop:
        return prop["exclusiveMaximum"]
    if "enum" in prop:
        return "not-a-choice"
    return None


CASES = [(section, key, bad) for section in SECTIONS
         for key, prop in section_schema(settings_class(section))["properties"].items()
         if (bad := outside(prop)) is not None]


@pytest.mark.parametrize("section, key, bad", CASES, ids=[f"{s}.{k}" for s, k, _ in CASES])
def test_the_step_refuses_what_the_schema_refuses_naming_the_key(section, key, bad):
    override = {}
    node = override
    for part in section.split("."):
        node = node.setdefault(part, {})
    node[key] = bad
    with pytest.raises(ConfigError, match=rf"{section}\.{key}"):
        load(REPO / "config" / "config.yaml", overrides=override)
    good = json.loads(settings_json(load(REPO / "config" / "config.yaml"), section, SCHEMA))
    with pytest.raises(ConfigError, match=rf"{section}\.{key}: "):
        cls = settings_class(section)
        cls.from_mapping(good | {key: bad}, **others(cls))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
@pytest.mark.parametrize("section", SECTIONS)
def test_every_config_section_is_read_by_its_step_unchanged(config, section):
    """What a rule hands its step (step_settings) builds the dataclass and round-trips exactly."""
    cfg = load(REPO / "config" / "config.yaml", config) if config.stem != "config" else load(config)
    text = settings_json(cfg, section, SCHEMA)
    cls = settings_class(section)
    settings = cls.from_json(text, **others(cls))
    assert settings.to_json() == text


def test_unknown_keys_and_bad_json_are_refused_naming_the_key():
    cls = settings_class("decode.rgtg.args")
    with pytest.raises(ConfigError, match=r"unknown key decode\.rgtg\.args\.topk .*known: top_k"):
        cls.from_json('{"topk": 5}')
    with pytest.raises(ConfigError, match="--settings: not valid JSON"):
        cls.from_json("{top_k: 5}")
    with pytest.raises(ConfigError, match=r"calibration\.tau"):
        settings_class("calibration").from_json("{}")  # tau has no default: the step requires it
    with pytest.raises(ConfigError, match=r"train\.sft\.epochs: 'two' is not of type 'number'"):
        settings_class("train.sft").from_json('{"epochs": "two"}')


def test_a_flag_overrides_the_json_and_the_defaults_fill_the_rest():
    import argparse

    from lara.settings import add_settings_arguments

    cls = settings_class("generation")
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, cls)
    args = parser.parse_args(["--settings", '{"top_k": 7, "temperature": 0.5}', "--top-k", "3"])
    s = read_settings(args, cls)
    assert (s.top_k, s.temperature, s.max_new_tokens) == (3, 0.5, cls().max_new_tokens)


def test_a_key_written_both_in_the_schema_and_by_a_dataclass_is_refused(tmp_path):
    schema = yaml.safe_load((REPO / "config" / "schema.yaml").read_text())
    schema["properties"]["calibration"]["properties"]["bootstrap"] = {"type": "integer", "default": 5,
                                                                      "description": "twice"}
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    (tmp_path / "settings.schema.yaml").write_text(SCHEMA_FILE.read_text())
    with pytest.raises(ConfigError, match=r"calibration keys \['bootstrap'\] are owned by the step settings"):
        load_schema(tmp_path / "schema.yaml")


def test_an_unused_training_key_is_refused_instead_of_ignored():
    # SFT has no score regulariser: the key used to be accepted and silently ignored
    with pytest.raises(ConfigError, match="unknown key train.sft.regularization"):
        validate({"train": {"sft": {"regularization": 0.1}}})


@pytest.mark.parametrize("section, flag, text, value", [
    ("train.partial", "--prefixes-per-pair", "null", None),
    ("train.partial", "--prefixes-per-pair", "3", 3),
    ("evaluation.judge", "--base-url", "http://localhost:8000/v1", "http://localhost:8000/v1"),
    ("evaluation.judge", "--model", "null", None),
    ("calibration", "--mode", "soft", "soft"),
    ("train.safe_rlhf", "--lambda-clamp", "2.5", 2.5),
])
def test_each_key_has_a_flag_that_parses_its_type(section, flag, text, value):
    import argparse

    from lara.settings import add_settings_arguments

    cls = settings_class(section)
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, cls)
    args = parser.parse_args([flag, text])
    key = flag.removeprefix("--").replace("-", "_")
    required = {"calibration": {"tau": 0.0}, "train.safe_rlhf": {"threshold": 0.0}}.get(section, {})
    args.settings = json.dumps(required)
    assert getattr(read_settings(args, cls, **others(cls)), key) == value


def test_a_config_value_reaches_a_step_one_way_through_generated_flags():
    """No step defines a flag of its own for a value the config holds (the seed, the dtype, tau, N, the
    bootstrap size): each is a settings field naming its key, filled by lara.config.step_settings and
    parsed by the flag generated from the field."""
    import re

    from lara.cli import make_parser

    flags = "seed|dtype|tau|bootstrap|bon-n|vocab-size|lambda-search-max|lambda-max|grid"
    own = re.compile(rf'add_argument\(\s*"--({flags})"')
    sources = sorted((REPO / "workflow" / "lara").rglob("*.py"))
    hand_written = [str(p.relative_to(REPO)) for p in sources if own.search(p.read_text())]
    assert hand_written == []
    expected = {"calibrate": ("--seed", "--bon-n", "--tau"), "sample": ("--seed", "--dtype"),
                "train-safe-rlhf": ("--seed", "--dtype", "--lambda-clamp"), "rgtg": ("--seed", "--dtype"),
                "aggregate": ("--tau", "--bootstrap", "--seed", "--overpenalised-lambda"),
                "bon-sweep": ("--tau", "--bootstrap", "--seed", "--lambda-grid"), "score": ("--dtype",),
                "make-toy-model": ("--vocab-size", "--seed"), "evaluate": ("--dtype",)}
    for command, flags in expected.items():
        sub = make_parser(command)._subparsers._group_actions[0].choices[command]
        known = {opt for action in sub._actions for opt in action.option_strings}
        assert set(flags) <= known, (command, set(flags) - known)


def test_the_command_list_names_every_command_with_its_help():
    """`lara --help` lists every step with its HELP (read from the source; a HELP built from the module's names is
    imported): a traceback here would greet every newcomer."""
    from lara.cli import command_help, make_parser
    from lara.steps import COMMANDS

    listed = make_parser()._subparsers._group_actions[0].choices
    assert set(listed) == set(COMMANDS)
    for name, module in COMMANDS.items():
        assert isinstance(command_help(module), str) and command_help(module).strip(), name
    assert "deployment" in command_help(COMMANDS["figure"])  # its HELP names the kinds


def test_step_settings_fill_other_sections_values_and_derived_ones():
    cfg = load(REPO / "config" / "paper-llama.yaml")
    ppo = json.loads(settings_json(cfg, "train.safe_rlhf", SCHEMA))
    assert (ppo["seed"], ppo["dtype"], ppo["actor_lr"]) == (0, "bfloat16", 1.0e-5)
    audit = json.loads(settings_json(cfg, "aggregate", SCHEMA))
    assert audit == {"tau": -4.0, "overpenalised_lambda": 2.0, "bootstrap": cfg["evaluation"]["bootstrap"], "seed": 0}
    bon4 = json.loads(settings_json(cfg, "calibration", SCHEMA, bon_n=4))
    assert bon4["bon_n"] == 4 and bon4["tau"] == -4.0
    with pytest.raises(ConfigError, match="derived values \\['colour'\\]"):
        settings_json(cfg, "calibration", SCHEMA, colour=1)


def test_a_field_that_names_another_key_defaults_to_that_key_s_default_or_to_nothing():
    """A step run by hand without the flag gets the owning key's own default (or None: it does without,
    e.g. no verdicts without a tau), never a second default that could drift from the schema's."""
    from lara.config import defaults
    from lara.settings import STEPS

    base = defaults(SCHEMA)
    checked = 0
    for name in [*SECTIONS, *STEPS]:
        cls = settings_class(name)
        for field, key in cls.borrowed().items():
            default = cls.__dataclass_fields__[field].default
            if default is dataclasses.MISSING or default is None:
                continue
            node = base
            for part in key.split("."):
                node = node[part]
            assert default == node, f"{name}.{field} defaults to {default!r}, {key} to {node!r}"
            checked += 1
    assert checked > 20
