import json
import re

import pytest
import yaml

from lara.config import (
    ConfigError,
    command_line_values,
    explain,
    layers,
    load,
    load_schema,
    settings_json,
    validate,
)

from ..conftest import REPO

SCHEMA = load_schema()
PAPER = {"llama": REPO / "config/paper-llama.yaml", "qwen": REPO / "config/paper-qwen.yaml"}


def _resolve(node, schema):
    ref = node.get("$ref")
    if ref:
        target = schema
        for part in ref.lstrip("#/").split("/"):
            target = target[part]
        return {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _walk(node, schema, path=""):
    for key, sub in node.get("properties", {}).items():
        sub = _resolve(sub, schema)
        yield f"{path}{key}", sub
        yield from _walk(sub, schema, f"{path}{key}.")


def test_every_key_has_a_description_and_a_default_but_the_budget():
    keys = list(_walk(SCHEMA, SCHEMA))
    assert len(keys) > 60
    missing = [k for k, sub in keys if not sub.get("description") or "default" not in sub]
    # keys of $defs/resources are documented in the definition and defaulted through their parent
    missing = [k for k in missing if not k.startswith("resources.default.")]
    assert missing == ["calibration.tau"]  # required: every experiment states its budget


def test_no_section_carries_a_default_dict():
    """The toy world's values live in config/config.yaml only: a section's own default is {}, so every
    key a file does not set takes the one default of its own (a step setting or the schema's key)."""
    dicts = [(node.get("x-settings"), node.get("default")) for node in _nodes(SCHEMA)
             if "x-settings" in node and node.get("default") != {}]
    assert dicts == []
    with pytest.raises(ConfigError, match="calibration.tau: missing; every experiment states its cost budget"):
        validate({})  # the budget has no default


def _nodes(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _nodes(value)


def test_explain_names_where_every_value_comes_from():
    parts = layers(REPO / "config/config.yaml", PAPER["llama"])
    rows = {r["key"]: r for r in explain(load(REPO / "config/config.yaml", PAPER["llama"]), parts, SCHEMA)}
    assert rows["calibration.tau"]["value"] == -4.0 and rows["calibration.tau"]["origin"].endswith("paper-llama.yaml")
    actor = rows["train.safe_rlhf.actor_lr"]
    assert actor["value"] == 1.0e-5 and actor["origin"] == "step default (lara.train.ppo_lag:PPOLagSettings)"
    assert rows["base_model.dtype"]["origin"].endswith("paper-llama.yaml")
    assert rows["data.sft.data_dir"]["origin"] == "step default (lara.data.ingest:IngestSettings)"
    assert rows["evaluation.judge.max_tokens"]["origin"].startswith("step default")
    assert rows["figures.dpi"]["origin"].startswith("step default")
    assert not any(r["origin"].endswith("config/config.yaml") for r in rows.values())
    # every leaf of the resolved config appears exactly once
    assert len(rows) > 150 and "resources.rules.train_safe_rlhf.gpu" in rows


def test_a_whole_experiment_starts_afresh_an_overlay_builds_on_the_files_before_it(tmp_path):
    (tmp_path / "tau.yaml").write_text("calibration: {tau: -1.0}\n")
    overlay = load(REPO / "config/config.yaml", tmp_path / "tau.yaml")
    assert overlay["calibration"]["tau"] == -1.0 and overlay["train"]["sft"]["learning_rate"] == 3.0e-3
    # smol extends the toy experiment: the toy's values where it sets none, its own where it does
    smol = load(REPO / "config/smol.yaml")
    assert load(REPO / "config/config.yaml", REPO / "config/smol.yaml") == smol
    assert smol["calibration"]["tau"] == -0.5 and smol["train"]["sft"]["learning_rate"] == 5.0e-5
    rows = {r["key"]: r["origin"] for r in explain(smol, layers(REPO / "config/smol.yaml"), SCHEMA)}
    assert rows["calibration.tau"].endswith("config.yaml") and rows["decode.bon_n"].endswith("smol.yaml")
    (tmp_path / "a.yaml").write_text("experiment: a\nextends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("experiment: b\nextends: a.yaml\n")
    with pytest.raises(ConfigError, match="a cycle of extends"):
        load(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("experiment: c\nextends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml: no such config file"):
        load(tmp_path / "c.yaml")


@pytest.mark.parametrize(
    "override, message",
    [
        ({"calibration": {"bootstrap": -1}}, "calibration.bootstrap: -1 is less than the minimum of 1"),
        ({"calibration": {"bootstrap": "many"}}, "calibration.bootstrap: 'many' is not of type 'integer'"),
        ({"calibration": {"quantile": 1.5}}, "calibration.quantile: 1.5 is greater than or equal to"),
        ({"calibration": {"tua": -1}}, "unknown key calibration.tua"),
        ({"colour": "red"}, "unknown key colour"),
        ({"data": {"prompts": {"n_test": 0}}}, "data.prompts.n_test: 0 is less than the minimum of 1"),
        ({"generation": {"backend": "tgi"}}, "generation.backend: 'tgi' is not one of"),
        ({"experiment": "a/b"}, "experiment: 'a/b' is not a name of letters"),
        ({"decode": {"lambdas": ["half"]}}, "decode.lambdas.0: 'half' does not match"),
        ({"resources": {"rules": {"sft": {"gpu": -1}}}}, "resources.rules.sft.gpu: -1 is less than"),
    ],
)
def test_bad_values_fail_naming_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        validate(override, source="my.yaml")
    assert str(info.value).startswith("my.yaml: invalid configuration")
    assert message in str(info.value)


def test_nested_command_line_values_are_typed_as_a_yaml_file_types_them():
    # Snakemake hands `--config 'calibration={tau: -1.0, bootstrap: 500}'` over with every nested scalar a string
    from snakemake.cli import parse_config

    given = parse_config(["calibration={tau: -1.0, bootstrap: 500, mode: bon}", "decode={lambdas: [zero, 0p5]}"])
    assert given["calibration"]["tau"] == "-1.0"  # what Snakemake itself gives
    typed = command_line_values(given)
    assert typed["calibration"] == {"tau": -1.0, "bootstrap": 500, "mode": "bon"}
    assert typed["decode"]["lambdas"] == ["zero", "0p5"]
    assert command_line_values({"a": ["1e-3", "+2", ".5", "True", "null", "~", "nan", "1.2.3"]}) == {
        "a": [1e-3, 2, 0.5, True, None, None, "nan", "1.2.3"]}
    config = load(REPO / "config/config.yaml", overrides=given)
    assert config["calibration"]["tau"] == -1.0 and config["calibration"]["bootstrap"] == 500


@pytest.mark.parametrize(("text", "hint"), [("2e-5", "YAML 1.1 reads an exponent without a dot as text; write 2.0e-5"),
                                            ("-1.0", "a quoted number is text in YAML; write -1.0 unquoted")])
def test_a_number_read_as_text_gets_the_fix_that_applies(text, hint):
    with pytest.raises(ConfigError, match=re.escape(hint)):
        validate({"calibration": {"tau": text}})


def test_all_errors_are_reported_at_once():
    with pytest.raises(ConfigError) as info:
        validate({"seed": -3, "toy": {"n_sft": 0}})
    assert "seed: -3" in str(info.value) and "toy.n_sft: 0" in str(info.value)


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_configs(name):
    cfg = load(REPO / "config/config.yaml", PAPER[name])
    expected = {"llama": ("meta-llama/Llama-3.2-3B", -4.0, 2.0), "qwen": ("Qwen/Qwen2.5-3B", 0.8, 3.0)}[name]
    got = (cfg["base_model"]["name_or_path"], cfg["calibration"]["tau"], cfg["decode"]["overpenalised_lambda"])
    assert got == expected
    # Best-of-N is calibrated for the decoder that uses it: bon mode with the decoder's N
    assert cfg["calibration"]["mode"] == "bon" and cfg["decode"]["bon_n"] == 20
    # the search bound covers the max setting
    assert cfg["calibration"]["lambda_search_max"] >= cfg["decode"]["overpenalised_lambda"]
    assert cfg["data"]["sft"]["source"] == "tatsu-lab/alpaca"
    assert cfg["data"]["preferences"]["source"] == "PKU-Alignment/PKU-SafeRLHF"
    assert cfg["data"]["prompts"]["n_calibration"] == 2000 and cfg["data"]["prompts"]["n_test"] == 256
    assert cfg["calibration"]["samples_per_prompt"] == 20
    assert cfg["calibration"]["bootstrap"] == 10000 and cfg["calibration"]["quantile"] == 0.975
    assert cfg["decode"]["bon_n"] == 20
    assert (cfg["generation"]["top_k"], cfg["generation"]["temperature"]) == (50, 1.2)
    rgtg = cfg["decode"]["rgtg"]
    assert all((rgtg[m]["top_k"], rgtg[m]["weight"]) == (50, 2.0) for m in ("args", "pargs", "cdq"))
    # ARGS greedy, PARGS sampled at T = 1, and as many new tokens as Best-of-N and the policies
    assert (rgtg["args"]["temperature"], rgtg["pargs"]["temperature"]) == (0.0, 1.0)
    assert {rgtg[m]["max_new_tokens"] for m in rgtg} == {cfg["generation"]["max_new_tokens"]}
    assert cfg["train"]["cost"]["loss"] == "bt" and cfg["train"]["partial"]["cost_loss"] == "bt"
    # both baseline variants beside the baselines, each its own policy
    assert cfg["decode"]["policies"] == ["sft", "safe_rlhf", "safedpo", "safedpo_plain", "safe_rlhf_plain"]
    plain = cfg["decode"]["policy_variants"]["safedpo_plain"]
    assert (plain["base"], plain["train"]) == ("safedpo", {"delta": 0.0})
    assert cfg["evaluation"]["reward_model"] == "PKU-Alignment/beaver-7b-unified-reward"
    assert cfg["evaluation"]["cost_model"] == "PKU-Alignment/beaver-7b-unified-cost"


def test_load_reports_bad_yaml(tmp_path):
    (tmp_path / "bad.yaml").write_text("calibration: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        load(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(ConfigError, match=r"list\.yaml: the top level must be a mapping"):
        load(tmp_path / "list.yaml")


def _toy(**override):
    from lara.config import merge

    return load(REPO / "config/config.yaml", overrides=merge({}, override))


@pytest.mark.parametrize("value, local", [
    ("meta-llama/Llama-3.2-3B", False), ("toy", False), ("./models/base", True), ("/abs/model", True),
    ("~/m", True), ("data/file.jsonl", True), ("a/b/c", True), ("models/x", True),  # models/ exists here
])
def test_local_paths_are_told_from_hub_ids(tmp_path, value, local):
    from lara.config import looks_local

    (tmp_path / "models").mkdir()
    assert looks_local(value, tmp_path) is local


@pytest.mark.parametrize("override, message", [
    ({"base_model": {"name_or_path": "./nowhere/model"}}, "base_model.name_or_path: './nowhere/model' looks like a "
                                                          "local model path, and there is nothing there"),
    ({"evaluation": {"cost_model": "/no/such/beaver"}, "calibration": {"constraints": []}},
     "evaluation.cost_model: '/no/such/beaver' looks like"),
    ({"data": {"sft": {"source": "mine/alpaca.jsonl"}}}, "data.sft.source: 'mine/alpaca.jsonl' looks like a local "
                                                         "data path"),
    ({"resources": {"rules": {"train_sft": {"processes": 2, "cpus_per_task": 2,
                                            "accelerate_config": "config/accelerate/missing.yaml"}}}},
     "resources.rules.train_sft.accelerate_config: 'config/accelerate/missing.yaml' looks like a local file path"),
    ({"decode": {"rgtg": {"pargs": {"top_k": 2000}}}},
     "decode.rgtg.pargs.top_k: 2000 candidate tokens per step exceed the vocabulary of 1024 "
     "(toy.tokenizer.vocab_size)"),
    # a hub setting where there is no hub id would be ignored
    ({"base_model": {"revision": "v1"}}, "base_model.revision: 'v1' is set, but 'toy' is not a hub id"),
    ({"evaluation": {"cost_model_revision": "main"}}, "evaluation.cost_model_revision: 'main' is set, but 'oracle'"),
    ({"data": {"prompts": {"data_dir": "x"}}}, "data.prompts.data_dir: 'x' is set, but 'toy' is not a hub id"),
])
def test_references_are_checked_before_any_job(tmp_path, override, message):
    from lara.config import check_references

    problems = check_references(_toy(**override), tmp_path, scorers=("oracle",))
    assert len(problems) == 1 and problems[0].startswith(message), problems
    assert check_references(_toy(), tmp_path, scorers=("oracle",)) == []
    # hub ids, and the accelerate config file the paper's Safe-RLHF job names (read from the workflow's folder)
    assert check_references(load(REPO / "config/config.yaml", PAPER["llama"]), REPO) == []


def test_top_k_is_checked_against_a_local_base_models_vocabulary(tmp_path):
    import json

    from lara.config import check_references

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text(json.dumps({"vocab_size": 40}))
    cfg = _toy(base_model={"name_or_path": "./base"}, decode={"rgtg": {"cdq": {"top_k": 41}}})
    assert check_references(cfg, tmp_path, scorers=("oracle",)) == [
        "decode.rgtg.cdq.top_k: 41 candidate tokens per step exceed the vocabulary of 40 (./base/config.json)"]


@pytest.mark.parametrize("variants, policies, message", [
    ({"plain": {"base": "safedpo", "train": {"delta": -1.0}}}, ["plain"],
     "decode.policy_variants.plain.train.delta: -1.0 is less than the minimum of 0 (overriding train.safedpo)"),
    ({"plain": {"base": "safedpo", "train": {"delat": 0.0}}}, ["plain"],
     "decode.policy_variants.plain.train: Additional properties are not allowed ('delat' was unexpected)"),
    ({"hot": {"base": "safe_rlhf", "generation": {"temperature": 0}}}, ["hot"],
     "decode.policy_variants.hot.generation.temperature: 0 is less than or equal to the minimum of 0"),
    ({"x": {"base": "sft", "train": {"learning_rate": 1.0}}}, ["x"], "decode.policy_variants.x.train: the sft policy"),
    ({"safedpo": {"base": "safedpo", "train": {"delta": 0.0}}}, [], "decode.policy_variants.safedpo: safedpo is a "
                                                                   "base policy's name"),
    ({}, ["sft", "nope"], "decode.policies: nope is neither a base policy"),
])
def test_policy_variants_are_checked_against_the_sections_they_override(variants, policies, message):
    with pytest.raises(ConfigError) as info:
        decode = {"policy_variants": variants, "policies": policies or ["sft"]}
        validate({"calibration": {"tau": -0.5}, "decode": decode}, source="my.yaml")
    assert message in str(info.value)


def test_a_variant_s_settings_are_its_base_s_with_its_overrides():
    from lara.config import variant_settings

    cfg = load(REPO / "config/config.yaml", PAPER["llama"])
    plain = variant_settings(cfg, "safedpo_plain", "train")
    assert plain["delta"] == 0.0 and {k: v for k, v in plain.items() if k != "delta"} == {
        k: v for k, v in cfg["train"]["safedpo"].items() if k != "delta"}
    assert variant_settings(cfg, "safedpo", "train") == cfg["train"]["safedpo"]
    sampled = variant_settings(cfg, "safe_rlhf_plain", "generation")
    assert (sampled["temperature"], sampled["top_k"]) == (1.0, 0) and sampled["max_new_tokens"] == 512


@pytest.mark.parametrize("old, new", [
    ({"calibration": {"lambda_max": 5.0}}, "calibration.lambda_search_max"),
    ({"decode": {"lambda_max": 2.0}}, "decode.overpenalised_lambda"),
    ({"train": {"safe_rlhf": {"lambda_max": 5.0}}}, "train.safe_rlhf.lambda_clamp"),
])
def test_the_three_old_lambda_max_keys_are_refused_naming_their_new_names(old, new):
    with pytest.raises(ConfigError, match=f"lambda_max is now {new} "):
        validate(old | {"calibration": {"tau": -1.0, **old.get("calibration", {})}}, source="old.yaml")


def test_safe_rlhf_has_no_budget_of_its_own_it_is_held_to_tau():
    # an old config's threshold is refused, not silently replaced by tau
    with pytest.raises(ConfigError, match=r"train.safe_rlhf.threshold is now calibration.tau \(the Safe-RLHF "
                                          r"baseline is held to the budget LARA is held to.*\); remove the key"):
        validate({"calibration": {"tau": -0.5}, "train": {"safe_rlhf": {"threshold": -5.0}}}, source="old.yaml")
    schema = load_schema()
    for name in ("config.yaml", "paper-llama.yaml", "paper-qwen.yaml"):
        config = load(REPO / "config" / name)
        settings = json.loads(settings_json(config, "train.safe_rlhf", schema))
        assert settings["threshold"] == config["calibration"]["tau"], name


def test_a_step_run_by_hand_refuses_an_old_name_too():
    from lara.calibrate.calibrate import CalibrationSettings

    with pytest.raises(ConfigError, match="calibration.lambda_max is now calibration.lambda_search_max"):
        CalibrationSettings.from_json('{"tau": -1.0, "lambda_max": 5.0}')


def test_the_settings_table_leaves_out_execution_settings_and_layers_that_only_hold_them():
    from lara.config import result_layers

    parts = [("a.yaml", {"experiment": "x", "resources": {"default": {}}}), ("b.yaml", {"numerics": {}}),
             ("c.yaml", {"calibration": {"tau": -1.0}})]
    assert result_layers(parts) == [("a.yaml", {"experiment": "x"}), ("c.yaml", {"calibration": {"tau": -1.0}})]


def test_the_largest_config_seed_leaves_room_for_the_streams_derived_from_it():
    """Rules hand steps seed + 2 (the deployment pool, the fine-tuned policies); every step accepts seeds up to
    SEED_MAX, and validate builds those steps' settings with the largest seed."""
    from lara.config import load_schema
    from lara.settings import SEED_MAX

    top = load_schema()["properties"]["seed"]["maximum"]
    assert top + 2 == SEED_MAX
    validate({"seed": top, "calibration": {"tau": 0.0}})
