# Training stage: SFT of the base model, then reward / cost models, PARGS partial models and
# CD-Q value functions, all initialised from SFT. Checkpoints live in results/{exp}/checkpoints/
# (not an output, so a killed and rerun job resumes from its last checkpoint).


rule train_sft:
    input:
        data="results/{exp}/data/sft.parquet",
        base=base_model_input(),
        hub=hub_input("base_model.name_or_path"),
    output:
        directory("results/{exp}/models/sft"),
    log:
        "logs/{exp}/train_sft.log",
    benchmark:
        "benchmarks/{exp}/train_sft.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("train_sft")
    resources:
        **job_resources("train_sft"),
    params:
        launch=launcher("train_sft"),
        model=base_model_arg,
        settings=step_settings("train.sft"),
        options=opts(revision=config["base_model"]["revision"]),
        code=step_code("train-sft"),
    shell:
        "{params.launch} train-sft --model {params.model:q} --data {input.data:q} --settings {params.settings:q}"
        " {params.options} --checkpoints results/{wildcards.exp:q}/checkpoints/sft --out {output:q} > {log:q} 2>&1"


if config["reference_policy"] == "base":

    ruleorder: reference_base > train_sft

    # reference_policy: base: pi_ref is the base model itself, not fine-tuned; models/sft is its copy, so every
    # step that reads pi_ref reads it unchanged
    rule reference_base:
        input:
            base=base_model_input(),
        output:
            directory("results/{exp}/models/sft"),
        log:
            "logs/{exp}/reference_base.log",
        conda:
            "../envs/analysis.yaml"
        threads: job_threads("reference_base")
        resources:
            **job_resources("reference_base"),
        shell:
            "cp -r {input.base:q} {output:q} > {log:q} 2>&1"


rule train_reward_model:
    input:
        data="results/{exp}/data/preferences.parquet",
        sft="results/{exp}/models/sft",
    output:
        directory("results/{exp}/models/reward"),
    log:
        "logs/{exp}/train_reward_model.log",
    benchmark:
        "benchmarks/{exp}/train_reward_model.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("train_reward_model")
    resources:
        **job_resources("train_reward_model"),
    params:
        launch=launcher("train_reward_model"),
        settings=step_settings("train.reward"),
        code=step_code("train-reward"),
    shell:
        "{params.launch} train-reward --model {input.sft:q} --data {input.data:q} --settings {params.settings:q}"
        " --checkpoints results/{wildcards.exp:q}/checkpoints/reward --out {output:q} > {log:q} 2>&1"


rule train_cost_model:
    input:
        data="results/{exp}/data/preferences.parquet",
        sft="results/{exp}/models/sft",
    output:
        directory("results/{exp}/models/cost"),
    log:
        "logs/{exp}/train_cost_model.log",
    benchmark:
        "benchmarks/{exp}/train_cost_model.tsv"
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
        " --checkpoints results/{wildcards.exp:q}/checkpoints/cost --out {output:q} > {log:q} 2>&1"


rule train_partial_model:
    input:
        data="results/{exp}/data/preferences.parquet",
        sft="results/{exp}/models/sft",
    output:
        directory("results/{exp}/models/partial_{kind}"),
    log:
        "logs/{exp}/train_partial_{kind}.log",
    benchmark:
        "benchmarks/{exp}/train_partial_{kind}.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("train_partial_model")
    resources:
        **job_resources("train_partial_model"),
    params:
        launch=launcher("train_partial_model"),
        settings=step_settings("train.partial"),
        code=step_code("train-partial"),
    shell:
        "{params.launch} train-partial --kind {wildcards.kind:q} --model {input.sft:q} --data {input.data:q}"
        " --settings {params.settings:q}"
        " --checkpoints results/{wildcards.exp:q}/checkpoints/partial_{wildcards.kind:q} --out {output:q} > {log:q} 2>&1"


rule train_value_model:
    input:
        data="results/{exp}/value/scores.parquet",
        sft="results/{exp}/models/sft",
    output:
        directory("results/{exp}/models/value_{kind}"),
    log:
        "logs/{exp}/train_value_{kind}.log",
    benchmark:
        "benchmarks/{exp}/train_value_{kind}.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("train_value_model")
    resources:
        **job_resources("train_value_model"),
    params:
        launch=launcher("train_value_model"),
        settings=step_settings("train.value"),
        code=step_code("train-value"),
    shell:
        "{params.launch} train-value --kind {wildcards.kind:q} --model {input.sft:q} --data {input.data:q}"
        " --settings {params.settings:q}"
        " --checkpoints results/{wildcards.exp:q}/checkpoints/value_{wildcards.kind:q} --out {output:q} > {log:q} 2>&1"
