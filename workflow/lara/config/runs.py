"""Every step's settings as its rules hand them over, built before any job by :func:`lara.config.validate` (after the
schema, before the rules between sections): :func:`settings_runs` builds the settings of every run of every step the
plan makes (a section's keys, the other sections' values it borrows, and the values its rule derives: a pool's seed,
a calibration's N and tau, an online arm's step size), so each settings class's cross-key rules
(:func:`lara.settings.cross_key`) refuse now what its job would refuse later (:func:`settings_problems`);
``tests/unit/test_config_judged.py`` keeps :func:`settings_runs` equal to the ``--settings`` of every job a dry run
plans. Nothing here imports a heavy library: it runs each time the Snakefile is parsed.
"""

from __future__ import annotations

import json

from lara.settings import ConfigError

# ---------------------------------------------------------------------------------------------
# what the plan makes (mirrors rules/*.smk; tests/unit/test_config_judged.py compares them with a dry run)


def constraints(config: dict) -> list:
    """calibration.constraints parsed and checked (lara.constraints.spec): [] when none is listed."""
    from lara.constraints.spec import parse

    return parse(config["calibration"].get("constraints") or [])


def taus(config: dict) -> list[float]:
    """calibration.tau as a list: the main tau first (Safe-RLHF's budget, the audit's headline), then the others."""
    tau = config["calibration"]["tau"]
    return [float(t) for t in (tau if isinstance(tau, list) else [tau])]


def listed(value) -> list:
    return value if isinstance(value, list) else [value]


def bon_star(config: dict) -> bool:
    return "bon" in config["decode"]["methods"] and "star" in config["decode"]["lambdas"]


def certified_settings(config: dict) -> list[str]:
    cal = config["calibration"]
    from lara.settings import CERTIFIED

    return list(CERTIFIED) if cal.get("cost_bounds") is not None and cal["mode"] == "bon" else []


def settings_runs(config: dict) -> list[tuple[str, dict]]:
    """Every ``(settings name, derived values)`` the plan hands a step (``lara.config.step_settings``), one entry
    per distinct run: the rules of rules/*.smk, as :func:`lara.config.step_settings` is called there."""
    from lara.settings import SECTIONS, STEPS, settings_class
    from lara.steps import CORE_DECODERS

    cal, dec = config["calibration"], config["decode"]
    scenarios = config["deployment"]["scenarios"]
    found = constraints(config)
    runs: list[tuple[str, dict]] = []
    skip = {"deployment", "deployment.prompts", "deployment.shift", "prompt-features", "generation", "calibration",
            "coverage", "category-pairs", "train.safe_rlhf", "train.safedpo"}
    runs += [(name, {}) for name in [*SECTIONS, *STEPS] if name not in skip]
    seeds = [config["seed"], config["seed"] + 1] + ([config["seed"] + 2] if scenarios or dec["policies"] else [])
    seeds += [config["seed"] + 3] if dec["budget"]["budgets"] and "bon" in dec["methods"] else []  # the selection pool
    runs += [("generation", {"seed": seed}) for seed in seeds]
    runs += [("train.safe_rlhf", {}), ("train.safedpo", {})]
    bon_n = dec["bon_n"] if cal["mode"] == "bon" else None
    runs.append(("calibration", {"bon_n": bon_n}))
    runs += [("calibration", {"bon_n": bon_n, "tau": t}) for t in taus(config)[1:]]
    if "bon" in dec["methods"] and cal["mode"] == "bon":
        runs += [("calibration", {"bon_n": n}) for n in sorted(set(dec["sweep_n"]) - {dec["bon_n"]})]
    runs += [(name, derived) for name in CORE_DECODERS for derived in settings_class(name).jobs(config)]
    if "bon" in dec["methods"]:
        runs += [("calibration", {"mode": "soft", "bon_n": None, "beta": b, "guarantee": "bootstrap"})
                 for b in sorted(set(cal.get("soft_betas") or []))]
    if certified_settings(config):
        runs.append(("coverage", {}))
    if found:
        runs.append(("calibration", {"bon_n": dec["bon_n"], "mode": "bon", "tau": found[0].tau}))
        runs.append(("coverage", {"tau": found[0].tau}))
        if any(c.category for c in found):
            runs.append(("category-pairs", {}))
    if scenarios:
        runs += [("deployment", {}), ("deployment.prompts", {}), ("deployment.shift", {}), ("prompt-features", {})]
        runs += [("deployment", {"step_size": eta}) for eta in listed(config["deployment"]["step_size"])]
    return runs


def settings_problems(config: dict, schema: dict) -> list[str]:
    """Each step's settings, built as its rules hand them over, refused now as its job would refuse them."""
    from lara.config.schema import section
    from lara.config.steps import settings_json
    from lara.settings import settings_class

    found: dict[str, list[dict]] = {}  # a problem's text -> the derived values of the runs that have it
    for name, derived in settings_runs(config):
        cls = settings_class(name)
        # a data step's source is its own flag (the rule resolves `toy` to the toy world's file)
        given = {"source": section(config, name)["source"]} if "source" in cls.__dataclass_fields__ else {}
        try:
            cls.from_mapping(json.loads(settings_json(config, name, schema, **derived)), name, **given)
        except ConfigError as exc:
            found.setdefault(str(exc).removeprefix("invalid settings: "), []).append(derived)
    # a problem of the settings as the config states them is said as such; one only a derived run has, with it
    problems = [text if any(set(d) <= {"bon_n"} for d in runs) else _settings_line(text, runs[0])
                for text, runs in found.items()]
    for policy, part, section_name, merged in variant_runs(config, schema, with_names=True):
        try:
            settings_class(section_name).from_mapping(merged, section_name)
        except ConfigError as exc:
            problems.append(f"decode.policy_variants.{policy}.{part}: {_settings_line(str(exc), {})}")
    return list(dict.fromkeys(problems))


def variant_runs(config: dict, schema: dict, with_names: bool = False) -> list:
    """The settings of each policy variant's jobs: its base section with the variant's overrides (as the rules'
    ``policy_settings`` builds them; a policy is sampled with seed + 2). ``with_names``: ``(policy, part, section,
    settings)`` tuples instead of the settings alone."""
    from lara.config.steps import settings_json, variant_settings

    out = []
    for policy in config["decode"]["policies"]:
        variant = config["decode"]["policy_variants"].get(policy)
        for part in ("train", "generation"):
            if variant is None or not variant.get(part) or (part == "train" and variant["base"] == "sft"):
                continue
            section_name = "generation" if part == "generation" else f"train.{variant['base']}"
            derived = {"seed": config["seed"] + 2} if part == "generation" else {}
            base = json.loads(settings_json(config, section_name, schema, **derived))
            merged = {k: variant_settings(config, policy, part).get(k, v) for k, v in base.items()}
            out.append((policy, part, section_name, merged) if with_names else merged)
    return out


def _settings_line(text: str, derived: dict) -> str:
    text = text.removeprefix("invalid settings: ")
    if derived:
        text += f" (as a job is given it: {', '.join(f'{k}={v}' for k, v in derived.items())})"
    return text
