# Several constraints at once (calibration.constraints; docs/constraints.md): one cost per constraint, a vector
# lambda calibrated for Best-of-N, Best-of-N and ARGS decoding r - sum_j lambda_j c_j, and the held-out audit of
# every constraint and of all of them at once. Runs when the list names any; the scalar pipeline is unchanged.

CONSTRAINTS = lara_config.constraints(config)
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
CONSTRAINT_MODELS = scorer_inputs([config["calibration"]["constraint_reward"], *[c.cost for c in CONSTRAINTS]])
VECTOR_SETTINGS = {
    "bon": ["zero", "hat", "star"] + (["ltt"] if config["calibration"]["cost_bounds"] else []),
    "args": ["zero", "star"],
}


def cost_options(specs, flag="--cost"):
    return shlex.join([part for name, spec in specs.items() for part in (flag, f"{name}={spec}")])


# the vector coverage study runs when every constraint has cost bounds (LTT's), as the scalar study does
CONSTRAINT_BOUNDS = lara_constraints.bounds(CONSTRAINTS, config["calibration"]["cost_bounds"])


def constraint_outputs():
    if not CONSTRAINTS:
        return []
    coverage = [f"{RESULTS}/constraints/coverage.json"] if CONSTRAINT_BOUNDS and len(CONSTRAINTS) > 1 else []
    return (
        [
            f"{RESULTS}/constraints/lambda.json",
            f"{RESULTS}/constraints/audit.json",
            *coverage,
        ]
        + figure_files("constraints")
        + figure_files("constraints_sweep")
    )


rule category_preferences:
    input:
        "results/{exp}/data/preferences.parquet",
    output:
        "results/{exp}/data/preferences_{category}.parquet",
    log:
        "logs/{exp}/category_preferences_{category}.log",
    wildcard_constraints:
        category=_alternatives(sorted(CATEGORIES) or ["none"]),
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("category_preferences")
    resources:
        **job_resources("category_preferences"),
    params:
        category=lambda w: CATEGORIES[w.category],
        settings=step_settings("category-pairs"),
        code=step_code("category-pairs"),
    shell:
        "lara category-pairs --input {input:q} --category {params.category:q} --settings {params.settings:q}"
        " --out {output:q} > {log:q} 2>&1"


rule train_cost_category:
    input:
        data="results/{exp}/data/preferences_{category}.parquet",
        sft="results/{exp}/models/sft",
    output:
        directory("results/{exp}/models/cost_{category}"),
    log:
        "logs/{exp}/train_cost_{category}.log",
    benchmark:
        "benchmarks/{exp}/train_cost_{category}.tsv"
    wildcard_constraints:
        category=_alternatives(sorted(CATEGORIES) or ["none"]),
    conda:
        "../envs/train.yaml"
    threads: job_threads("train_cost_model")
    resources:
        **job_resources("train_cost_model"),
    params:
        launch=launcher("train_cost_model"),
        settings=step_settings("train.cost"),
        code=step_code("train-cost"),
    shell:
        "{params.launch} train-cost --model {input.sft:q} --data {input.data:q} --settings {params.settings:q}"
        " --checkpoints results/{wildcards.exp:q}/checkpoints/cost_{wildcards.category:q} --out {output:q}"
        " > {log:q} 2>&1"


rule score_constraints:
    input:
        samples="results/{exp}/{cpool}/samples.parquet",
        models=CONSTRAINT_MODELS,
    output:
        "results/{exp}/constraints/{cpool}_scores.parquet",
    log:
        "logs/{exp}/score_constraints_{cpool}.log",
    wildcard_constraints:
        cpool="calibration|bon",
    conda:
        "../envs/train.yaml"
    threads: job_threads("score")
    resources:
        **job_resources("score"),
    params:
        reward=CONSTRAINT_REWARD,
        options=cost_options(CONSTRAINT_COSTS),  # the scorers, not the budgets: a new tau rescores nothing
        settings=step_settings("score"),
        code=step_code("score-constraints"),
    shell:
        "lara score-constraints --input {input.samples:q} --reward {params.reward:q} {params.options}"
        " --settings {params.settings:q} --out {output:q} > {log:q} 2>&1"


rule calibrate_vector:
    input:
        "results/{exp}/constraints/calibration_scores.parquet",
    output:
        "results/{exp}/constraints/lambda.json",
    log:
        "logs/{exp}/calibrate_vector.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("calibrate_lambda")
    resources:
        **job_resources("calibrate_lambda"),
    params:
        constraints=CONSTRAINTS_JSON,
        # the constraints carry their own taus: calibration.tau (the scalar pipeline's) is not this step's
        settings=step_settings(
            "calibration", bon_n=config["decode"]["bon_n"], mode="bon", tau=CONSTRAINTS[0].tau if CONSTRAINTS else 0.0
        ),
        code=step_code("calibrate-vector"),
    shell:
        "lara calibrate-vector --scores {input:q} --constraints {params.constraints:q} --settings {params.settings:q}"
        " --out {output:q} > {log:q} 2>&1"


rule decode_vector_bon:
    input:
        candidates="results/{exp}/constraints/bon_scores.parquet",
        lam="results/{exp}/constraints/lambda.json",
    output:
        "results/{exp}/constraints/decode/bon_{vsetting}.parquet",
    log:
        "logs/{exp}/decode_vector_bon_{vsetting}.log",
    wildcard_constraints:
        vsetting="|".join(VECTOR_SETTINGS["bon"]),
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("select_bon")
    resources:
        **job_resources("select_bon"),
    params:
        constraints=CONSTRAINTS_JSON,
        code=step_code("decode-vector"),
    shell:
        "lara decode-vector --method bon --setting {wildcards.vsetting:q} --constraints {params.constraints:q}"
        " --lambda-json {input.lam:q} --candidates {input.candidates:q} --out {output:q} > {log:q} 2>&1"


rule decode_vector_args:
    input:
        prompts="results/{exp}/data/prompts_test.parquet",
        lam="results/{exp}/constraints/lambda.json",
        sft="results/{exp}/models/sft",
        models=CONSTRAINT_MODELS,
    output:
        "results/{exp}/constraints/decode/args_{vsetting}.parquet",
    log:
        "logs/{exp}/decode_vector_args_{vsetting}.log",
    wildcard_constraints:
        vsetting="|".join(VECTOR_SETTINGS["args"]),
    conda:
        "../envs/train.yaml"
    threads: job_threads("decode_rgtg")
    resources:
        **job_resources("decode_rgtg"),
    params:
        reward=CONSTRAINT_REWARD,
        constraints=CONSTRAINTS_JSON,
        options=cost_options(CONSTRAINT_COSTS),
        settings=step_settings("decode.rgtg.args"),
        code=step_code("decode-vector"),
    shell:
        "lara decode-vector --method args --setting {wildcards.vsetting:q} --constraints {params.constraints:q}"
        " --lambda-json {input.lam:q} --prompts {input.prompts:q} --policy {input.sft:q} --reward {params.reward:q}"
        " {params.options} --settings {params.settings:q} --out {output:q} > {log:q} 2>&1"


rule audit_constraints:
    input:
        responses=[
            f"results/{{exp}}/constraints/decode/{method}_{setting}.parquet"
            for method, settings in VECTOR_SETTINGS.items()
            for setting in settings
        ],
        lam="results/{exp}/constraints/lambda.json",
        models=CONSTRAINT_MODELS,
    output:
        json="results/{exp}/constraints/audit.json",
        table="results/{exp}/constraints/audit.csv",
    log:
        "logs/{exp}/audit_constraints.log",
    conda:
        "../envs/train.yaml"
    threads: job_threads("evaluate")
    resources:
        **job_resources("evaluate"),
    params:
        reward=CONSTRAINT_REWARD,
        constraints=CONSTRAINTS_JSON,
        options=cost_options(CONSTRAINT_COSTS) + " " + cost_options(CONSTRAINT_EVALS, "--evaluation"),
        settings=step_settings("aggregate"),
        code=step_code("audit-constraints"),
    shell:
        "lara audit-constraints --responses {input.responses:q} --constraints {params.constraints:q}"
        " --lambda-json {input.lam:q} --reward {params.reward:q} {params.options}"
        " --settings {params.settings:q} --out {output.json:q} --table {output.table:q} > {log:q} 2>&1"


# The coverage study of the vector lambda (lara coverage-vector): repeated calibrations on draws from the scored
# calibration and Best-of-N pools, each procedure's lambda evaluated exactly on all of them; the joint violation
# rate (some constraint's population mean cost above its tau) against LTT's delta
rule coverage_vector:
    input:
        scores=[
            "results/{exp}/constraints/calibration_scores.parquet",
            "results/{exp}/constraints/bon_scores.parquet",
        ],
    output:
        json="results/{exp}/constraints/coverage.json",
        table="results/{exp}/constraints/coverage.csv",
    log:
        "logs/{exp}/coverage_vector.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("coverage")
    resources:
        **job_resources("coverage"),
    params:
        constraints=CONSTRAINTS_JSON,
        calibration=step_settings(
            "calibration", bon_n=config["decode"]["bon_n"], mode="bon", tau=CONSTRAINTS[0].tau if CONSTRAINTS else 0.0
        ),
        settings=step_settings("coverage", tau=CONSTRAINTS[0].tau if CONSTRAINTS else 0.0),
        code=step_code("coverage-vector"),
    shell:
        "lara coverage-vector --scores {input.scores:q} --constraints {params.constraints:q}"
        " --calibration-settings {params.calibration:q} --settings {params.settings:q} --out {output.json:q}"
        " --table {output.table:q} > {log:q} 2>&1"
