"""The wrong answers with exit 0 that a hostile round found after the calibration core was consolidated, each kept
as a case that must stay refused: a verdict read without its check, a soft-mode lambda deployed as Best-of-N's, a
pruned record or prefix table that does not state its partial scorers, a schedule check missing from a command,
a step size with no folder of its own, ARGS decoding planned where decode.methods has no ARGS."""

from __future__ import annotations

import json
import re

import pytest

from lara.data.errors import DataError
from lara.stats import VERDICTS, verdict_problems


def audit_row(verdict, lower, upper, tau=-0.5, n=256):
    return {"method": "bon", "setting": "zero", "n_prompts": n, "one_sided95": [lower, upper], "tau": tau,
            "verdict": verdict}


def test_a_verdict_its_own_bounds_do_not_give_is_found_wherever_it_stands():
    audit = {"tau": -0.5, "n_test_prompts": 256, "by_lambda": [audit_row(VERDICTS[2], 0.52, 1.66)],
             "decoders": [audit_row(VERDICTS[0], -1.2, -0.7)]}
    assert verdict_problems(audit) == []
    audit["by_lambda"][0]["verdict"] = VERDICTS[0]  # "met", against bounds entirely above tau
    found = verdict_problems(audit)
    assert len(found) == 1 and found[0].startswith("by_lambda[0]: verdict 'met")
    audit["decoders"][0]["n_prompts"] = 5  # too few prompts for any verdict
    assert any(p.startswith("decoders[0]") for p in verdict_problems(audit))


def test_a_joint_verdict_its_rows_do_not_give_is_found():
    from lara.constraints.audit import edited_verdicts, joint_rule

    rows = [audit_row(VERDICTS[0], -2.0, -1.0) | {"constraint": c} for c in ("a", "b")]
    joint = [{"method": "bon", "setting": "zero", "n_prompts": 256, "max_excess_upper95": -0.5,
              "verdict": joint_rule(-0.5, [VERDICTS[0]] * 2, 256)}]
    assert joint[0]["verdict"] == VERDICTS[0] and edited_verdicts({"rows": rows, "joint": joint}) == []
    rows[1] = audit_row(VERDICTS[2], 0.0, 1.0) | {"constraint": "b"}  # one constraint violated: the joint is not met
    assert edited_verdicts({"rows": rows, "joint": joint})[0].startswith("joint (bon at zero): verdict 'met")


def test_a_soft_mode_record_is_not_deployed_as_best_of_n(tmp_path):
    from lara.decode.bon import check_calibrated_for

    record = {"lambda_hat": 0.3, "lambda_star": 0.4, "tau": -0.5, "mode": "soft", "feasible": True,
              "status": "found", "decoder": {"kind": "gibbs_tilt", "beta": 1.0},
              "bootstrap": {"quantile": 0.975, "quantiles": {"0.975": 0.4}}}
    path = tmp_path / "lambda_soft.json"
    path.write_text(json.dumps(record))
    check_calibrated_for(20, "zero", path)  # no lambda read: nothing to refuse
    with pytest.raises(DataError, match="calibrated in soft mode .* not for argmax Best-of-20"):
        check_calibrated_for(20, "star", path)


def test_a_prefix_table_or_pruned_record_that_names_no_partial_scorer_is_refused():
    from lara.read.contracts import LAMBDA_PRUNED, PREFIXES_TEST
    from lara.read.expect import identity_checks

    named = {"kind": "prefix_scores", "role": "test", "prefix_reward_scorer": "r", "prefix_cost_scorer": "c"}
    identity_checks(named, PREFIXES_TEST, "--candidates p.parquet")
    with pytest.raises(DataError, match="states no prefix_cost_scorer"):
        identity_checks({k: v for k, v in named.items() if k != "prefix_cost_scorer"}, PREFIXES_TEST, "--candidates")
    with pytest.raises(DataError, match="states no prefix_reward_scorer"):  # a pruned record made before they were
        identity_checks({"kind": "lambda", "prefix_cost_scorer": "c"}, LAMBDA_PRUNED, "--lambda-json r.json")


def test_every_command_that_reads_the_schedule_refuses_a_bad_one_before_any_model():
    from lara.calibrate.prune_coverage import PruneCoverageSettings
    from lara.calibrate.pruned import PruneScheduleSettings, PruneSettings
    from lara.decode.prune_sweep import PruneSweepSettings
    from lara.settings import ConfigError

    bad = {"n": 20, "max_new_tokens": 48, "checkpoints": [2, 3], "keep": [30, 3]}
    extra = {PruneSettings: dict(tau=-0.5, lambda_search_max=5.0, bootstrap=200, quantile=0.975,
                                 guarantee="bootstrap", delta=0.1, cost_bounds=None),
             PruneScheduleSettings: {},
             PruneSweepSettings: dict(tau=-0.5, lambda_grid=[0.0]),
             PruneCoverageSettings: dict(grid_points=11, max_subsets=10, tau=-0.5, quantile=0.975, delta=0.1,
                                         cost_bounds=[-8.0, 8.0], lambda_search_max=5.0)}
    for cls, more in extra.items():
        with pytest.raises(ConfigError, match="keep 30 at checkpoint 2"):
            cls(**bad, **more)


def test_a_record_a_calibration_wrote_is_refused_with_its_identity_removed(tmp_path):
    """A record that states its code and settings was written by a calibration, which always stamps it: without its
    identity (and the seal in it) any edit of its lambdas would pass, so it is refused; a hand-made record (no code,
    no settings) is read on its own numbers."""
    from lara.read.contracts import LAMBDA
    from lara.read.expect import read

    record = {"lambda_hat": 0.3, "lambda_star": 0.4, "tau": -0.5, "mode": "bon", "feasible": True,
              "status": "found", "decoder": {"kind": "best_of_n", "n": 20}}
    hand = tmp_path / "hand.json"
    hand.write_text(json.dumps(record))
    assert read(hand, "--lambda-json", LAMBDA).data["lambda_star"] == 0.4
    stripped = tmp_path / "stripped.json"
    stripped.write_text(json.dumps(record | {"code": {"git_commit": "0" * 40}, "settings": {"tau": -0.5}}))
    with pytest.raises(DataError, match="stripped.json: written by a step .* but carries no identity"):
        read(stripped, "--lambda-json", LAMBDA)


@pytest.mark.parametrize("step_size, said", [
    ([0.05, 5e-2], "deployment.step_size: [0.05, 0.05] has non-unique elements"),  # one folder, online_0p05
    ([1, 1.0], "deployment.step_size: [1, 1.0] has non-unique elements"),
    ([0.05, 1e-300], "deployment.step_size: 1e-300 is written 0p00000000... (302 characters)"),  # no file name
])
def test_a_step_size_without_a_folder_of_its_own_is_refused_when_the_config_is_validated(step_size, said):
    """Each step size is an online arm in online_<eta> (rules/deploy.smk): two that are one number would share a
    folder, one written in hundreds of digits has no file name; both are refused before any job, naming the key."""
    import copy

    from lara.config import ConfigError, load_yaml, merge, validate
    from tests.conftest import REPO

    toy = load_yaml(REPO / "config" / "config.yaml")
    with pytest.raises(ConfigError, match=re.escape(said)):
        validate(merge(copy.deepcopy(toy), {"deployment": {"step_size": step_size}}))


def test_decode_methods_without_args_plan_no_vector_args_decode(workflow_copy, tmp_path):
    """decode.methods: [bon] plans the constraints stage's Best-of-N decodes with the vector lambda, and no ARGS."""
    from tests.conftest import run_snakemake

    (tmp_path / "o.yaml").write_text("decode:\n  methods: [bon]\n")
    proc = run_snakemake(workflow_copy, "-n", "--forceall", "--quiet", "rules", "--configfile",
                         str(tmp_path / "o.yaml"))
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", proc.stdout, flags=re.M))
    assert counts.get("decode_vector_bon") == "5", counts
    assert "decode_vector_args" not in counts and "decode_rgtg" not in counts, counts


def test_a_settings_key_that_its_own_flag_gives_is_refused_in_one_line(tmp_path, capsys):
    """split-prompts: --source and a "source" key in --settings (was a TypeError traceback)."""
    from lara.cli import main

    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(f'{{"prompt": "request {i}"}}\n' for i in range(10)))
    rc = main(["split-prompts", "--source", str(pool), "--settings", '{"source": "elsewhere"}', "--n-calibration",
               "4", "--n-test", "4", "--calibration", str(tmp_path / "c.parquet"),
               "--test", str(tmp_path / "t.parquet")])
    assert rc == 2 and "'source' is given by its own flag" in capsys.readouterr().err
    assert not (tmp_path / "c.parquet").exists()


# ---------------------------------------------------------------------------------------------
# The round on the vector calibration, its coverage study, score-prefixes and the code-hash cache


CAL = {"beta": 1.0, "bon_n": 20, "bootstrap": 1000, "cost_bounds": [-8.0, 8.0], "delta": 0.1, "guarantee": "bootstrap",
       "lambda_search_max": 5.0, "mode": "bon", "quantile": 0.975, "seed": 0, "tau": -4.0, "tolerance": 1e-08}
COV = {"bon_n": 20, "bootstrap": 1000, "cost_bounds": [-8.0, 8.0], "delta": 0.1, "lambda_search_max": 5.0,
       "n_prompts": [50], "quantile": 0.975, "repeats": 5, "samples_per_prompt": None, "seed": 0, "tau": -4.0}


@pytest.mark.parametrize("cal, cov, m, message", [
    ({"guarantee": "crc"}, {}, 3, "calibration.guarantee: crc bounds one risk"),  # recorded as deployed: crc
    ({}, {"n_prompts": []}, 3, "coverage.n_prompts is empty"),  # a KeyError after every draw
    ({}, {"n_prompts": [1]}, 2, "coverage.n_prompts: [1] below 2 prompts"),
])
def test_the_vector_coverage_study_refuses_what_calibrate_vector_and_the_other_studies_refuse(cal, cov, m, message):
    from lara.calibrate.calibrate import CalibrationSettings
    from lara.calibrate.coverage import CoverageSettings
    from lara.constraints.coverage import check_settings
    from lara.settings import ConfigError

    c, v = CalibrationSettings.from_json(json.dumps(CAL | cal)), CoverageSettings.from_json(json.dumps(COV | cov))
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_settings(c, v, m)
    check_settings(CalibrationSettings.from_json(json.dumps(CAL)), CoverageSettings.from_json(json.dumps(COV)), m)


def test_constraints_with_a_key_given_twice_are_refused_as_settings_are():
    from lara.constraints.spec import from_arg
    from lara.settings import ConfigError

    one = '{"name": "violence", "cost": "category:violence", "tau": -4.0, "bounds": [-5.5, 5.5]}'
    assert from_arg(f"[{one}]")[0].tau == -4.0
    with pytest.raises(ConfigError, match="'tau' is given twice"):  # json.loads kept the last: tau -3 was calibrated
        from_arg("[" + one.replace('"tau": -4.0', '"tau": -4.0, "tau": -3.0') + "]")


def test_a_response_that_is_no_text_and_a_batch_of_no_response_are_refused_before_any_scoring(tmp_path):
    """A missing response was scored as the text "None"; --batch-size -3 scored nothing and wrote uninitialised
    memory as the scores (exit 0 both)."""
    import pandas as pd

    from lara.scoring import load_scorer
    from lara.settings import ConfigError

    from ..conftest import lara_in_process

    table = tmp_path / "responses.parquet"
    pd.DataFrame({"prompt_id": ["p0", "p1"], "sample_id": [0, 0], "prompt": ["How do I bake bread?", "Hi"],
                  "response": ["Knead the dough.", None]}).to_parquet(table)
    rc, _, err = lara_in_process(["score", "--input", table, "--reward", "oracle", "--cost", "oracle", "--out",
                                  tmp_path / "scored.parquet"])
    assert rc == 2 and "column response: row 1 hold no text" in err and not (tmp_path / "scored.parquet").exists()
    for size in (0, -3, True):
        with pytest.raises(ConfigError, match=f"--batch-size {size}: at least one response per forward pass"):
            load_scorer("oracle", role="reward", batch_size=size)


def test_a_code_hash_cache_entry_the_cache_did_not_write_is_parsed_again_and_a_failed_write_leaves_nothing(tmp_path,
                                                                                                          monkeypatch):
    from lara import codehash

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for cached in (codehash._cache, codehash.imports_of, codehash.closure, codehash.modules_code):
        cached.cache_clear()
    truth = codehash.step_code("calibrate")
    key = codehash._key("lara.read.files")
    codehash._cache()["imports"][key] = 5  # a well-formed file with a wrong-typed entry: a TypeError before
    codehash._cache()["code"] = {k: "not a hash" for k in codehash._cache()["code"]}
    codehash.imports_of.cache_clear()
    codehash.closure.cache_clear()
    codehash.modules_code.cache_clear()
    assert codehash.step_code("calibrate") == truth
    codehash._cache_file().parent.mkdir(parents=True, exist_ok=True)
    codehash._cache_file().mkdir()  # the cache's path taken by a folder: the write fails, and leaves no temporary
    codehash._write()
    assert not [p for p in codehash._cache_file().parent.iterdir() if p.name.startswith(".codehash-")]
    for cached in (codehash._cache, codehash.imports_of, codehash.closure, codehash.modules_code):
        cached.cache_clear()


@pytest.mark.parametrize("command, scorer", [("coverage", "cost_scorer"), ("coverage-vector", "reward_scorer"),
                                             ("coverage-prune", "prefix_cost_scorer")])
def test_a_coverage_population_pooled_from_tables_of_other_scorers_is_refused(command, scorer):
    """The coverage studies pool their --scores tables into one population; tables scored by other scorers were
    pooled without a word (the agreement was switched off for the flag, roles aside)."""
    from lara.identity import Artifact
    from lara.read.contracts import agree

    same = {"reward_scorer": "models/reward", "cost_scorer": "models/cost", "cost_scorers": {"a": "oracle"},
            "prefix_reward_scorer": "models/partial_reward", "prefix_cost_scorer": "models/partial_cost"}
    tables = [Artifact("--scores", "cal.parquet", same | {"role": "calibration"}),
              Artifact("--scores", "test.parquet", same | {"role": "test"})]
    agree(command, {"--scores": tables})  # two roles, one set of scorers: one population
    tables[1] = Artifact("--scores", "test.parquet", same | {"role": "test", scorer: "models/other"})
    with pytest.raises(DataError, match=f"{scorer}"):
        agree(command, {"--scores": tables})


def test_a_code_hash_cache_past_its_size_keeps_only_what_the_process_used(tmp_path, monkeypatch):
    from lara import codehash

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(codehash, "MAX_ENTRIES", 10)
    for cached in (codehash._cache, codehash.imports_of, codehash.closure, codehash.modules_code):
        cached.cache_clear()
    truth = codehash.step_code("calibrate")
    codehash._cache()["code"].update({f"stale{i}": "0" * 16 for i in range(20)})  # other checkouts' old entries
    codehash._write()
    written = json.loads(codehash._cache_file().read_text())
    assert not [k for k in written["code"] if k.startswith("stale")] and written["code"]
    assert set(written["code"]) <= codehash._USED["code"] and set(written["imports"]) <= codehash._USED["imports"]
    for cached in (codehash._cache, codehash.imports_of, codehash.closure, codehash.modules_code):
        cached.cache_clear()
    assert codehash.step_code("calibrate") == truth
    for cached in (codehash._cache, codehash.imports_of, codehash.closure, codehash.modules_code):
        cached.cache_clear()


def test_one_scorer_folder_named_absolutely_and_relatively_is_one_scorer(tmp_path, monkeypatch):
    """A scorer given once as a relative path and once as an absolute one was taken for two scorers (a false
    refusal); two folders are still two scorers, and a name that is no local folder is compared as written."""
    from lara.identity import Artifact
    from lara.read.contracts import agree

    monkeypatch.chdir(tmp_path)
    for name in ("models/cost", "models/other"):
        (tmp_path / name).mkdir(parents=True)

    def tables(a, b):
        return {"--scores": [Artifact("--scores", f"{i}.parquet", {"reward_scorer": "oracle", "cost_scorer": c})
                             for i, c in enumerate((a, b))]}

    agree("coverage", tables("models/cost", str(tmp_path / "models" / "cost")))
    agree("coverage", tables("models/cost", "./models/../models/cost"))
    with pytest.raises(DataError, match="cost_scorer"):
        agree("coverage", tables("models/cost", str(tmp_path / "models" / "other")))
    with pytest.raises(DataError, match="cost_scorer"):
        agree("coverage", tables("models/gone", str(tmp_path / "models" / "gone")))
