"""The offline hub path end to end: a config that names its base model and data by hub ids (with a pinned
commit, a tag, a dataset configuration and data_dirs) runs fetch_hub, the data stage and SFT with
HF_HUB_OFFLINE=1 and no reachable hub, reading a Hugging Face cache in the hub's on-disk layout; a mistyped id
stops the run in fetch_hub, before any job that would read it."""

import json

import pytest
import yaml

from lara.io import sha256_path
from lara.read.files import read_metadata

from ..conftest import copy_workflow, hub_cache_put, run_snakemake

pytestmark = pytest.mark.workflow

CARD = """---
configs:
- config_name: held_out
  data_files:
  - split: test
    path: held_out/test.jsonl
---
Toy prompts under a hub id (lara's offline test).
"""


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_data_stage_and_sft_from_an_offline_hub_cache(tiny_world, tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    hf_home = tmp_path / "hf"
    cache = hf_home / "hub"
    root = tiny_world["root"]
    commits = {
        "base": hub_cache_put(cache, "lara-test/tiny-base", {"": tiny_world["base"]}),
        "safety": hub_cache_put(cache, "lara-test/toy-safety", {"sft/train.jsonl": root / "alpaca.jsonl",
                                                                 "pairs/train.jsonl": root / "pairs.jsonl"},
                                repo_type="dataset"),
        "prompts": hub_cache_put(cache, "lara-test/toy-prompts", {
            "README.md": CARD.encode(),
            "held_out/test.jsonl": _jsonl(tmp_path / "p.jsonl", tiny_world["world"]["prompts"])},
            repo_type="dataset", refs=("main", "v1")),
    }
    (wf / "config" / "hubtest.yaml").write_text(yaml.safe_dump({
        "experiment": "hubtest", "extends": "config.yaml",
        "base_model": {"name_or_path": "lara-test/tiny-base", "revision": commits["base"]},
        "data": {"sft": {"source": "lara-test/toy-safety", "data_dir": "sft"},
                 "preferences": {"source": "lara-test/toy-safety", "data_dir": "pairs"},
                 "prompts": {"source": "lara-test/toy-prompts", "name": "held_out", "revision": "v1",
                             "n_calibration": 20, "n_test": 20}},
        "train": {"sft": {"max_steps": 4, "batch_size": 8, "max_length": 64, "save_steps": 2}},
        # an experiment on the hub's texts states its own scorers (the toy oracle is refused where neither prompts
        # nor model are the toy world's: lara.config.plan.oracle_on_toy_text); no constraints or deployment stage
        "evaluation": {"reward_model": "lara-test/tiny-base", "cost_model": "lara-test/tiny-base",
                       "judge": {"model": None}},
        "calibration": {"constraints": []}, "deployment": {"scenarios": []}}))
    # no hub to reach: offline (as every compute job is), and an endpoint that refuses any connection
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_ENDPOINT": "http://127.0.0.1:9"}
    targets = ["results/hubtest/models/sft", "results/hubtest/data/preferences.parquet",
               "results/hubtest/data/prompts_test.parquet"]
    run_snakemake(wf, *targets, "--configfile", "config/hubtest.yaml", env=env)

    ran = sorted(p.stem for p in (wf / "logs" / "hubtest").glob("*.log"))
    assert ran == ["fetch_hub", "prepare_preferences", "prepare_sft_data", "split_prompts", "train_sft"]
    manifest = json.loads((wf / "results" / "hubtest" / "hub.json").read_text())
    assert manifest["hf_hub_cache"] == str(cache)
    assert {(e["key"], e["repo_id"], e["commit"], e["obtained"]) for e in manifest["refs"]} == {
        ("base_model.name_or_path", "lara-test/tiny-base", commits["base"], "cached"),
        ("evaluation.reward_model", "lara-test/tiny-base", commits["base"], "cached"),
        ("evaluation.cost_model", "lara-test/tiny-base", commits["base"], "cached"),
        ("data.sft.source", "lara-test/toy-safety", commits["safety"], "cached"),
        ("data.preferences.source", "lara-test/toy-safety", commits["safety"], "cached"),
        ("data.prompts.source", "lara-test/toy-prompts", commits["prompts"], "cached")}
    rows = {e["key"]: e.get("rows") for e in manifest["refs"]}
    world = tiny_world["world"]
    assert (rows["data.sft.source"], rows["data.preferences.source"]) == (len(world["alpaca"]), len(world["safe_rlhf"]))

    res = wf / "results" / "hubtest"
    for name, key, commit, data_dir in (("sft", "data.sft.source", "safety", "sft"),
                                        ("preferences", "data.preferences.source", "safety", "pairs")):
        origin = read_metadata(res / "data" / f"{name}.parquet")["origin"]
        assert (origin["kind"], origin["commit"], origin["data_dir"]) == ("hub", commits[commit], data_dir), key
    origin = read_metadata(res / "data" / "prompts_test.parquet")["origin"]
    assert (origin["commit"], origin["name"], origin["revision"]) == (commits["prompts"], "held_out", "v1")
    prov = json.loads((res / "models" / "sft" / "provenance.json").read_text())
    # the provenance hashes the snapshot it trained from (its path names the id and the commit)
    base = prov["inputs"]["base_model"]
    assert base["path"] == str(cache / "models--lara-test--tiny-base" / "snapshots" / commits["base"])
    assert base["sha256"] == sha256_path(tiny_world["base"])
    assert "the fetched snapshot" in (wf / "logs" / "hubtest" / "train_sft.log").read_text()

    # a mistyped id fails in fetch_hub, naming the key; nothing that would read it started
    (wf / "config" / "hubtypo.yaml").write_text(yaml.safe_dump({
        "experiment": "hubtypo", "extends": "hubtest.yaml", "data": {"sft": {"source": "lara-test/toy-safty"}}}))
    proc = run_snakemake(wf, "results/hubtypo/models/sft", "--configfile", "config/hubtypo.yaml", env=env,
                         check=False)
    assert proc.returncode != 0
    log = (wf / "logs" / "hubtypo" / "fetch_hub.log").read_text()
    assert "data.sft.source: lara-test/toy-safty@main (dataset) is not in the Hugging Face cache" in log
    assert sorted(p.stem for p in (wf / "logs" / "hubtypo").glob("*.log")) == ["fetch_hub"]
    assert not (wf / "results" / "hubtypo" / "hub.json").exists()
