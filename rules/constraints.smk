# Several constraints at once (calibration.constraints; docs/constraints.md): one cost per constraint, a vector
# lambda calibrated for Best-of-N, Best-of-N and ARGS decoding r - sum_j lambda_j c_j, and the held-out audit of
# every constraint and of all of them at once. Runs when the list names any; the scalar pipeline is unchanged.


rule category_preferences:
    input:
        "results/{exp}/data/preferences.parquet",
    output:
        "results/{exp}/data/preferences_{category}.parquet",
    log:
        "logs/{exp}/category_preferences_{category}.log",
    wildcard_constraints:
        exp=CONSTRAINTS_EXP,
        category=_alternatives(sorted(CATEGORIES)),
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
        exp=CONSTRAINTS_EXP,
        category=_alternatives(sorted(CATEGORIES)),
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
        exp=CONSTRAINTS_EXP,
        cpool="calibration|bon|deployment",
    conda:
        "../envs/train.yaml"
    threads: job_threads("score")
    resources:
        **job_resources("score"),
    params:
        reward=lambda w: CONSTRAINT_REWARD,
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
    wildcard_constraints:
        exp=CONSTRAINTS_EXP,
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
        exp=CONSTRAINTS_EXP,
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
        exp=CONSTRAINTS_EXP,
        vsetting="|".join(VECTOR_SETTINGS.get("args", [])),
    conda:
        "../envs/train.yaml"
    threads: job_threads("decode_rgtg")
    resources:
        **job_resources("decode_rgtg"),
    params:
        reward=lambda w: CONSTRAINT_REWARD,
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
    wildcard_constraints:
        exp=CONSTRAINTS_EXP,
    conda:
        "../envs/train.yaml"
    threads: job_threads("evaluate")
    resources:
        **job_resources("evaluate"),
    params:
        reward=lambda w: CONSTRAINT_REWARD,
        constraints=CONSTRAINTS_JSON,
        options=audit_options(),
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
    wildcard_constraints:
        exp=CONSTRAINTS_EXP,
    priority: 1  # the longest single job of the toy DAG: started when its scores are there, not left for last
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


if not CONSTRAINTS:

    rule no_constraints:
        output:
            "results/{exp}/constraints/{name}",
        log:
            "logs/{exp}/no_constraints_{name}.log",
        conda:
            "../envs/analysis.yaml"
        resources:
            **job_resources("no_constraints"),
        params:
            refused=lambda w: refused_target(
                f"results/{w.exp}/constraints/{w.name}",
                "calibration.constraints is empty, so the constraints stage does not run; list the constraints",
            ),
        shell:
            "false"
