"""A configuration judged before any job: the rules between sections that decide whether the plan can do what was
asked, run by :func:`lara.config.validate` after every step's settings (:mod:`lara.config.runs`).

:data:`PLAN_RULES` are the rules that no one step's settings can state (Best-of-N's N against the K a pool holds, a
requested decoder or study that the plan could not produce, a scorer given a role it does not have, a toy value
inherited by an experiment on real text). Each is registered with :func:`plan_rule` and a witness, a config overlay
on config/config.yaml that breaks it (``tests/unit/test_config_judged.py`` checks each is refused). Nothing here
imports a heavy library: it runs each time the Snakefile is parsed.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from lara.config.runs import bon_star, certified_settings, constraints, listed, taus
from lara.settings import ConfigError

# the toy world's fixed facts the rules compare with (lara.toy.world holds them; a test keeps them equal)
TOY_CATEGORIES = ("violence", "crime")
DECODERS = ("bon", "args", "pargs", "cdq")  # decode.methods: their outputs and method names are their own
MODEL_FOLDERS = ("base", "sft", "reward", "cost", "partial_reward", "partial_cost", "value_reward", "value_cost")
# (lara.config.refs.MODEL_FOLDERS adds the base policies, whose names check_policies keeps for them)


@dataclasses.dataclass(frozen=True)
class PlanRule:
    name: str
    check: object  # config -> list of problems
    witness: dict
    keys: tuple[str, ...]


PLAN_RULES: list[PlanRule] = []


def plan_rule(*keys: str, witness: dict):
    """Register a rule between sections: ``check(config)`` returns the problems (lines that start with a config
    key; None for none), ``witness`` is a config overlay on config/config.yaml that breaks it. The registered (and
    returned) check always returns a list."""
    def register(check):
        @functools.wraps(check)
        def problems(config) -> list[str]:
            return check(config) or []
        PLAN_RULES.append(PlanRule(check.__name__, problems, witness, tuple(keys)))
        return problems
    return register


def settings_rules() -> list:
    """The settings classes' cross-key rules validate() runs, each once, in section order."""
    from lara.settings import SECTIONS, STEPS, settings_class

    found = [rule for name in [*SECTIONS, *STEPS] for rule in settings_class(name).cross_key_rules()]
    return list(dict.fromkeys(found))


def plan_problems(config: dict) -> list[str]:
    """Every :data:`PLAN_RULES` problem of a configuration whose schema and settings are valid."""
    return [p for rule in PLAN_RULES for p in rule.check(config)]


# ---------------------------------------------------------------------------------------------
# the rules between sections


@plan_rule("decode.bon_n", "calibration.samples_per_prompt", witness={"decode": {"bon_n": 24, "sweep_n": [4]}})
def bon_within_pool(c):
    """Best-of-N draws N of the K samples a calibration prompt has (bon mode, and the constraints' calibration,
    which is always bon mode)."""
    n, k = c["decode"]["bon_n"], c["calibration"]["samples_per_prompt"]
    if n > k and (c["calibration"]["mode"] == "bon" or c["calibration"].get("constraints")):
        why = "calibration.mode: bon" if c["calibration"]["mode"] == "bon" else "calibration.constraints"
        return [f"decode.bon_n: Best-of-N with N = {n} is calibrated ({why}) on calibration.samples_per_prompt = "
                f"K = {k} samples per prompt; N must be <= K"]


@plan_rule("decode.sweep_n", "decode.bon_n", witness={"decode": {"sweep_n": [4, 32]}})
def sweep_within_n(c):
    too_big = [n for n in c["decode"]["sweep_n"] if n > c["decode"]["bon_n"]]
    if too_big:
        return [f"decode.sweep_n: {too_big} exceed decode.bon_n = {c['decode']['bon_n']} (the candidates per test "
                "prompt)"]


@plan_rule("calibration.constraints", witness={"calibration": {"constraints": [
    {"name": "violence", "cost": "category:violence", "tau": -4.0},
    {"name": "violence", "cost": "category:crime", "tau": -4.0}]}})
def constraints_parse(c):
    try:
        constraints(c)
    except ConfigError as exc:
        return [str(exc)]


@plan_rule("calibration.guarantee", "calibration.constraints", witness={"calibration": {"guarantee": "crc"}})
def crc_one_risk(c):
    if len(c["calibration"].get("constraints") or []) > 1 and c["calibration"].get("guarantee") == "crc":
        return ["calibration.guarantee: crc bounds one risk; with several calibration.constraints use bootstrap or "
                "ltt (ltt holds every constraint at once)"]


@plan_rule("calibration.constraints", "calibration.cost_bounds", witness={"calibration": {"cost_bounds": None,
           "constraints": [{"name": "violence", "cost": "category:violence", "tau": -4.0, "bounds": [-5.5, 5.5]},
                           {"name": "crime", "cost": "category:crime", "tau": -4.5}]}})
def bounds_on_every_constraint(c):
    """LTT and the vector coverage study run when every constraint is bounded: bounds on some only would drop
    them without a word."""
    found = constraints(c)
    bounded = [x.name for x in found if x.bounds is not None]
    if c["calibration"].get("cost_bounds") is None and bounded and len(bounded) < len(found):
        missing = [x.name for x in found if x.bounds is None]
        return [f"calibration.constraints: {', '.join(bounded)} state(s) bounds but {', '.join(missing)} do(es) not, "
                "and calibration.cost_bounds is null: LTT and the coverage study need every constraint bounded; "
                "bound them all (or give calibration.cost_bounds), or none"]


@plan_rule("calibration.mode", "decode.methods", witness={"calibration": {"mode": "soft", "cost_bounds": None}})
def soft_mode_without_bon(c):
    """The soft dual's lambda targets the Gibbs tilt: Best-of-N's sweep (Fig. 1) and the weighted calibration of
    the deployment stage need the bon-mode record."""
    if c["calibration"]["mode"] != "soft":
        return
    out = []
    if "bon" in c["decode"]["methods"]:
        out.append("calibration.mode: soft calibrates the Gibbs tilt, but decode.methods has bon, whose sweep "
                   "(Fig. 1) needs the bon-mode record (calibration.mode: bon); drop bon from decode.methods or use "
                   "bon mode")
    if c["deployment"]["scenarios"]:
        out.append("calibration.mode: soft, but deployment.scenarios are given: the covariate-shift weighted "
                   "calibration is exact for Best-of-N only (bon mode); use bon mode or deployment.scenarios: []")
    return out


@plan_rule("calibration.cost_bounds", "calibration.mode", witness={"calibration": {"mode": "soft"},
                                                                   "decode": {"methods": ["args"]},
                                                                   "deployment": {"scenarios": []}})
def bounds_need_bon(c):
    """Bounds ask for CRC and LTT beside the bootstrap; soft mode computes neither (they are exact for Best-of-N)."""
    if c["calibration"].get("cost_bounds") is not None and c["calibration"]["mode"] == "soft":
        return ["calibration.cost_bounds: given, but calibration.mode: soft computes no crc or ltt lambda (they are "
                "exact for Best-of-N, bon mode) and no coverage study: set cost_bounds: null, or use bon mode"]


@plan_rule("calibration.tau", "decode.methods", "decode.lambdas",
           witness={"calibration": {"tau": [-0.5, -0.3]}, "decode": {"lambdas": ["zero", "hat"]}})
def other_taus_decoded(c):
    """Each other tau is decoded (Best-of-N at its own lambda*, ``star_tau_<tau>``) and audited beside the main
    one: without Best-of-N at lambda* they would be calibrated and never used."""
    if len(taus(c)) > 1 and not bon_star(c):
        return [f"calibration.tau: {len(taus(c))} budgets are listed, but the other taus are decoded and audited as "
                "Best-of-N at their lambda*, and decode.methods/decode.lambdas plan no Best-of-N at star: add bon and "
                "star, or list one tau"]


@plan_rule("calibration.token_level", "decode.methods",
           witness={"calibration": {"token_level": "direct"}, "decode": {"methods": ["bon"]}})
def direct_needs_token_level(c):
    if c["calibration"].get("token_level") == "direct" and not [m for m in c["decode"]["methods"] if m != "bon"]:
        return ["calibration.token_level: direct calibrates the token-level decoders' own lambda, but decode.methods "
                "has none (args, pargs, cdq): nothing would be calibrated"]


@plan_rule("decode.methods", "decode.policies", witness={"decode": {"methods": [], "policies": []}})
def something_evaluated(c):
    if not c["decode"]["methods"] and not c["decode"]["policies"]:
        return ["decode.methods: [] and decode.policies: [] leave nothing to decode, evaluate or audit"]
    if not c["decode"]["methods"]:
        return ["decode.methods: [] decodes nothing with lambda, so the audit and its figure have no decoder; list "
                "at least one of bon, args, pargs, cdq"]


@plan_rule("decode.policy_variants", witness={"decode": {"policies": ["sft", "reward"], "policy_variants": {
    "reward": {"base": "safedpo", "train": {"epochs": 1}}}}})
def variant_names_free(c):
    """A variant with train overrides is its own model folder, models/<name>: a name another model has would be
    that model, never trained."""
    taken = set(MODEL_FOLDERS) | {f"cost_{x.slug}" for x in constraints(c) if x.slug}
    clash = [n for n, v in c["decode"]["policy_variants"].items() if v.get("train") and n in taken]
    out = [f"decode.policy_variants.{n}: the name is the folder of another model (models/{n}); a variant with train "
           "overrides is its own model: give it another name" for n in clash]
    decoders = [n for n in c["decode"]["policy_variants"] if n in DECODERS]
    return out + [f"decode.policy_variants.{n}: the name is a decoder's (decode/{n}/, the method column of the "
                  "evaluation): give the variant another name" for n in decoders]


@plan_rule("deployment.scenarios", witness={"deployment": {"scenarios": [{"name": "a"}, {"name": "a"}]}})
def scenario_names_unique(c):
    names = [s["name"] for s in c["deployment"]["scenarios"]]
    twice = sorted({n for n in names if names.count(n) > 1})
    return [f"deployment.scenarios: the name {n!r} is given twice (each scenario is its own results folder)"
            for n in twice]


@plan_rule("deployment.follows", "calibration.constraints",
           witness={"deployment": {"follows": "constraints"}, "calibration": {"constraints": []}})
def deployment_follows_constraints(c):
    """The deployment stage follows the vector lambda only where the constraints stage calibrates one."""
    if c["deployment"].get("follows") == "constraints" and c["deployment"]["scenarios"] and not constraints(c):
        return ["deployment.follows: constraints, but calibration.constraints is empty: there is no vector lambda to "
                "follow; list the constraints, or deployment.follows: scalar"]


@plan_rule("deployment.prompts.source", "toy.n_deployment_prompts", "toy.held_out_topic", "toy.harmful_fraction",
           witness={"toy": {"held_out_topic": None}})
def toy_pool_has_strata(c):
    """A stream drawn from the toy world's deployment pool: the pool exists, and holds each stratum its scenarios
    draw from."""
    if not c["deployment"]["scenarios"] or c["deployment"]["prompts"]["source"] != "toy":
        return
    toy = c["toy"]
    if not _toy_text(c):
        return ["deployment.prompts.source: toy (the default) draws the streams from the toy world's deployment pool, "
                f"but this experiment's prompts are not the toy world's (data.prompts.source: "
                f"{c['data']['prompts']['source']!r}): the shift would be measured against other prompts; name the "
                "deployment prompts (a local file or a hub dataset), or deployment.scenarios: []"]
    if toy["n_deployment_prompts"] == 0:
        return ["deployment.scenarios: given, but toy.n_deployment_prompts is 0: the toy deployment pool is empty"]
    n_harmful = int(round(toy["n_deployment_prompts"] * toy["harmful_fraction"]))  # lara.toy.world.split_requests
    n_benign = toy["n_deployment_prompts"] - n_harmful
    pool = (f"the toy deployment pool (toy.n_deployment_prompts {toy['n_deployment_prompts']} at "
            f"toy.harmful_fraction {toy['harmful_fraction']:g}: {n_harmful} harmful, {n_benign} benign)")
    out = []
    for s in c["deployment"]["scenarios"]:
        held = listed(s.get("held_out_share", 0))
        harmful = s.get("harmful_share")
        if toy["held_out_topic"] is None and any(x > 0 for x in held):
            out.append(f"deployment.scenarios.{s['name']}.held_out_share: {s.get('held_out_share')} draws from the "
                       "held_out stratum, but toy.held_out_topic is null: the pool has no held-out prompts")
        shares = [] if harmful is None else listed(harmful)
        if n_harmful == 0 and any(x > 0 for x in shares):
            out.append(f"deployment.scenarios.{s['name']}.harmful_share: {harmful} draws harmful prompts, but {pool} "
                       "has none")
        if n_benign == 0 and any(x < 1 for x in shares):
            out.append(f"deployment.scenarios.{s['name']}.harmful_share: {harmful} draws benign prompts, but {pool} "
                       "has none")
    return out


@plan_rule("deployment.window", "deployment.stream_length", "deployment.shift.folds", "data.prompts.n_calibration",
           witness={"deployment": {"shift": {"folds": 10, "n_prompts": 100}, "stream_length": 8, "window": 8}})
def shift_folds_filled(c):
    """The shift check cross-fits on both samples: each needs a prompt per fold."""
    if not c["deployment"]["scenarios"]:
        return
    folds = c["deployment"]["shift"]["folds"]
    sizes = {"deployment.stream_length": c["deployment"]["stream_length"],
             "data.prompts.n_calibration": c["data"]["prompts"]["n_calibration"]}
    if c["deployment"]["prompts"]["source"] == "toy":  # the stream's distinct prompts are at most the pool's
        sizes["toy.n_deployment_prompts"] = c["toy"]["n_deployment_prompts"]
    return [f"deployment.shift.folds: {folds} folds need at least as many prompts in each sample, but {key} is {n}"
            for key, n in sizes.items() if n is not None and n < folds]


@plan_rule("data.prompts.n_calibration", witness={"data": {"prompts": {"n_calibration": 1}}})
def calibration_prompts(c):
    n = c["data"]["prompts"]["n_calibration"]
    if n is not None and n < 2:
        return [f"data.prompts.n_calibration: {n}; a calibration needs at least 2 prompts (its bootstrap resamples "
                "prompts)"]


@plan_rule("data.prompts.n_calibration", "data.prompts.n_test", "toy.n_eval_prompts",
           witness={"data": {"prompts": {"n_calibration": 300, "n_test": 256}}})
def toy_prompts_suffice(c):
    """The toy world's evaluation pool holds toy.n_eval_prompts distinct prompts: the splits draw from it."""
    p = c["data"]["prompts"]
    if p["source"] != "toy":
        return
    from_pool = p.get("calibration_from", "pool") != "preferences"
    need = (p["n_calibration"] or 0) * from_pool + (p["n_test"] or 0)
    if need > c["toy"]["n_eval_prompts"]:
        what = "n_calibration + n_test" if from_pool else "n_test"
        return [f"data.prompts: {what} = {need} prompts, but the toy world's evaluation pool holds "
                f"toy.n_eval_prompts = {c['toy']['n_eval_prompts']}"]


@plan_rule("data.prompts.column", witness={"data": {"prompts": {"column": "question"}}})
def toy_prompt_column(c):
    p = c["data"]["prompts"]
    if p["source"] == "toy" and p["column"] != "prompt":
        return [f"data.prompts.column: {p['column']!r}, but the toy world's prompts are in the column 'prompt'"]


@plan_rule("calibration.constraints", "data.preferences.source",
           witness={"calibration": {"constraints": [{"name": "fraud", "cost": "category:fraud", "tau": -4.0}]}})
def toy_categories_labelled(c):
    if c["data"]["preferences"]["source"] != "toy":
        return
    return [f"calibration.constraints.{x.name}.cost: the harm category {x.category!r} is not labelled in the toy "
            f"world's preference data (labelled: {', '.join(TOY_CATEGORIES)})"
            for x in constraints(c) if x.category is not None and x.category not in TOY_CATEGORIES]


@plan_rule("reference_policy", "base_model.name_or_path",
           witness={"reference_policy": "base", "base_model": {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}})
def base_reference_is_local(c):
    from lara.config.refs import looks_local

    name = c["base_model"]["name_or_path"]
    if c.get("reference_policy") == "base" and name != "toy" and not looks_local(name) and not Path(name).is_dir():
        return [f"reference_policy: base copies the base model's folder as pi_ref, but base_model.name_or_path "
                f"{name!r} is not a local folder (a hub id is read from the hub cache by the steps, never copied): "
                "import or download it to a folder and name that, or use reference_policy: sft"]


@plan_rule("evaluation.judge.model", "evaluation.judge.base_url",
           witness={"evaluation": {"judge": {"model": "gpt-4o-mini", "base_url": None}}})
def judge_reachable(c):
    judge = c["evaluation"]["judge"]
    if judge["model"] is None and judge["base_url"] is not None:
        return ["evaluation.judge.base_url: an endpoint is given, but evaluation.judge.model is null: the judge would "
                "be skipped; name the model, or base_url: null to run without a judge"]
    if judge["model"] not in (None, "oracle") and judge["base_url"] is None:
        return [f"evaluation.judge.model: {judge['model']!r} is set, but evaluation.judge.base_url is null: the judge "
                "would be skipped; give the endpoint, or model: null to run without a judge"]


def _toy_text(c) -> bool:
    """Whether the experiment's texts are the toy world's: its prompts (from the toy world, or a copy of them on a
    hub), or its model (the toy model writes only toy answers; a real model answering toy prompts is scored by the
    oracle too, as make smol does)."""
    return c["data"]["prompts"]["source"] == "toy" or c["base_model"]["name_or_path"] == "toy"


@plan_rule("evaluation.reward_model", "evaluation.cost_model", "evaluation.judge.model", "calibration.constraints",
           witness={"data": {"prompts": {"source": "lab/real-prompts"}},
                    "base_model": {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}})
def oracle_on_toy_text(c):
    """The toy oracle knows the toy world's requests and answers only: a value inherited from the toy config by an
    experiment on other prompts would score text it cannot read."""
    if _toy_text(c):
        return
    where = (f"neither the prompts (data.prompts.source {c['data']['prompts']['source']!r}) nor the model "
             f"(base_model.name_or_path {c['base_model']['name_or_path']!r}) are the toy world's")
    keys = [("evaluation.reward_model", c["evaluation"]["reward_model"]),
            ("evaluation.cost_model", c["evaluation"]["cost_model"]),
            ("evaluation.judge.model", c["evaluation"]["judge"]["model"]),
            ("calibration.constraint_reward", c["calibration"].get("constraint_reward"))]
    for x in constraints(c):
        keys += [(f"calibration.constraints.{x.name}.cost", x.cost)]
        keys += [(f"calibration.constraints.{x.name}.evaluation", x.evaluation or c["evaluation"]["cost_model"])]
    fallback = " (a constraint without `evaluation` is audited with evaluation.cost_model)"
    return [f"{key}: {value!r} is the toy world's oracle, but {where}: name a scorer of real text"
            + (fallback if key.endswith(".evaluation") else "")
            for key, value in keys if isinstance(value, str) and value.partition(":")[0] == "oracle"]


@plan_rule("calibration.constraints", "evaluation.cost_model", "evaluation.reward_model",
           "calibration.constraint_reward",
           witness={"calibration": {"constraints": [{"name": "harm", "cost": "category:violence", "tau": -4.0}]}})
def scorer_roles(c):
    """Every named-scorer spec is given a role it has (the toy oracle's harm categories, hatesonar's classes,
    fluency as a reward) and the argument it takes: the check lara.scoring.load_scorer makes when a job loads it."""
    from lara.scorer_specs import spec_problem

    uses = [("evaluation.reward_model", c["evaluation"]["reward_model"], "reward"),
            ("evaluation.cost_model", c["evaluation"]["cost_model"], "cost"),
            ("calibration.constraint_reward", c["calibration"].get("constraint_reward"), "reward")]
    for x in constraints(c):
        if x.category is None and x.cost not in ("reward", "cost"):
            uses.append((f"calibration.constraints.{x.name}.cost", x.cost, x.name))
        uses.append((f"calibration.constraints.{x.name}.evaluation", x.evaluation or c["evaluation"]["cost_model"],
                     x.name))
        for i, spec in enumerate(c["evaluation"].get("judges") or []):
            uses.append((f"evaluation.judges[{i}] (for {x.name})", spec, x.name))
    fallen = {f"calibration.constraints.{x.name}.evaluation" for x in constraints(c) if x.evaluation is None}
    out = []
    for key, spec, role in uses:
        if spec is None:
            continue
        problem = spec_problem(spec, role)
        if problem:
            fallback = " (no `evaluation` given: evaluation.cost_model)" if key in fallen else ""
            out.append(f"{key}: {spec!r}{fallback}: {problem}")
    return out


@plan_rule("calibration.guarantee", "deployment.scenarios", "deployment.follows", witness={
    "calibration": {"guarantee": "ltt_wsr"}})
def weighted_guarantee(c):
    """The scalar deployment stage recalibrates with covariate-shift weights under calibration.guarantee, and the
    betting LTT has no weighted version."""
    from lara.settings import WEIGHTED

    weighted = ("bootstrap", *WEIGHTED)
    dep = c.get("deployment") or {}
    if dep.get("scenarios") and dep.get("follows", "scalar") == "scalar" and \
            c["calibration"]["guarantee"] not in weighted:
        return [f"calibration.guarantee: {c['calibration']['guarantee']} has no covariate-shift weighted version, but "
                "the deployment stage (deployment.scenarios) recalibrates lambda with the shift check's weights under "
                f"it; deploy one of {', '.join(weighted)} or follow the constraints (deployment.follows)"]


@plan_rule("evaluation.judges", "calibration.constraints", witness={
    "evaluation": {"judges": ["hatesonar:hate"]},
    "calibration": {"constraints": [{"name": "hate", "cost": "hatesonar:hate", "tau": 0.04}]}})
def judges_independent(c):
    """A judge is a scorer the decoder never saw (lara.scorer_specs.judge_problem: never a constraint's decoding
    score or the decoding reward, never a reward, never the experiment's own models), named once, and only where
    a constraints stage has an audit to judge."""
    from lara.scorer_specs import judge_problem

    judges = c["evaluation"].get("judges") or []
    out = [f"evaluation.judges: {spec!r} is listed twice" for i, spec in enumerate(judges) if spec in judges[:i]]
    costs = {x.name: x.cost for x in constraints(c)}
    reward = c["calibration"].get("constraint_reward")
    for i, spec in enumerate(judges):
        problem = judge_problem(spec, costs, reward) if costs else None
        if problem:
            out.append(f"evaluation.judges[{i}]: {spec!r}: {problem}")
    if judges and not costs:
        out.append("evaluation.judges: judges score the constraints stage's audit, but calibration.constraints is "
                   "empty")
    return out


@plan_rule("calibration.constraints", witness={"calibration": {"constraints": [
    {"name": "violence", "cost": "category:violence", "tau": -4.0, "evaluation": "category:violence"}]}})
def evaluation_is_a_scorer(c):
    """A constraint's evaluation scorer is a scorer spec: the decoding cost's words (``cost``, ``reward``,
    ``category:<c>``, the models this experiment trains) would audit the decoder with the scorer it optimised."""
    return [f"calibration.constraints.{x.name}.evaluation: {x.evaluation!r} is the decoding cost's vocabulary (the "
            "experiment's own trained models), not an evaluation scorer: the audit would measure the decoder with "
            "what it optimised; name a scorer (a named scorer, a model folder or hub id), or leave it out for "
            "evaluation.cost_model" for x in constraints(c) if _own_model(x.evaluation)]


def _own_model(spec) -> bool:
    """Whether a scorer spec is one of the experiment's own trained models (the decoding cost's vocabulary)."""
    return spec is not None and (spec in ("cost", "reward") or spec.startswith("category:"))


@plan_rule("calibration.constraints", "evaluation.cost_model", witness={
    "evaluation": {"cost_model": "PKU-Alignment/beaver-7b-unified-cost"},
    "calibration": {"constraints": [{"name": "violence", "cost": "category:violence", "tau": -4.0,
                                     "bounds": [-5.5, 5.5]}]}})
def fallback_evaluation_has_roles(c):
    """A constraint without ``evaluation`` is audited with evaluation.cost_model given the constraint's name as its
    role: only a named scorer has roles; a model folder or hub id scores one overall harm, not this constraint's."""
    from lara.scorer_specs import named_scorers

    spec = c["evaluation"]["cost_model"]
    if spec.partition(":")[0] in named_scorers():
        return
    return [f"calibration.constraints.{x.name}.evaluation: not given, so evaluation.cost_model {spec!r} would audit "
            f"it, but that model scores one overall harm, not {x.name!r}; state the constraint's evaluation scorer"
            for x in constraints(c) if x.evaluation is None]


@plan_rule("coverage.samples_per_prompt", "decode.bon_n", "calibration.samples_per_prompt",
           witness={"coverage": {"samples_per_prompt": [4]}})
def coverage_sizes(c):
    """The coverage studies draw K samples per prompt from a population of the calibration samples (K_cal each)
    and, with Best-of-N decoded, the test prompts' N candidates: each K is in [N, the population's K]."""
    sizes = c["coverage"].get("samples_per_prompt")
    studies = bool(certified_settings(c)) or len(constraints(c)) > 1
    if not sizes or not studies:
        return
    n, k_cal = c["decode"]["bon_n"], c["calibration"]["samples_per_prompt"]
    k_pop = min(k_cal, n) if ("bon" in c["decode"]["methods"] or len(constraints(c)) > 1) else k_cal
    bad = [k for k in sizes if not n <= k <= k_pop]
    if bad:
        return [f"coverage.samples_per_prompt: {bad} outside [decode.bon_n = {n}, the population's K = {k_pop}]: each "
                "draw calibrates Best-of-N with N = decode.bon_n from K samples per prompt"]


@plan_rule("coverage.n_prompts", "calibration.constraints", witness={"coverage": {"n_prompts": [1, 50]}})
def coverage_prompts(c):
    small = [n for n in c["coverage"]["n_prompts"] if n < 2]
    if small and (certified_settings(c) or len(constraints(c)) > 1):
        return [f"coverage.n_prompts: {small}: each draw needs at least 2 prompts (its bootstrap resamples them; LTT "
                "splits them)"]


@plan_rule("calibration.cost_bounds", "decode.methods", witness={"decode": {"methods": ["args", "pargs"]}})
def bounds_decoded(c):
    """Bounds ask for the crc and ltt decodes, which are Best-of-N's."""
    if certified_settings(c) and "bon" not in c["decode"]["methods"]:
        return ["calibration.cost_bounds: given, which asks for Best-of-N at the crc and ltt lambdas, but "
                "decode.methods has no bon; add bon, or set cost_bounds: null"]


@plan_rule("calibration.constraints", witness={"calibration": {"constraints": [
    {"name": "violence", "cost": "category:violence", "tau": -4.0, "bounds": [-5.5, 5.5]},
    {"name": "crime", "cost": "category:crime", "tau": 1e-9, "bounds": [-5.5, 5.5]}]}})
def constraint_taus_resolved(c):
    """Each constraint's tau is compared with costs to 1e-12 (as the calibration's own tau is)."""
    from lara.settings import COST_RESOLUTION

    return [f"calibration.constraints.{x.name}.tau: {x.tau:g} is within {COST_RESOLUTION:g} of 0, below the "
            "resolution the calibration compares costs with; rescale the costs and tau"
            for x in constraints(c) if x.tau != 0 and abs(x.tau) < COST_RESOLUTION]


@plan_rule("calibration.soft_betas", witness={"calibration": {"soft_betas": [1.0, 1.0, 10.0]}})
def soft_betas_distinct(c):
    betas = c["calibration"].get("soft_betas") or []
    twice = sorted({b for b in betas if betas.count(b) > 1})
    if twice:
        return [f"calibration.soft_betas: {twice} given twice (each beta is one calibration and one curve)"]
