"""lara.hub and `lara fetch`: which hub ids a config names, the cache they are read from offline, and the
errors a mistyped id or revision gets. The hub itself cannot be reached here: the cache is built in the hub's
on-disk layout (tests/conftest.py hub_cache_put) and read through huggingface_hub's own snapshot_download."""

import json
import os

import pytest
import yaml

from lara import hub
from lara.cli import main
from lara.data.ingest import IngestSettings, load_source
from lara.data.splits import SplitSettings

from ..conftest import hub_cache_put

MODEL_CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).encode()
CARD = b"""---
configs:
- config_name: held_out
  data_files:
  - split: test
    path: held_out/test.jsonl
- config_name: other
  data_files:
  - split: test
    path: other/test.jsonl
---
# prompts
"""


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """A hub cache with a model (pinned by commit), a dataset read through data_dir, and one through a named
    configuration at a tag; huggingface_hub and datasets pointed at it."""
    from datasets import config as ds_config
    from huggingface_hub import constants

    root = tmp_path / "hub"
    commits = {
        "model": hub_cache_put(root, "lab/base", {"config.json": MODEL_CONFIG, "model.safetensors": b"w"}),
        "data": hub_cache_put(root, "lab/pairs", {
            "sft/train.jsonl": _jsonl({"instruction": f"i{k}", "input": "", "output": f"o{k}"} for k in range(7)),
            "other/train.jsonl": _jsonl({"instruction": "x", "input": "", "output": "y"} for _ in range(3))},
            repo_type="dataset"),
        "prompts": hub_cache_put(root, "lab/prompts", {
            "README.md": CARD, "held_out/test.jsonl": _jsonl({"prompt": f"p{k}"} for k in range(5)),
            "other/test.jsonl": _jsonl({"prompt": "q"} for _ in range(2))}, repo_type="dataset",
            refs=("main", "v1")),
    }
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(ds_config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    return {"root": root, "commits": commits}


def _config(tmp_path, commits, **changes) -> str:
    cfg = {"experiment": "hubunit", "calibration": {"tau": 0.0},
           "base_model": {"name_or_path": "lab/base", "revision": commits["model"]},
           "data": {"sft": {"source": "lab/pairs", "data_dir": "sft"},
                    "preferences": {"source": "toy"},
                    "prompts": {"source": "lab/prompts", "name": "held_out", "revision": "v1", "n_calibration": 2,
                                "n_test": 2}},
           "evaluation": {"reward_model": "lab/base", "cost_model": "lab/base", "judge": {"model": None}}}
    for dotted, value in changes.items():
        node = cfg
        *head, last = dotted.split(".")
        for part in head:
            node = node.setdefault(part, {})
        node[last] = value
    path = tmp_path / "hub.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_references_lists_the_hub_ids_of_a_config_and_nothing_local(tmp_path, cache):
    from lara.config import load, named_scorer_names

    (tmp_path / "local").mkdir()
    cfg = load(_config(tmp_path, cache["commits"], **{"data.preferences.source": str(tmp_path / "local")}))
    refs = hub.references(cfg, tmp_path, scorers=named_scorer_names())
    assert [(r.key, r.repo_id, r.repo_type) for r in refs] == [
        ("base_model.name_or_path", "lab/base", "model"), ("evaluation.reward_model", "lab/base", "model"),
        ("evaluation.cost_model", "lab/base", "model"),
        ("data.sft.source", "lab/pairs", "dataset"), ("data.prompts.source", "lab/prompts", "dataset")]
    by_key = {r.key: r for r in refs}
    assert by_key["base_model.name_or_path"].revision == cache["commits"]["model"]
    assert (by_key["data.prompts.source"].name, by_key["data.prompts.source"].revision) == ("held_out", "v1")
    assert (by_key["data.sft.source"].data_dir, by_key["data.sft.source"].split) == ("sft", "train")
    # the references survive the rule's JSON round trip
    assert [hub.HubRef.from_dict(d) for d in json.loads(hub.refs_json(refs))] == refs
    # a folder named like a hub id is local
    (tmp_path / "lab" / "base").mkdir(parents=True)
    assert not hub.is_hub_id("lab/base", tmp_path) and hub.is_hub_id("lab/base")


def test_fetch_offline_reads_each_reference_from_the_cache_at_its_commit(tmp_path, cache, capsys):
    rc = main(["fetch", _config(tmp_path, cache["commits"]), "--out", str(tmp_path / "hub.json")])
    assert rc == 0
    manifest = json.loads((tmp_path / "hub.json").read_text())
    assert manifest["hf_hub_cache"] == str(cache["root"])
    got = {e["key"]: e for e in manifest["refs"]}
    assert got["base_model.name_or_path"]["commit"] == cache["commits"]["model"]
    assert got["data.prompts.source"]["commit"] == cache["commits"]["prompts"]  # the tag v1
    assert {e["obtained"] for e in manifest["refs"]} == {"cached"}  # HF_HUB_OFFLINE (tests never reach the hub)
    # each was loaded as the jobs will load it: the sft data_dir's 7 rows, the held_out configuration's 5
    assert (got["data.sft.source"]["rows"], got["data.prompts.source"]["rows"]) == (7, 5)
    assert got["evaluation.cost_model"]["architectures"] == ["LlamaForCausalLM"]
    out = capsys.readouterr().out
    assert f"data.sft.source\tlab/pairs\tmain\t{cache['commits']['data']}\tcached" in out


@pytest.mark.parametrize("change, needle", [
    ({"data.sft.source": "lab/pairz"}, "data.sft.source: lab/pairz@main (dataset) is not in the Hugging Face cache"),
    ({"base_model.revision": "0" * 40}, f"base_model.name_or_path: lab/base@{'0' * 40} (model) is not in the"),
    ({"data.prompts.revision": "v2"}, "data.prompts.source: lab/prompts@v2 (dataset) is not in the"),
    ({"data.prompts.name": "held_in"}, "data.prompts.source: lab/prompts@v1 (name=held_in, data_dir=None): could "
                                       "not load split 'test'"),
    ({"data.sft.split": "validation"}, "could not load split 'validation'"),
])
def test_fetch_names_the_key_of_a_reference_that_cannot_be_had(tmp_path, cache, caplog, change, needle):
    rc = main(["fetch", _config(tmp_path, cache["commits"], **change), "--out", str(tmp_path / "hub.json")])
    assert rc == 2
    assert needle in caplog.text
    assert not (tmp_path / "hub.json").exists()  # no manifest: the workflow stops before any job reads the hub


def test_jobs_read_the_fetched_snapshot(tmp_path, cache):
    df, origin = load_source("lab/pairs", "train", hub=IngestSettings(source="lab/pairs", data_dir="sft"))
    assert len(df) == 7 and set(df["instruction"]) == {f"i{k}" for k in range(7)}
    assert origin | {"fingerprint": None} == {
        "source": "lab/pairs", "kind": "hub", "revision": None, "commit": cache["commits"]["data"], "name": None,
        "data_dir": "sft", "split": "train", "fingerprint": None}
    s = SplitSettings(source="lab/prompts", revision="v1", name="other")
    df, origin = load_source(s.source, s.split, hub=s)
    assert list(df["prompt"]) == ["q", "q"] and origin["commit"] == cache["commits"]["prompts"]
    with pytest.raises(hub.HubError, match="data.prompts.source: lab/prompts@v3 .*lara fetch"):
        load_source("lab/prompts", "test", hub=SplitSettings(source="lab/prompts", revision="v3"))


def test_every_step_but_fetch_runs_offline(tmp_path, monkeypatch):
    from lara.cli import ONLINE_COMMANDS

    assert {"fetch"} == ONLINE_COMMANDS
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    assert main(["validate-config", "--quiet", "config/config.yaml"]) == 0
    assert os.environ["HF_HUB_OFFLINE"] == os.environ["HF_DATASETS_OFFLINE"] == "1"


def test_snapshot_patterns():
    model = hub.HubRef("k", "a/b")
    assert "*.bin" in hub._patterns(model, ["model.safetensors", "pytorch_model.bin"])["ignore_patterns"]
    assert "*.bin" not in hub._patterns(model, ["pytorch_model.bin"])["ignore_patterns"]
    assert "original/*" in hub._patterns(model, [])["ignore_patterns"]
    data = hub.HubRef("k", "a/b", "dataset", data_dir="/alpaca-7b/")
    assert hub._patterns(data, []) == {"allow_patterns": ["alpaca-7b/*", "README.md"]}
    assert hub._patterns(hub.HubRef("k", "a/b", "dataset"), []) == {}


def test_a_hub_model_without_config_is_refused(tmp_path, cache):
    commit = hub_cache_put(cache["root"], "lab/weights-only", {"model.safetensors": b"w"})
    ref = hub.HubRef("evaluation.reward_model", "lab/weights-only")
    path = hub.snapshot(ref)
    assert hub.commit_of(path) == commit
    with pytest.raises(hub.HubError, match="evaluation.reward_model: lab/weights-only@main has no config.json"):
        hub.check(ref, path)
