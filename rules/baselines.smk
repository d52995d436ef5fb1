# Weight-updating baselines: Safe-RLHF (PPO-Lagrangian, own accelerate loop) and SafeDPO (TRL DPOTrainer on
# safety-transformed pairs), both from the SFT model, and each decode.policy_variants entry with train overrides
# (models/{name}); then one sampled response per test prompt from each policy (SFT included; a variant with
# generation overrides samples its base's model its own way), in the decoders' output schema. Rules asking for several GPUs run under
# `accelerate launch` with one process per GPU.


rule train_safe_rlhf:
    input:
        sft="results/{exp}/models/sft",
        reward="results/{exp}/models/reward",
        cost="results/{exp}/models/cost",
        prompts="results/{exp}/data/preferences.parquet",
        sft_data="results/{exp}/data/sft.parquet",
    output:
        directory("results/{exp}/models/{safe_rlhf_model}"),
    log:
        "logs/{exp}/train_{safe_rlhf_model}.log",
    benchmark:
        "benchmarks/{exp}/train_{safe_rlhf_model}.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("train_safe_rlhf")
    resources:
        **job_resources("train_safe_rlhf"),
    params:
        launch=launcher("train_safe_rlhf"),
        settings=lambda w: policy_settings(w.safe_rlhf_model, "train"),
        code=step_code("train-safe-rlhf"),
    shell:
        "{params.launch} train-safe-rlhf --model {input.sft:q} --reward {input.reward:q} --cost {input.cost:q}"
        " --prompts {input.prompts:q} --sft-data {input.sft_data:q} --settings {params.settings:q}"
        " --checkpoints results/{wildcards.exp:q}/checkpoints/{wildcards.safe_rlhf_model:q} --out {output:q}"
        " > {log:q} 2>&1"


rule train_safedpo:
    input:
        sft="results/{exp}/models/sft",
        data="results/{exp}/data/preferences.parquet",
    output:
        directory("results/{exp}/models/{safedpo_model}"),
    log:
        "logs/{exp}/train_{safedpo_model}.log",
    benchmark:
        "benchmarks/{exp}/train_{safedpo_model}.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("train_safedpo")
    resources:
        **job_resources("train_safedpo"),
    params:
        launch=launcher("train_safedpo"),
        settings=lambda w: policy_settings(w.safedpo_model, "train"),
        code=step_code("train-safedpo"),
    shell:
        "{params.launch} train-safedpo --model {input.sft:q} --data {input.data:q} --settings {params.settings:q}"
        " --checkpoints results/{wildcards.exp:q}/checkpoints/{wildcards.safedpo_model:q}"
        " --out {output:q} > {log:q} 2>&1"


rule generate_policy:
    input:
        prompts="results/{exp}/data/prompts_test.parquet",
        model=lambda w: f"{RESULTS}/models/{policy_model(w.policy)}",
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
        options=opts(tensor_parallel=tensor_parallel("generate_policy")),
        settings=lambda w: policy_settings(w.policy, "generation", seed=config["seed"] + 2),
        code=step_code("generate-policy"),
    shell:
        "lara generate-policy --policy {wildcards.policy:q} --model {input.model:q} --prompts {input.prompts:q}"
        " {params.options} --settings {params.settings:q} --out {output:q} > {log:q} 2>&1"
