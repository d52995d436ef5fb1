"""The table of every cross-key rule :func:`lara.config.validate` runs, each with its witness (a configuration on
config/config.yaml that breaks it) and what validate says of it: ``python -m lara.config.table`` prints it,
docs/faults.md holds it and tests/unit/test_config_judged.py keeps it current."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from lara.config import ConfigError, load_yaml, merge, validate
from lara.config import plan as config_plan


def all_rules() -> list[tuple[str, tuple[str, ...], dict]]:
    """Every cross-key rule validate() runs: ``(name, keys, witness)``, the settings classes' then the plan's."""
    return ([(rule.__qualname__, rule.cross_key.keys, rule.cross_key.witness) for rule in config_plan.settings_rules()]
            + [(r.name, r.keys, r.witness) for r in config_plan.PLAN_RULES])


def _flat(witness: dict, prefix: str = "") -> str:
    return "; ".join(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value
                     else f"{prefix}{key}: {json.dumps(value)}" for key, value in witness.items())


def rules_markdown(toy_config: str | Path = "config/config.yaml") -> str:
    """The rules as a Markdown table: each rule, the keys it reads, its witness (an overlay on config/config.yaml)
    and what validate() says of it (the first line naming one of its keys)."""
    toy = load_yaml(toy_config)
    lines = ["| rule | keys | a configuration that breaks it (on config/config.yaml) | validate-config says |",
             "| --- | --- | --- | --- |"]
    for name, keys, witness in all_rules():
        try:
            validate(merge(copy.deepcopy(toy), witness))
            said = "(accepted: the witness is stale)"
        except ConfigError as exc:
            said_lines = [line.strip()[2:] for line in str(exc).splitlines()[1:]]
            found = ([line for line in said_lines if line.startswith(keys[0])]
                     or [line for line in said_lines if any(k in line for k in keys)] or said_lines[-1:])
            said = found[0]
        cell = said.replace("|", "\\|")
        lines.append(f"| `{name}` | {', '.join(keys)} | `{_flat(witness)}` | {cell} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(rules_markdown(), end="")
