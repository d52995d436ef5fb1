# Weight-updating baselines: Safe-RLHF (PPO-Lagrangian, own accelerate loop) and SafeDPO (TRL DPOTrainer on
# safety-transformed pairs), both from the SFT model; then one sampled response per test prompt from each
# fine-tuned policy (SFT included), in the decoders' output schema. Rules asking for several GPUs run under
# `accelerate launch` with one process per GPU.


rule train_safe_rlhf:
    input:
        sft="results/{exp}/models/sft",
        reward="results/{exp}/models/reward",
        cost="results/{exp}/models/cost",
        prompts="results/{exp}/data/preferences.parquet",
        sft_data="results/{exp}/data/sft.parquet",
    output:
        directory("results/{exp}/models/safe_rlhf"),
    log:
        "logs/{exp}/train_safe_rlhf.log",
    benchmark:
        "benchmarks/{exp}/train_safe_rlhf.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("train_safe_rlhf")
    resources:
        **job_resources("train_safe_rlhf"),
    params:
        launch=launcher("train_safe_rlhf"),
        settings=step_settings("train.safe_rlhf"),
        options=opts(seed=config["seed"], dtype=config["base_model"]["dtype"]),
        code=step_code("train-safe-rlhf"),
    shell:
        "{params.launch} train-safe-rlhf --model {input.sft:q} --reward {input.reward:q} --cost {input.cost:q}"
        " --prompts {input.prompts:q} --sft-data {input.sft_data:q} --settings {params.settings:q} {params.options}"
        " --checkpoints results/{wildcards.exp:q}/checkpoints/safe_rlhf --out {output:q} > {log:q} 2>&1"


rule train_safedpo:
    input:
        sft="results/{exp}/models/sft",
        data="results/{exp}/data/preferences.parquet",
    output:
        directory("results/{exp}/models/safedpo"),
    log:
        "logs/{exp}/train_safedpo.log",
    benchmark:
        "benchmarks/{exp}/train_safedpo.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("train_safedpo")
    resources:
        **job_resources("train_safedpo"),
    params:
        launch=launcher("train_safedpo"),
        settings=step_settings("train.safedpo"),
        options=opts(seed=config["seed"], dtype=config["base_model"]["dtype"]),
        code=step_code("train-safedpo"),
    shell:
        "{params.launch} train-safedpo --model {input.sft:q} --data {input.data:q} --settings {params.settings:q}"
        " {params.options} --checkpoints results/{wildcards.exp:q}/checkpoints/safedpo --out {output:q} > {log:q} 2>&1"


rule generate_policy:
    input:
        prompts="results/{exp}/data/prompts_test.parquet",
        model="results/{exp}/models/{policy}",
    output:
        "results/{exp}/decode/{policy}/responses.parquet",
    log:
        "logs/{exp}/generate_policy_{policy}.log",
    benchmark:
        "benchmarks/{exp}/generate_policy_{policy}.tsv"
    conda:
        "../envs/generate.yaml"
    threads: job_threads("generate_policy")
    resources:
        **job_resources("generate_policy"),
    params:
        options=opts(
            dtype=config["base_model"]["dtype"],
            seed=config["seed"] + 2,
        ),
        settings=step_settings("generation"),
        code=step_code("generate-policy"),
    shell:
        "lara generate-policy --policy {wildcards.policy:q} --model {input.model:q} --prompts {input.prompts:q}"
        " {params.options} --settings {params.settings:q} --out {output:q} > {log:q} 2>&1"
