"""The paper configs are the paper's protocol: every key a paper file leaves unset resolves to the
default of the step that owns it (never a toy value), and every value the paper or the scripts it
cites state (config/protocol/*.yaml, each row with its source) is what the resolved config holds."""

import dataclasses
import re

import pytest
import yaml

from lara.config import load, load_schema

from ..conftest import REPO
from .test_config import _resolve

SCHEMA = load_schema()
PAPER = {"llama": REPO / "config/paper-llama.yaml", "qwen": REPO / "config/paper-qwen.yaml"}


def _defaults_of(dotted: str) -> dict:
    """The default of every key under a config path: a step's settings fields, else the schema's key defaults."""
    from lara.settings import SECTIONS, settings_class

    if dotted in SECTIONS:
        cls = settings_class(dotted)
        return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(cls) if f.metadata.get("config", True)
                and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)}
    node = SCHEMA
    for part in dotted.split("."):
        node = _resolve(_resolve(node, SCHEMA)["properties"][part], SCHEMA)
    return {k: _resolve(sub, SCHEMA)["default"] for k, sub in node.get("properties", {}).items()
            if "default" in _resolve(sub, SCHEMA) and "properties" not in _resolve(sub, SCHEMA)
            and "x-settings" not in sub}


def _sections(config: dict, path: str = ""):
    """Every mapping section of a resolved config with a fixed set of keys, by dotted path."""
    for key, value in config.items():
        dotted = f"{path}{key}"
        if isinstance(value, dict) and dotted not in ("resources", "decode.policy_variants"):
            yield dotted, value
            yield from _sections(value, f"{dotted}.")


@pytest.mark.parametrize("on_toy", [False, True], ids=["alone", "on-config.yaml"])
@pytest.mark.parametrize("name", sorted(PAPER))
def test_a_key_the_paper_config_does_not_set_is_the_step_default_never_a_toy_value(name, on_toy):
    """Loaded alone, or after config/config.yaml as Snakemake's configfile + --configfile orders them,
    a paper config's unset keys resolve to the defaults of the steps that own them (Safe-RLHF's
    ppo-lag.sh learning rates, not the toy world's 50x)."""
    files = (REPO / "config/config.yaml", PAPER[name]) if on_toy else (PAPER[name],)
    resolved = load(*files)
    given = yaml.safe_load(PAPER[name].read_text())
    checked, wrong = 0, []
    for dotted, section in _sections(resolved):
        node = given
        for part in dotted.split("."):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        for key, default in _defaults_of(dotted).items():
            if key in node:
                continue
            checked += 1
            if section[key] != default:
                wrong.append(f"{dotted}.{key}: {section[key]!r} (default {default!r})")
    assert wrong == [] and checked > 80
    ppo = resolved["train"]["safe_rlhf"]
    assert (ppo["actor_lr"], ppo["critic_lr"], ppo["max_steps"]) == (1.0e-5, 5.0e-6, -1)




def _at(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and float(a) == pytest.approx(float(b),
                                                                                                        rel=1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("name", sorted(PAPER))
def test_the_resolved_paper_config_is_the_protocol_row_by_row(name):
    """config/protocol/paper-*.yaml lists every value the paper or the scripts it cites state (with the
    source) and the values they leave open (with the choice and why): the resolved config holds each."""
    protocol = yaml.safe_load((REPO / "config" / "protocol" / f"paper-{name}.yaml").read_text())
    assert protocol["config"] == f"config/paper-{name}.yaml"
    resolved = load(PAPER[name])
    stated, open_ = protocol["stated"], protocol["open"]
    assert len(stated) >= 40 and len(open_) >= 5
    keys = [row["key"] for row in stated + open_]
    assert len(keys) == len(set(keys)), "a key listed twice"
    unknown_source = [row["key"] for row in stated if row["source"] not in protocol["sources"]]
    assert unknown_source == []
    assert all(row.get("where") for row in stated) and all(row.get("why") for row in open_)
    wrong = []
    for row in stated + open_:
        try:
            value = _at(resolved, row["key"])
        except KeyError:
            wrong.append(f"{row['key']}: not a key of the resolved config")
            continue
        if not _same(value, row["value"]):
            wrong.append(f"{row['key']}: config {value!r}, protocol {row['value']!r} "
                         f"({row.get('source', 'open')} {row.get('where', '')})")
    assert wrong == []


def test_the_documented_protocol_table_names_only_keys_the_protocol_files_list():
    """The 'Protocol choices' table of docs/protocol.md is checked against the protocol files: every key it
    names in its last column is a row of both (or a section whose keys are)."""
    page = (REPO / "docs" / "protocol.md").read_text()
    table = page[page.index("## Protocol choices"):]
    table = table[:table.index("\n\n", table.index("| --- |"))]
    named = set()
    for line in table.splitlines()[3:]:
        last = line.rstrip(" |").rsplit("|", 1)[-1]
        named |= {k.rstrip(".*") for k in re.findall(r"`([a-z_.*]+)`", last)}
    listed = set()
    for name in PAPER:
        protocol = yaml.safe_load((REPO / "config" / "protocol" / f"paper-{name}.yaml").read_text())
        listed |= {row["key"] for row in protocol["stated"] + protocol["open"]}
    missing = sorted(k for k in named if not any(key == k or key.startswith(k + ".") for key in listed))
    assert len(named) > 10 and missing == []
