# Training stage: SFT of the base model, then reward / cost models, PARGS partial models and
# CD-Q value functions, all initialised from SFT. Checkpoints live in results/{exp}/checkpoints/
# (not an output, so a killed and rerun job resumes from its last checkpoint).


rule train_sft:
    input:
        data="results/{exp}/data/sft.parquet",
        base=base_model_input(),
    output:
        directory("results/{exp}/models/sft"),
    params:
        model=base_model_arg,
        settings=step_settings("train.sft"),
        options=opts(seed=config["seed"], dtype=config["base_model"]["dtype"]),
        code=step_code("train-sft"),
    log:
        "logs/{exp}/train_sft.log",
    benchmark:
        "benchmarks/{exp}/train_sft.tsv"
    threads: job_threads("train_sft")
    resources:
        **job_resources("train_sft"),
    conda:
        "../envs/train.yaml"
    shell:
        "lara train-sft --model {params.model} --data {input.data} --settings {params.settings:q}"
        " {params.options} --checkpoints results/{wildcards.exp}/checkpoints/sft --out {output} > {log} 2>&1"


rule train_reward_model:
    input:
        data="results/{exp}/data/preferences.parquet",
        sft="results/{exp}/models/sft",
    output:
        directory("results/{exp}/models/reward"),
    params:
        settings=step_settings("train.reward"),
        options=opts(seed=config["seed"], dtype=config["base_model"]["dtype"]),
        code=step_code("train-reward"),
    log:
        "logs/{exp}/train_reward_model.log",
    benchmark:
        "benchmarks/{exp}/train_reward_model.tsv"
    threads: job_threads("train_reward_model")
    resources:
        **job_resources("train_reward_model"),
    conda:
        "../envs/train.yaml"
    shell:
        "lara train-reward --model {input.sft} --data {input.data} --settings {params.settings:q}"
        " {params.options} --checkpoints results/{wildcards.exp}/checkpoints/reward --out {output} > {log} 2>&1"


rule train_cost_model:
    input:
        data="results/{exp}/data/preferences.parquet",
        sft="results/{exp}/models/sft",
    output:
        directory("results/{exp}/models/cost"),
    params:
        settings=step_settings("train.cost"),
        options=opts(seed=config["seed"], dtype=config["base_model"]["dtype"]),
        code=step_code("train-cost"),
    log:
        "logs/{exp}/train_cost_model.log",
    benchmark:
        "benchmarks/{exp}/train_cost_model.tsv"
    threads: job_threads("train_cost_model")
    resources:
        **job_resources("train_cost_model"),
    conda:
        "../envs/train.yaml"
    shell:
        "lara train-cost --model {input.sft} --data {input.data} --settings {params.settings:q}"
        " {params.options} --checkpoints results/{wildcards.exp}/checkpoints/cost --out {output} > {log} 2>&1"


rule train_partial_model:
    input:
        data="results/{exp}/data/preferences.parquet",
        sft="results/{exp}/models/sft",
    output:
        directory("results/{exp}/models/partial_{kind}"),
    params:
        settings=step_settings("train.partial"),
        options=opts(seed=config["seed"], dtype=config["base_model"]["dtype"]),
        code=step_code("train-partial"),
    log:
        "logs/{exp}/train_partial_{kind}.log",
    benchmark:
        "benchmarks/{exp}/train_partial_{kind}.tsv"
    threads: job_threads("train_partial_model")
    resources:
        **job_resources("train_partial_model"),
    conda:
        "../envs/train.yaml"
    shell:
        "lara train-partial --kind {wildcards.kind} --model {input.sft} --data {input.data}"
        " --settings {params.settings:q} {params.options}"
        " --checkpoints results/{wildcards.exp}/checkpoints/partial_{wildcards.kind} --out {output} > {log} 2>&1"


rule sample_value_data:
    input:
        data="results/{exp}/data/sft.parquet",
        sft="results/{exp}/models/sft",
    output:
        "results/{exp}/value/samples.parquet",
    params:
        options=opts(
            n=config["train"]["value"]["samples_per_prompt"],
            max_prompts=config["train"]["value"]["n_prompts"],
            dtype=config["base_model"]["dtype"],
            seed=config["seed"],
        ),
        settings=step_settings("generation"),
        code=step_code("sample"),
    log:
        "logs/{exp}/sample_value_data.log",
    benchmark:
        "benchmarks/{exp}/sample_value_data.tsv"
    threads: job_threads("sample_value_data")
    resources:
        **job_resources("sample_value_data"),
    conda:
        "../envs/generate.yaml"
    shell:
        "lara sample --model {input.sft} --prompts {input.data} {params.options}"
        " --settings {params.settings:q} --out {output} > {log} 2>&1"


rule score_value_data:
    input:
        samples="results/{exp}/value/samples.parquet",
        reward="results/{exp}/models/reward",
        cost="results/{exp}/models/cost",
    output:
        "results/{exp}/value/scores.parquet",
    params:
        code=step_code("score"),
    log:
        "logs/{exp}/score_value_data.log",
    benchmark:
        "benchmarks/{exp}/score_value_data.tsv"
    threads: job_threads("score_value_data")
    resources:
        **job_resources("score_value_data"),
    conda:
        "../envs/train.yaml"
    shell:
        "lara score --input {input.samples} --reward {input.reward} --cost {input.cost} --out {output} > {log} 2>&1"


rule train_value_model:
    input:
        data="results/{exp}/value/scores.parquet",
        sft="results/{exp}/models/sft",
    output:
        directory("results/{exp}/models/value_{kind}"),
    params:
        settings=step_settings("train.value"),
        options=opts(seed=config["seed"], dtype=config["base_model"]["dtype"]),
        code=step_code("train-value"),
    log:
        "logs/{exp}/train_value_{kind}.log",
    benchmark:
        "benchmarks/{exp}/train_value_{kind}.tsv"
    threads: job_threads("train_value_model")
    resources:
        **job_resources("train_value_model"),
    conda:
        "../envs/train.yaml"
    shell:
        "lara train-value --kind {wildcards.kind} --model {input.sft} --data {input.data}"
        " --settings {params.settings:q} {params.options}"
        " --checkpoints results/{wildcards.exp}/checkpoints/value_{wildcards.kind} --out {output} > {log} 2>&1"
