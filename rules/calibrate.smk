# Calibration stage: K samples per calibration prompt from pi_ref (the SFT policy), their
# reward and cost, and the dual multiplier (bisection + bootstrap) deployed as lambda*.


rule sample_calibration:
    input:
        prompts="results/{exp}/data/prompts_calibration.parquet",
        sft="results/{exp}/models/sft",
    output:
        "results/{exp}/calibration/samples.parquet",
    params:
        options=opts(
            n=config["calibration"]["samples_per_prompt"],
            dtype=config["base_model"]["dtype"],
            seed=config["seed"],
        ),
        settings=step_settings("generation"),
        code=step_code("sample"),
    log:
        "logs/{exp}/sample_calibration.log",
    benchmark:
        "benchmarks/{exp}/sample_calibration.tsv"
    threads: job_threads("sample_calibration")
    resources:
        **job_resources("sample_calibration"),
    conda:
        "../envs/generate.yaml"
    shell:
        "lara sample --model {input.sft} --prompts {input.prompts} {params.options}"
        " --settings {params.settings:q} --out {output} > {log} 2>&1"


rule score_calibration:
    input:
        samples="results/{exp}/calibration/samples.parquet",
        reward="results/{exp}/models/reward",
        cost="results/{exp}/models/cost",
    output:
        "results/{exp}/calibration/scores.parquet",
    params:
        code=step_code("score"),
    log:
        "logs/{exp}/score_calibration.log",
    benchmark:
        "benchmarks/{exp}/score_calibration.tsv"
    threads: job_threads("score_calibration")
    resources:
        **job_resources("score_calibration"),
    conda:
        "../envs/train.yaml"
    shell:
        "lara score --input {input.samples} --reward {input.reward} --cost {input.cost} --out {output} > {log} 2>&1"


rule calibrate_lambda:
    input:
        scores="results/{exp}/calibration/scores.parquet",
    output:
        "results/{exp}/calibration/lambda.json",
    params:
        settings=step_settings("calibration"),
        options=calibration_options(config["decode"]["bon_n"]),
        code=step_code("calibrate"),
    log:
        "logs/{exp}/calibrate_lambda.log",
    benchmark:
        "benchmarks/{exp}/calibrate_lambda.tsv"
    threads: job_threads("calibrate_lambda")
    resources:
        **job_resources("calibrate_lambda"),
    conda:
        "../envs/analysis.yaml"
    shell:
        "lara calibrate --scores {input.scores:q} --settings {params.settings:q} {params.options}"
        " --out {output:q} > {log:q} 2>&1"


# Best-of-N with other N (decode.sweep_n) for Fig. 1, each calibrated for its own N (bon mode only)
rule calibrate_lambda_for_n:
    input:
        scores="results/{exp}/calibration/scores.parquet",
    output:
        "results/{exp}/calibration/lambda_bon{n}.json",
    params:
        settings=step_settings("calibration"),
        options=lambda w: calibration_options(int(w.n)),
        code=step_code("calibrate"),
    log:
        "logs/{exp}/calibrate_lambda_bon{n}.log",
    threads: job_threads("calibrate_lambda")
    resources:
        **job_resources("calibrate_lambda"),
    conda:
        "../envs/analysis.yaml"
    shell:
        "lara calibrate --scores {input.scores:q} --settings {params.settings:q} {params.options}"
        " --out {output:q} > {log:q} 2>&1"
