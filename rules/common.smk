# Shared by every stage: config validation (before any job runs), input functions,
# resources and target lists. No rules here.
import json
import os
import shlex
import sys
from pathlib import Path

from lara import config as lara_config
from lara.constraints import spec as lara_constraints
from lara.realtext.pins import wheel_pin
from lara import hub
from lara.calibrate.record import literal_name, parse_setting, parse_tau_name, setting_tau, tau_name
from lara.codehash import named_scorer_modules, step_code  # a rule's code param: its step's import closure
from lara.runtime import cpu_kernel_environment
from lara.config.runs import certified_settings
from lara.settings import CERTIFIED
from snakemake.logging import logger

# The rules call `lara`. Under `--sdm conda` each job runs the one in its conda environment (each environment's
# post-deploy script, envs/install-lara.sh, installs this checkout into it, editable, from LARA_SOURCE). Otherwise
# the one installed beside the Python that runs Snakemake comes first on every job's PATH, so
# `.venv/bin/snakemake ...` works without activating the environment. Set in the jobs' shell prefix (with bash's
# strict mode, Snakemake's default prefix), not in this process's environment.
os.environ.update(LARA_SOURCE=str(Path(workflow.current_basedir.get_path_or_uri(secret_free=True)).parent.resolve()))
_under_conda = "CONDA" in {m.name for m in workflow.deployment_settings.deployment_method}
_venv_path = "" if _under_conda else f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH; "
shell.prefix(f"set -euo pipefail; {_venv_path}")

# The configuration is layered by lara.config.layers, not by Snakemake's merge: the Snakefile's configfile
# (the toy default), then each --configfile, then --config. A file that names an experiment starts afresh
# (or from the file it `extends:`), so `--configfile config/paper-llama.yaml` never inherits a toy value.
_cli_files = [
    os.path.relpath(f) if Path(f).resolve().is_relative_to(Path.cwd()) else str(f)
    for f in workflow.overwrite_configfiles
]
_sources = [str(f) for f in workflow.configfiles[len(workflow.overwrite_configfiles) :]] + _cli_files
_schema = lara_config.load_schema()  # the installed package's (config/schema.yaml links to it in a checkout)
if workflow.modifier.is_module and workflow.modifier.skip_configfile:
    # used as a module (`module lara: snakefile: ... config: ...`): the mapping the caller gives is the experiment
    # (its `extends:` a config file to build on), never the files of the calling workflow
    _sources = [lara_config.MODULE_CONFIG]
    CONFIG_LAYERS = lara_config.module_layers(config)
    config = dict(config)  # this module's own: the validated config below never changes the caller's mapping
else:
    CONFIG_LAYERS = lara_config.layers(*_sources, overrides=dict(workflow.config_settings.config))
_validated = lara_config.validate(
    lara_config.merged(CONFIG_LAYERS),
    schema=_schema,
    source=", ".join(_sources + (["--config"] if workflow.config_settings.config else [])),
    layer_list=CONFIG_LAYERS,
    root=Path("."),
)
# results/{experiment}/ of another configuration (its settings.tsv names the file that named the experiment): refused
lara_config.check_results(CONFIG_LAYERS, _validated["experiment"], Path("results"))
config.clear()
config.update(_validated)

# the layers as JSON: the experiment_settings job writes results/{exp}/settings.tsv from them (every value, its origin)
# (execution sections left out: changing resources or numerics reruns nothing)
CONFIG_LAYERS_JSON = json.dumps(lara_config.result_layers(CONFIG_LAYERS), sort_keys=True)

# The CPU kernels every job runs (numerics.cpu_kernels; see lara.runtime): exported to the jobs.
os.environ.update(cpu_kernel_environment(config["numerics"]["cpu_kernels"]))

EXP = config["experiment"]
RESULTS = f"results/{EXP}"
TOY_FILES = {
    "sft": f"{RESULTS}/toy/alpaca.jsonl",
    "preferences": f"{RESULTS}/toy/safe_rlhf.jsonl",
    "prompts": f"{RESULTS}/toy/prompts.jsonl",
    "deployment": f"{RESULTS}/toy/deployment.jsonl",
}

# policies: the base ones and the decode.policy_variants; a variant with train overrides is its own model,
# trained by its base's rule (models/{name}); one with generation overrides only samples its base's model
VARIANTS = config["decode"]["policy_variants"]
POLICIES = [*lara_config.BASE_POLICIES, *VARIANTS]
TRAINED_POLICIES = {
    base: [base, *(n for n, v in VARIANTS.items() if v["base"] == base and v.get("train"))]
    for base in lara_config.TRAIN_SECTIONS
}


def policy_model(name):
    """The model directory a policy samples: its own when it is trained, else its base's."""
    v = VARIANTS.get(name)
    return name if v is None or v.get("train") else v["base"]


def policy_settings(name, part, **derived):
    """A policy's train or generation settings JSON: the section's keys with the variant's overrides (and
    the other sections' values the step reads, as step_settings gives them)."""
    base = json.loads(
        step_settings(
            (
                "generation"
                if part == "generation"
                else lara_config.TRAIN_SECTIONS[VARIANTS[name]["base"] if name in VARIANTS else name]
            ),
            **derived,
        )
    )
    overrides = lara_config.variant_settings(config, name, part)
    return json.dumps({k: overrides.get(k, v) for k, v in base.items()}, sort_keys=True)


NOTHING = "(?!)"  # a wildcard that matches no value: a target for a scenario or category the config lacks has no rule


def refused_target(target, why):
    """A target the configuration does not plan (a stage it turns off, a scenario it lacks): refused with the
    reason when Snakemake builds the DAG, before any job."""
    raise lara_config.ConfigError(f"{target}: {why}")


def _alternatives(names):
    return "|".join(sorted(names, key=len, reverse=True)) or NOTHING


WILDCARDS = {
    "exp": EXP,
    "n": "[0-9]+",
    "k": "[0-9]+",
    "kind": "reward|cost",
    "method": "args|pargs|cdq",
    "pool": "calibration|value|bon|deployment|selection",
    "scenario": _alternatives([s["name"] for s in config["deployment"]["scenarios"]]),
    "eta": "[0-9]+(p[0-9]+)?",
    "lam": "zero|hat|star|max|direct|crc|ltt_wsr|ltt|star_tau_m?[0-9]+(p[0-9]+)?|[0-9]+(p[0-9]+)?",
    "tau": "m?[0-9]+(p[0-9]+)?",
    "beta": "[0-9]+(p[0-9]+)?",
    "policy": _alternatives(POLICIES),
    "safe_rlhf_model": _alternatives(TRAINED_POLICIES["safe_rlhf"]),
    "safedpo_model": _alternatives(TRAINED_POLICIES["safedpo"]),
    "decoder": "bon|bon_prune|args|pargs|cdq",
    "figure": "[a-z_]+",
}


# the scorer models of each token-level method, by role
RGTG_SCORERS = {"args": "{kind}", "pargs": "partial_{kind}", "cdq": "value_{kind}"}


def rgtg_scorer(kind):
    """Input function: the reward or cost scorer that a decode_rgtg job's method uses."""
    return lambda w: f"{RESULTS}/models/{RGTG_SCORERS[w.method].format(kind=kind)}"


def opts(**options):
    """Shell-quoted command-line options (`--max-examples 5`), skipping None values. Rules pass
    this string as a param, so it changes exactly when the config slice it encodes changes."""
    parts = []
    for key, value in options.items():
        if value is not None:
            parts += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(parts)


def data_source(kind):
    """The source string of a data set: the toy world's file, a local path, or a hub id."""
    source = config["data"][kind]["source"]
    return TOY_FILES[kind] if source == "toy" else source


def data_input(kind):
    """File inputs of a data set (for a hub id: the fetch_hub manifest), so Snakemake tracks local files."""
    source = data_source(kind)
    made = source in TOY_FILES.values() or source.startswith(f"{RESULTS}/")  # a file a rule of this run writes
    return [source] if made or Path(source).exists() else hub_input(f"data.{kind}.source")


# The hub models and data sets the experiment names (lara.hub): the fetch_hub step downloads them into the hub
# cache where the network is; the jobs that read them take its manifest as an input and read only the cache.
HUB_REFS = hub.references(config, Path("."), scorers=lara_config.named_scorer_names())
HUB_MANIFEST = f"{RESULTS}/hub.json"


def hub_input(*keys):
    """The fetch_hub manifest, for a job that reads one of these config keys' hub references."""
    return [HUB_MANIFEST] if any(r.key in keys for r in HUB_REFS) else []


def calibration_preferences_input():
    """The preference data, when the calibration prompts come from it (data.prompts.calibration_from)."""
    if config["data"]["prompts"]["calibration_from"] == "preferences":
        return [f"{RESULTS}/data/preferences.parquet"]
    return []


def held_out_options():
    """Where calibration prompts come from the preference data: that file, and the reward/cost
    trainers' eval_fraction:seed, whose held-out pairs' prompts it must avoid."""
    if not calibration_preferences_input():
        return ""
    pairs = sorted({f"{config['train'][k]['eval_fraction']}:{config['seed']}" for k in ("reward", "cost")})
    return shlex.join(["--calibration-preferences", calibration_preferences_input()[0], "--exclude-held-out", *pairs])


def step_settings(name, **derived):
    """The --settings JSON of a step (lara.config.step_settings): its section's keys (lara.settings.SECTIONS),
    the other sections' values it reads (seed, base_model.dtype, ...), and values this rule derives (a pool's
    seed, a calibration's N); sorted, so it changes exactly when one of them does. The one way in."""
    return lara_config.settings_json(config, name, _schema, **derived)


# the prompt pools sampled from pi_ref and scored (rules sample and score): their prompts, responses per
# prompt (K, the CD-Q samples, N), a cap on prompts, and the seed
SAMPLE_POOLS = {
    "calibration": {
        "prompts": f"{RESULTS}/data/prompts_calibration.parquet",
        "n": config["calibration"]["samples_per_prompt"],
        "max_prompts": None,
        "seed": config["seed"],
    },
    "value": {
        "prompts": f"{RESULTS}/data/prompts_value.parquet",
        "n": config["train"]["value"]["samples_per_prompt"],
        "max_prompts": None,
        "seed": config["seed"],
    },
    "bon": {
        "prompts": f"{RESULTS}/data/prompts_test.parquet",
        "n": config["decode"]["bon_n"],
        "max_prompts": None,
        "seed": config["seed"] + 1,
    },
    "selection": {  # the token-budget chooser's own prompts (decode.budget), sampled as the calibration prompts
        "prompts": f"{RESULTS}/data/prompts_selection.parquet",
        "n": config["calibration"]["samples_per_prompt"],
        "max_prompts": None,
        "seed": config["seed"] + 3,
    },
    "deployment": {
        "prompts": f"{RESULTS}/data/prompts_deployment.parquet",
        "n": config["deployment"]["samples_per_prompt"],
        "max_prompts": None,
        "seed": config["seed"] + 2,
    },
}


def sample_options(pool):
    p = SAMPLE_POOLS[pool]
    return opts(n=p["n"], max_prompts=p["max_prompts"], tensor_parallel=tensor_parallel("sample"))


def sample_settings(pool):
    """The generation settings of a pool, with its own seed."""
    return step_settings("generation", seed=SAMPLE_POOLS[pool]["seed"])


def tensor_parallel(rule):
    """The GPUs a vLLM engine splits the model over: the rule's gpu resource (only said when above 1)."""
    gpus = job_resources(rule).get("gpu", 0)
    return gpus if config["generation"]["backend"] == "vllm" and gpus > 1 else None


def launcher(rule):
    """How a training job starts `lara`: alone, or under `accelerate launch` with the rule's processes
    (resources: processes, default one per GPU), each given its share of the job's threads, a free
    rendezvous port (two jobs on one node never collide) and the rule's accelerate config file
    (FSDP / DeepSpeed; resources: accelerate_config) when it names one (lara.config.launch_command)."""
    return shlex.join(lara_config.launch_command(launch_plan(rule)))


def launch_plan(rule):
    """The processes, threads per process and accelerate config of a rule (checked when the config is read)."""
    return lara_config.launch_plan(_rule_resources(rule), f"resources.rules.{rule}")


def base_model_path():
    """The base model to fine-tune: the toy model directory, or a hub id / local path."""
    name = config["base_model"]["name_or_path"]
    return f"{RESULTS}/models/base" if name == "toy" else name


def base_model_input():
    path = base_model_path()
    return [path] if path == f"{RESULTS}/models/base" or Path(path).exists() else []


def base_model_arg(wildcards, input):
    """The --model argument of SFT: the base model input when it is a folder, else the hub id."""
    return input.base if input.base else base_model_path()


def calibration_settings(bon_n, **tau):
    """The calibration's settings; in bon mode for Best-of-N of size bon_n (decode.bon_n, or a Fig. 1 size);
    for the main tau unless another listed one is given (tau=...)."""
    return step_settings("calibration", bon_n=bon_n if config["calibration"]["mode"] == "bon" else None, **tau)


# calibration.tau may list several budgets: the first is the main one (lambda.json, the `hat` and `star`
# settings, Safe-RLHF's budget); each other one gets its own calibration (calibration/tau_<tau>/lambda.json) and
# lambda* decodes (the `star_tau_<tau>` setting) from the same samples, scores and models
TAUS = lara_config.taus(config)
OTHER_TAUS = TAUS[1:]


def tau_lambda_json(tau):
    return f"{RESULTS}/calibration/tau_{tau_name(tau)}/lambda.json"


def tau_lambda_inputs():
    return [tau_lambda_json(t) for t in OTHER_TAUS]


# every lambda setting decoded: decode.lambdas, plus lambda* of each other tau when `star` is decoded
DECODE_SETTINGS = list(config["decode"]["lambdas"]) + (
    [f"star_tau_{tau_name(t)}" for t in OTHER_TAUS] if "star" in config["decode"]["lambdas"] else []
)
# calibration.token_level: direct: each token-level decoder also gets a lambda calibrated for itself (the
# `direct` setting, read from calibration/direct_<method>.json), beside Best-of-N's lambda* (`star`)
DIRECT_METHODS = (
    [m for m in config["decode"]["methods"] if m != "bon"] if config["calibration"]["token_level"] == "direct" else []
)


# calibration.cost_bounds (bon mode): Best-of-N is also decoded at the certified lambdas (the `crc` and `ltt`
# settings, read from lambda.json), beside the deployed lambda* (`star`); they are exact for Best-of-N only
CERTIFIED_SETTINGS = certified_settings(config)


# decode.bon_prune: pruned Best-of-N (docs/pruned.md), beside Best-of-N, with its own lambda record: its hat, star and
# certified settings read calibration/lambda_bon_prune.json (never Best-of-N's lambda.json)
PRUNE = bool(config["decode"]["bon_prune"]["checkpoints"]) and "bon" in config["decode"]["methods"]
PRUNE_LAMBDA = f"{RESULTS}/calibration/lambda_bon_prune.json"
DECODED_METHODS = list(config["decode"]["methods"]) + (["bon_prune"] if PRUNE else [])
# decode.budget: at each token budget the certified decoder, Best-of-k or a pruned schedule, chosen on the selection
# prompts (docs/budget.md; rules/decode.smk: choose_decoder)
BUDGET = bool(config["decode"]["budget"]["budgets"]) and "bon" in config["decode"]["methods"]
BUDGET_CHOICE = f"{RESULTS}/decode/budget/choice.json"


def method_settings(method):
    """The lambda settings a method is decoded at: every one of DECODE_SETTINGS, `direct` for a token-level
    decoder calibrated for itself, and the certified lambdas for Best-of-N; pruned Best-of-N at every setting but
    another tau's lambda* (it is calibrated for the main tau only) and at its own certified lambdas."""
    if method == "bon_prune":
        return [s for s in DECODE_SETTINGS if not s.startswith("star_tau_")] + CERTIFIED_SETTINGS
    extra = ["direct"] if method in DIRECT_METHODS else CERTIFIED_SETTINGS if method == "bon" else []
    return DECODE_SETTINGS + [e for e in extra if e not in DECODE_SETTINGS]


def direct_lambda_json(method):
    return f"{RESULTS}/calibration/direct_{method}.json"


def sweep_sizes():
    """The Best-of-N sizes of Fig. 1: decode.sweep_n plus the decoder's own N."""
    return sorted(set(config["decode"]["sweep_n"]) | {config["decode"]["bon_n"]})


def core_lambda_inputs():
    """Best-of-k through the calibration core for every Fig. 1 size (bon mode): records the sweep audits beside the
    exact calibration of the same N (rules/calibrate.smk: calibrate_best_of_k)."""
    if config["calibration"]["mode"] != "bon":
        return []
    return [f"{RESULTS}/calibration/lambda_bon_k{k}.json" for k in sweep_sizes()]


def soft_lambda_inputs():
    """The soft-mode calibrations of the arm calibration.soft_betas (one lambda.json per distinct beta)."""
    betas = sorted({float(b) for b in config["calibration"]["soft_betas"]})
    return [f"{RESULTS}/calibration/lambda_soft_beta{literal_name(b)}.json" for b in betas]


def sweep_lambda_inputs():
    """lambda.json (the decoder's N) and, in bon mode, one calibration per other sweep size."""
    main = f"{RESULTS}/calibration/lambda.json"
    if config["calibration"]["mode"] != "bon":
        return [main]
    return [main] + [
        f"{RESULTS}/calibration/lambda_bon{n}.json" for n in sweep_sizes() if n != config["decode"]["bon_n"]
    ]


CALIBRATED = ("hat", "star", *CERTIFIED)  # the lambda settings read from lambda.json


def setting_lambda_json(setting, method=None):
    """The lambda.json a setting reads: the main one for `hat` and `star`, its tau's for `star_tau_<tau>`, the
    method's own calibration for `direct`."""
    if setting == "direct":
        return direct_lambda_json(method)
    if method == "bon_prune":
        return PRUNE_LAMBDA if setting in CALIBRATED else None
    tau = setting_tau(setting)
    if tau is not None:
        return tau_lambda_json(tau)
    return f"{RESULTS}/calibration/lambda.json" if setting in CALIBRATED else None


def lambda_input(wildcards, method=None):
    """The lambda.json of a calibrated setting only: zero/max/literal jobs never wait on calibration."""
    path = setting_lambda_json(wildcards.lam, method or wildcards.get("method"))
    return [path] if path else []


def lambda_options(setting, method=None):
    return opts(
        setting=setting,
        overpenalised_lambda=config["decode"]["overpenalised_lambda"],
        lambda_json=setting_lambda_json(setting, method),
    )


_RESOURCE_KEYS = set()  # the resources.rules keys that the rules read (see check_resource_rules)


def _rule_resources(rule):
    _RESOURCE_KEYS.add(rule)
    return dict(config["resources"]["default"]) | config["resources"]["rules"].get(rule, {})


def job_resources(rule):
    """Resources from the experiment config (the defaults, then any per-rule overrides), as the
    scheduler sees them (how the job launches its processes is not a scheduler resource)."""
    res = _rule_resources(rule)
    for key in lara_config.LAUNCH_KEYS:
        res.pop(key, None)
    if not res.get("gpu"):
        res.pop("gpu", None)
        res.pop("gpu_model", None)
    elif res.get("gpu_model") is None:
        res.pop("gpu_model", None)
    return res


def check_resource_rules():
    """Refuse resources.rules keys that no rule reads (a typo would silently leave its jobs the defaults);
    called once every rule is defined."""
    unknown = sorted(set(config["resources"]["rules"]) - _RESOURCE_KEYS)
    if unknown:
        raise lara_config.ConfigError(
            f"{', '.join(_sources)}: resources.rules: unknown rule {', '.join(unknown)} "
            f"(known: {', '.join(sorted(_RESOURCE_KEYS))})"
        )


def job_threads(rule):
    """The threads a job uses (= its cpus_per_task): Snakemake caps them at --cores and exports
    them as OMP_NUM_THREADS/MKL_NUM_THREADS, which `lara` hands to torch."""
    return job_resources(rule).get("cpus_per_task", 1)


JUDGE = config["evaluation"]["judge"]
JUDGE_ENABLED = JUDGE["model"] is not None and (JUDGE["model"] == "oracle" or JUDGE["base_url"] is not None)
if not JUDGE_ENABLED:
    logger.warning(
        "LLM judge skipped: set evaluation.judge.base_url and evaluation.judge.model (an "
        "OpenAI-compatible endpoint) to rate responses; every other job runs as usual."
    )

# the held-out constraint audit needs Best-of-N at lambda*
BON_STAR = "bon" in config["decode"]["methods"] and "star" in config["decode"]["lambdas"]
BON_STAR_EVAL = f"{RESULTS}/eval/bon/star/scores.parquet" if BON_STAR else []
BON_STAR_LAMBDA = f"{RESULTS}/calibration/lambda.json" if BON_STAR else []
BON_SWEEP = f"{RESULTS}/decode/bon/sweep.csv" if BON_STAR else []


def decoding_models(wildcards):
    """The decoding reward and cost models that score an output for the constraint audit (tau's units);
    none for Best-of-N, whose candidates they scored already."""
    if wildcards.get("decoder") in ("bon", "bon_prune"):
        return []
    return [f"{RESULTS}/models/reward", f"{RESULTS}/models/cost"]


def eval_outputs(kind):
    """Every evaluation output of one kind (scores or judge): decoders x lambda settings, then policies."""
    d = config["decode"]
    return [f"{RESULTS}/eval/{m}/{lam}/{kind}.parquet" for m in DECODED_METHODS for lam in method_settings(m)] + [
        f"{RESULTS}/eval/{p}/{kind}.parquet" for p in d["policies"]
    ]


FIGURES = ["lambda_sweep", "tradeoff", "calibration", "decoders"]


def figure_files(name):
    return [f"{RESULTS}/figures/{name}.{ext}" for ext in ("png", "pdf")] + [f"{RESULTS}/figures/{name}.provenance.json"]


# named evaluation scorers (the toy oracle) are loaded by name, not imported: their code counts too
EVAL_SCORER_MODULES = named_scorer_modules(config["evaluation"]["reward_model"], config["evaluation"]["cost_model"])


def evaluation_options(wildcards):
    """The evaluation settings, and the decoding models that also score the output (see decoding_models)."""
    models = decoding_models(wildcards)
    decoding = ["--decoder-reward", models[0], "--decoder-cost", models[1]] if models else []
    return shlex.join([*decoding, "--settings", step_settings("evaluation")])


def judge_options():
    """The judge's settings and, for an LLM judge, its cache of judgments (kept across reruns)."""
    cache = f"{RESULTS}/eval/judge_cache.sqlite" if config["evaluation"]["judge"]["model"] != "oracle" else None
    judge = shlex.join(["--settings", step_settings("evaluation.judge")])
    return f"{judge} {opts(cache=cache)}" if cache else judge


def figure_shows(wildcards, output):
    """What a figure shows (policy, scorers, N, tau, lambda-hat, lambda*), for its report caption: the
    figure job reads it from its inputs and their jobs' records into the provenance sidecar."""
    try:
        return json.loads(Path(output.provenance).read_text())["shows"]
    except (OSError, KeyError, ValueError):
        return {}


def figure_params():
    return dict(
        settings=step_settings("figures"),
        code=step_code("figure"),
        shows=figure_shows,
    )


def final_outputs():
    """Everything `snakemake` builds by default for the configured experiment."""
    targets = [
        f"{RESULTS}/data/sft.parquet",
        f"{RESULTS}/data/preferences.parquet",
        f"{RESULTS}/data/prompts_calibration.parquet",
        f"{RESULTS}/data/prompts_test.parquet",
    ]
    if config["base_model"]["name_or_path"] == "toy":
        targets.append(f"{RESULTS}/models/base")
    targets += [f"{RESULTS}/models/{m}" for m in ("sft", "reward", "cost")]
    targets += [f"{RESULTS}/models/{stage}_{kind}" for stage in ("partial", "value") for kind in ("reward", "cost")]
    targets.append(f"{RESULTS}/calibration/lambda.json")
    targets += tau_lambda_inputs() + [direct_lambda_json(m) for m in DIRECT_METHODS]
    if BUDGET:
        targets += [BUDGET_CHOICE] + figure_files("frontier")
    if PRUNE:
        targets.append(PRUNE_LAMBDA)
        if CERTIFIED_SETTINGS:
            targets += [f"{RESULTS}/calibration/coverage_bon_prune.{ext}" for ext in ("json", "csv")]
    for method in DECODED_METHODS:
        if method == "bon":
            targets.append(f"{RESULTS}/decode/bon/sweep.csv")
        targets += [f"{RESULTS}/decode/{method}/{lam}/responses.parquet" for lam in method_settings(method)]
    targets += [f"{RESULTS}/decode/{policy}/responses.parquet" for policy in config["decode"]["policies"]]
    targets += [f"{RESULTS}/eval/summary.csv", f"{RESULTS}/eval/constraint_audit.json"]
    for name in FIGURES:
        if name != "lambda_sweep" or "bon" in config["decode"]["methods"]:
            targets += figure_files(name)
    if OTHER_TAUS and BON_STAR:
        targets += figure_files("taus")
    if CERTIFIED_SETTINGS:
        targets += [f"{RESULTS}/calibration/coverage.json"] + figure_files("coverage")
    if SCENARIOS:  # the deployment figure draws the scalar arms only
        targets += [f"{RESULTS}/deployment/report.csv"] + ([] if DEPLOYMENT_VECTOR else figure_files("deployment"))
    targets += constraint_outputs()  # rules/constraints.smk
    return targets


# lambda after deployment (rules/deploy.smk): the shift scenarios and the online arms' step sizes
SCENARIOS = lara_config.scenarios(config)  # name -> schedule (harmful_share, held_out_share)
DEPLOYMENT_EXP = EXP if SCENARIOS else NOTHING  # no scenarios: the deployment rules match no target
STEP_SIZES = [float(e) for e in (lambda v: v if isinstance(v, list) else [v])(config["deployment"]["step_size"])]


def deployment_source():
    """The deployment pool's source: the toy world's, a local path, or a hub id."""
    source = config["deployment"]["prompts"]["source"]
    return TOY_FILES["deployment"] if source == "toy" else source


def deployment_input():
    """The deployment pool's file (tracked), or the fetch_hub manifest for a hub id."""
    source = deployment_source()
    made = source == TOY_FILES["deployment"] or source.startswith(f"{RESULTS}/")  # a file a rule of this run writes
    return [source] if made or Path(source).exists() else hub_input("deployment.prompts.source")


# deployment.follows: constraints: the stage follows the vector lambda of calibration.constraints (its pool scored
# by lara score-constraints, constraints/lambda.json; no covariate-shift weighted arm, which is scalar only)
DEPLOYMENT_VECTOR = config["deployment"]["follows"] == "constraints"
# the model whose mean-pooled prompt features the shift check compares: the reward model the scalar pipeline
# trains, or (following the constraints stage, which may train none: the real-text experiment) pi_ref itself
FEATURE_MODEL = "results/{exp}/models/%s" % ("sft" if DEPLOYMENT_VECTOR else "reward")
DEPLOYMENT_LAMBDA = "results/{exp}/%s/lambda.json" % ("constraints" if DEPLOYMENT_VECTOR else "calibration")
DEPLOYMENT_SCORES = "results/{exp}/%s" % (
    "constraints/deployment_scores.parquet" if DEPLOYMENT_VECTOR else "deployment/scores.parquet"
)


def deployment_constraints():
    """`--constraints JSON` for the deployment steps in the vector mode, nothing in the scalar one."""
    return opts(constraints=CONSTRAINTS_JSON if DEPLOYMENT_VECTOR else None)


def online_outputs(scenario):
    return [f"{RESULTS}/deployment/{scenario}/online_{literal_name(eta)}.parquet" for eta in STEP_SIZES]


def coverage_population():
    """The coverage study's population: the scored calibration pool, and the test prompts' Best-of-N candidates
    when Best-of-N is decoded (the same policy, scorers and K)."""
    pools = ["calibration"] + (["bon"] if "bon" in config["decode"]["methods"] else [])
    return [f"{RESULTS}/{pool}/scores.parquet" for pool in pools]


# several constraints at once (rules/constraints.smk; docs/constraints.md)
CONSTRAINTS = lara_config.constraints(config)
CONSTRAINTS_EXP = EXP if CONSTRAINTS else NOTHING  # no constraints: the stage's rules match no target
CONSTRAINTS_JSON = lara_constraints.to_json(CONSTRAINTS)
CATEGORIES = {c.slug: c.category for c in CONSTRAINTS if c.category}  # file name part -> the label's key


def constraint_scorer(spec):
    """A scorer spec as a step reads it: `reward`/`cost` are the trained models, `category:<c>` its cost model,
    anything else is passed on (a named scorer, name:argument, a model directory)."""
    if spec in ("reward", "cost"):
        return f"{RESULTS}/models/{spec}"
    if spec.startswith(lara_constraints.CATEGORY):
        return f"{RESULTS}/models/cost_{lara_constraints.category_slug(spec[len(lara_constraints.CATEGORY):])}"
    return spec


def scorer_inputs(specs):
    """The files the workflow builds that scorer specs read (model directories under results/)."""
    out = []
    for spec in specs:
        path = constraint_scorer(spec)
        path = path.split(":", 1)[1] if ":" in path and not path.startswith(RESULTS) else path
        if path.startswith(RESULTS):
            out.append(path)
    return sorted(set(out))


CONSTRAINT_REWARD = constraint_scorer(config["calibration"]["constraint_reward"])
CONSTRAINT_COSTS = {c.name: constraint_scorer(c.cost) for c in CONSTRAINTS}
CONSTRAINT_EVALS = {c.name: c.evaluation or config["evaluation"]["cost_model"] for c in CONSTRAINTS}
CONSTRAINT_MODELS = scorer_inputs([config["calibration"]["constraint_reward"], *[c.cost for c in CONSTRAINTS]]) + (
    hub_input(
        "calibration.constraint_reward",
        *[f"calibration.constraints[{i}].{k}" for i in range(len(CONSTRAINTS)) for k in ("cost", "evaluation")],
    )
    if CONSTRAINTS
    else []
)
# LTT (and the vector coverage study) run when every constraint has cost bounds, as in the scalar calibration
CONSTRAINT_BOUNDS = lara_constraints.bounds(CONSTRAINTS, config["calibration"]["cost_bounds"])
# ARGS follows the vector lambda only where decode.methods runs ARGS at all
VECTOR_SETTINGS = {
    "bon": ["zero", "hat", "star", *(["ltt", "ltt_wsr"] if CONSTRAINT_BOUNDS else [])],
    **({"args": ["zero", "star"]} if "args" in config["decode"]["methods"] else {}),
}


def cost_options(specs, flag="--cost"):
    """`--cost name=spec` per constraint, in their order (a shell-quoted string)."""
    return shlex.join([part for name, spec in specs.items() for part in (flag, f"{name}={spec}")])


def audit_options():
    """The audit's decoding cost and evaluation scorer of every constraint, and the judges (evaluation.judges)."""
    judges = shlex.join([part for spec in config["evaluation"]["judges"] for part in ("--judge", spec)])
    return f"{cost_options(CONSTRAINT_COSTS)} {cost_options(CONSTRAINT_EVALS, '--evaluation')} {judges}".rstrip()


def constraint_outputs():
    if not CONSTRAINTS:
        return []
    coverage = [f"{RESULTS}/constraints/coverage.json"] if CONSTRAINT_BOUNDS and len(CONSTRAINTS) > 1 else []
    figures = [*figure_files("constraints"), *figure_files("constraints_sweep")]
    return [f"{RESULTS}/constraints/lambda.json", f"{RESULTS}/constraints/audit.json", *coverage, *figures]
