"""Precise invalidation, read off Snakemake's own dry run on the finished toy run."""

import os
import re
import shutil

import pytest

from ..conftest import REPO, run_snakemake

pytestmark = pytest.mark.workflow

TRAINING = {"train_sft", "train_reward_model", "train_cost_model", "train_partial_model", "train_value_model",
            "train_safe_rlhf", "train_safedpo"}


def dry_run(workdir, *args, env=None):
    proc = run_snakemake(workdir, "-n", *args, env=env)
    out = proc.stdout + proc.stderr
    if "Nothing to be done" in out:
        return {}, set()
    table = out[out.index("Job stats"):]
    counts = {k: int(v) for k, v in re.findall(r"^(\w+)\s+(\d+)$", table, flags=re.M)}
    counts.pop("all", None)
    counts.pop("total", None)
    outputs = {o.strip() for line in re.findall(r"^\s+output: (.*)$", out, flags=re.M) for o in line.split(",")}
    return counts, outputs


def override(tmp_path, text):
    path = tmp_path / "override.yaml"
    path.write_text(text)
    return ["--configfile", "config/config.yaml", str(path)]


def test_no_change_means_no_jobs(toy_run):
    assert dry_run(toy_run) == ({}, set())


def test_sft_learning_rate_reruns_everything_downstream_of_sft(toy_run, tmp_path):
    counts, _ = dry_run(toy_run, *override(tmp_path, "train:\n  sft:\n    learning_rate: 1.0e-3\n"))
    assert set(counts) >= TRAINING and counts["train_partial_model"] == 2 and counts["generate_policy"] == 3
    assert {"sample", "calibrate_lambda", "select_bon", "decode_rgtg"} <= set(counts) and counts["sample"] == 5
    assert not {"make_toy_world", "make_toy_model", "prepare_sft_data", "prepare_preferences",
                "split_prompts"} & set(counts)


def test_unrelated_training_key_reruns_only_its_stage(toy_run, tmp_path):
    counts, outputs = dry_run(toy_run, *override(tmp_path, "train:\n  partial:\n    prefixes_per_pair: 5\n"))
    assert counts.get("train_partial_model") == 2 and counts.get("decode_rgtg") == 4  # pargs x 4 settings
    assert not {"train_sft", "train_reward_model", "calibrate_lambda", "select_bon"} & set(counts)
    # PARGS's partial models also score pruned Best-of-N's prefixes: its calibration and decodes rerun, Best-of-N's not
    # and the token-budget chooser's (its three prompt sets' prefixes, its choice and figure)
    assert counts.get("score_prefixes") == 3 and counts.get("calibrate_prune") == 1
    assert counts.get("choose_decoder") == 1 and counts.get("figure_frontier") == 1
    assert all(any(f"/{d}/" in o for d in ("pargs", "bon_prune", "budget")) for o in outputs if "/decode/" in o)


def test_one_method_s_decoding_settings_rerun_only_that_method(toy_run, tmp_path):
    counts, outputs = dry_run(toy_run, *override(tmp_path, "decode:\n  rgtg:\n    pargs:\n      temperature: 0.5\n"))
    assert counts.get("decode_rgtg") == 4 and counts.get("evaluate_decoded") == 4
    assert not {"train_partial_model", "calibrate_lambda", "select_bon", "sample"} & set(counts)
    assert all("/pargs/" in o for o in outputs if "/decode/" in o or "/eval/pargs" in o or "/eval/args" in o)


def test_a_baseline_variant_adds_exactly_its_own_jobs(toy_run, tmp_path):
    variants = ("decode:\n  policies: [sft, safe_rlhf, safedpo, safedpo_plain, safe_rlhf_plain]\n"
                "  policy_variants:\n    safedpo_plain: {base: safedpo, train: {delta: 0.0}}\n"
                "    safe_rlhf_plain: {base: safe_rlhf, generation: {temperature: 1.0, top_k: 0}}\n")
    counts, outputs = dry_run(toy_run, *override(tmp_path, variants))
    # one more SafeDPO model (Delta = 0), and two more policies sampled, evaluated, judged and aggregated
    assert counts.get("train_safedpo") == 1 and "results/tiny/models/safedpo_plain" in outputs
    assert counts.get("generate_policy") == 2 and counts.get("evaluate_policy") == 2
    assert not {"train_safe_rlhf", "train_sft", "decode_rgtg", "select_bon", "sample"} & set(counts)
    assert {"results/tiny/decode/safedpo_plain/responses.parquet",
            "results/tiny/decode/safe_rlhf_plain/responses.parquet"} <= outputs


def package_copy(tmp_path):
    """A copy of the package on PYTHONPATH (Snakemake and the jobs import lara from there), so a
    test edits step sources without touching the repository."""
    pkg = tmp_path / "pkg"
    shutil.copytree(REPO / "workflow" / "lara", pkg / "lara", ignore=shutil.ignore_patterns("__pycache__"))
    return pkg / "lara", {"PYTHONPATH": f"{pkg}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def append(path, text):
    with open(path, "a") as fh:
        fh.write(text)


def own_code_changed(workdir, env):
    """The rules whose own params changed (not those rerun because an input will change): with the
    config untouched, that is their code param."""
    proc = run_snakemake(workdir, "-n", env=env)
    out = proc.stdout + proc.stderr
    rules = set()
    for block in re.split(r"(?m)^(?=(?:local)?rule \w+:)", out):
        m = re.match(r"(?:local)?rule (\w+):", block)
        if m and re.search(r"reason:.*Params have changed since last execution", block):
            rules.add(m.group(1))
    return rules


def test_comment_and_docstring_edits_rerun_nothing(toy_run, tmp_path):
    lara, env = package_copy(tmp_path)
    for rel in ("decode/rgtg.py", "decode/bon.py", "calibrate/dual.py", "scoring.py"):
        path = lara / rel
        path.write_text(path.read_text().replace('"""', '"""Reworded docstring. ', 1))
        append(path, "\n\n# an added comment\n")
    assert dry_run(toy_run, env=env) == ({}, set())


def test_editing_a_step_module_reruns_that_step_and_its_downstream(toy_run, tmp_path):
    lara, env = package_copy(tmp_path)
    append(lara / "decode" / "sweep.py", "\nAN_EDIT = 1\n")
    counts, outputs = dry_run(toy_run, env=env)
    # the sweeps (Best-of-N's and pruned Best-of-N's share its held-out table), their figure, and the audit that
    # reads them (with the summary's and the audit's figures)
    assert counts == {"bon_sweep": 1, "bon_prune_sweep": 1, "figure_lambda_sweep": 1, "aggregate": 1,
                      "figure_tradeoff": 1, "figure_decoders": 1}, counts
    append(lara / "calibrate" / "dual.py", "\nANOTHER_EDIT = 1\n")
    counts, outputs = dry_run(toy_run, env=env)
    # the decodes at lambda-hat and lambda* (and Best-of-N at the certified lambdas) read the rewritten lambda.json
    assert counts.get("calibrate_lambda") == 1 and counts.get("decode_rgtg") == 6 and counts.get("select_bon") == 5
    assert not TRAINING & set(counts) and "sample" not in counts


@pytest.mark.parametrize("rel, roots", [
    # the first steps that run lara.template / lara.read.files (the unit test tests/unit/test_codehash.py checks
    # every step's import closure against a regex reading of the sources); make_toy_world imports neither
    ("template.py", {"make_toy_model", "prepare_sft_data", "prepare_preferences", "split_prompts"}),
    # every step reads its inputs through lara.read: the toy model's inputs and the config's model folders too
    ("read/files.py", {"prepare_sft_data", "prepare_preferences", "split_prompts", "make_toy_model",
                       "experiment_settings"}),
])
def test_a_shared_module_edit_reruns_the_steps_that_import_it(toy_run, tmp_path, rel, roots):
    lara, env = package_copy(tmp_path)
    append(lara / rel, "\nSHARED_EDIT = 1\n")
    # Snakemake names a job's own changed params only where no input changes too: the roots of the rerun
    assert own_code_changed(toy_run, env) == roots
    counts, _ = dry_run(toy_run, env=env)
    assert "make_toy_world" not in counts and ("make_toy_model" in counts) == ("make_toy_model" in roots)
    assert {"calibrate_lambda", "decode_rgtg", "aggregate"} <= set(counts)  # and everything downstream


def test_a_module_of_later_steps_reruns_exactly_those_steps_and_their_downstream(toy_run, tmp_path):
    # lara.calibrate.bestofn: run by calibrate, select-bon and bon-sweep; nothing upstream of them, no
    # baseline and not the token-level decoder (which reads lambda.json through lara.calibrate.record)
    lara, env = package_copy(tmp_path)
    append(lara / "calibrate" / "bestofn.py", "\nSHARED_EDIT = 1\n")
    counts, _ = dry_run(toy_run, env=env)
    # Best-of-N's zero and max settings depend on no calibration: they rerun for their own code alone;
    # the token-level decodes rerun only at hat and star (their lambda.json is rewritten), never at zero or max
    # (and the coverage study, which computes with it, and Best-of-N at the certified crc, ltt and ltt_wsr); the
    # deployment streams read their scored pool with it (lara.calibrate.calibrate.load_scores): each scenario's
    # stream, its online runs, shift check, weighted lambda and arms, and the report and its figure, never the
    # pool's sampling
    assert counts == {"calibrate_lambda": 1, "calibrate_lambda_for_n": 2, "calibrate_soft": 3, "select_bon": 7,
                      "bon_sweep": 1, "coverage": 1, "figure_coverage": 1,
                      "decode_rgtg": 6, "evaluate_decoded": 20, "judge_decoded": 20, "aggregate": 1,
                      "figure_lambda_sweep": 1, "figure_tradeoff": 1, "figure_calibration": 1,
                      "figure_decoders": 1, "make_stream": 4, "online": 12, "shift_check": 4, "calibrate_weighted": 4,
                      "deploy_arms": 4, "deployment_report": 1, "figure_deployment": 1,
                      # the constraints stage computes with it too: its calibration, both decoders' module, the
                      # audit, the coverage study and the two figures (never its training or scoring)
                      "calibrate_vector": 1, "decode_vector_bon": 5, "decode_vector_args": 2, "audit_constraints": 1,
                      "coverage_vector": 1, "figure_constraints": 1, "figure_constraints_sweep": 1,
                      # pruned Best-of-N ranks with Best-of-N's order: its prefix scoring (its settings' module),
                      # calibration, decodes at every setting, sweep and coverage study
                      "score_prefixes": 3, "calibrate_prune": 1, "select_bon_prune": 7, "bon_prune_sweep": 1,
                      "coverage_prune": 1,
                      # the token-budget chooser calibrates Best-of-k and the schedules with both, and its figure
                      "choose_decoder": 1, "figure_frontier": 1,
                      # Best-of-k through the calibration core computes its curves with Best-of-N's rank weights
                      "calibrate_best_of_k": 3}, counts
    assert own_code_changed(toy_run, env) == {"calibrate_lambda", "calibrate_lambda_for_n", "calibrate_soft",
                                              "select_bon", "coverage", "make_stream", "calibrate_vector",
                                              "coverage_vector", "score_prefixes", "calibrate_best_of_k"}


def test_execution_settings_rerun_nothing_and_a_plot_option_only_the_settings_table_and_figures(toy_run, tmp_path):
    # resources and numerics decide where and how jobs run, not what they compute: not in the settings table
    execution = "numerics: {cpu_kernels: native}\nresources: {default: {mem_mb: 8000}}\n"
    assert dry_run(toy_run, *override(tmp_path, execution)) == ({}, set())
    counts, _ = dry_run(toy_run, *override(tmp_path, "figures: {dpi: 100}\n"))
    assert counts == {"experiment_settings": 1, "figure_lambda_sweep": 1, "figure_tradeoff": 1,
                      "figure_calibration": 1, "figure_decoders": 1, "figure_coverage": 1,
                      "figure_deployment": 1, "figure_constraints": 1, "figure_constraints_sweep": 1,
                      "figure_frontier": 1}, counts


def test_a_step_size_reruns_only_the_online_arms_and_what_reads_them(toy_run, tmp_path):
    counts, outputs = dry_run(toy_run, *override(tmp_path, "deployment:\n  step_size: [0.002, 0.01, 0.05, 0.1]\n"))
    scenarios = 4
    # one new online run per scenario; the arms, report and figure read them; nothing upstream, no calibration
    assert counts.get("online") == scenarios and counts.get("deploy_arms") == scenarios
    assert {"deployment_report", "figure_deployment"} <= set(counts)
    assert not {"sample", "score", "make_stream", "shift_check", "calibrate_lambda", "calibrate_weighted"} & set(counts)
    assert all(o.endswith("online_0p1.parquet") or o.endswith("online_0p1.json") for o in outputs if "/online_" in o)
