# Decoding stage. Best-of-N: the N candidates per test prompt are sampled and scored once (the `bon` pool of
# rules/calibrate.smk), then selected for any lambda without new generation. ARGS / PARGS / CD-Q: token-level decoding with log pi_ref + w (r - lambda c).
# Lambda settings are named (zero, hat, star, max, star_tau_<tau> for another listed tau, or a literal such as
# 0p5); hat and star read lambda.json, star_tau_<tau> its tau's calibration/tau_<tau>/lambda.json.


rule select_bon:
    input:
        candidates="results/{exp}/bon/scores.parquet",
        lam=lambda_input,
    output:
        "results/{exp}/decode/bon/{lam}/responses.parquet",
    log:
        "logs/{exp}/select_bon_{lam}.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("select_bon")
    resources:
        **job_resources("select_bon"),
    params:
        options=lambda w: lambda_options(w.lam),
        code=step_code("select-bon"),
    shell:
        "lara select-bon --candidates {input.candidates:q} {params.options} --out {output:q} > {log:q} 2>&1"


rule bon_sweep:
    input:
        candidates="results/{exp}/bon/scores.parquet",
        lam=sweep_lambda_inputs(),
        soft=soft_lambda_inputs(),
        taus=tau_lambda_inputs(),
        core=core_lambda_inputs(),
    output:
        "results/{exp}/decode/bon/sweep.csv",
    log:
        "logs/{exp}/bon_sweep.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("bon_sweep")
    resources:
        **job_resources("bon_sweep"),
    params:
        settings=step_settings("bon-sweep"),
        sizes=sweep_sizes(),
        code=step_code("bon-sweep"),
    shell:
        "lara bon-sweep --candidates {input.candidates:q} --lambda-json {input.lam:q} --soft-lambda-json {input.soft:q}"
        " --tau-lambda-json {input.taus:q} --k-lambda-json {input.core:q}"
        " --n {params.sizes:q} --settings {params.settings:q} --out {output:q} > {log:q} 2>&1"


rule decode_rgtg:
    input:
        prompts="results/{exp}/data/prompts_test.parquet",
        sft="results/{exp}/models/sft",
        reward=rgtg_scorer("reward"),
        cost=rgtg_scorer("cost"),
        lam=lambda_input,
    output:
        "results/{exp}/decode/{method}/{lam}/responses.parquet",
    log:
        "logs/{exp}/decode_{method}_{lam}.log",
    benchmark:
        "benchmarks/{exp}/decode_{method}_{lam}.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("decode_rgtg")
    resources:
        **job_resources("decode_rgtg"),
    params:
        options=lambda w: lambda_options(w.lam, w.method),
        settings=lambda w: step_settings(f"decode.rgtg.{w.method}"),
        code=step_code("rgtg"),
    shell:
        "lara rgtg --method {wildcards.method:q} --policy {input.sft:q} --reward {input.reward:q} --cost {input.cost:q}"
        " --prompts {input.prompts:q} {params.options} --settings {params.settings:q}"
        " --out {output:q} > {log:q} 2>&1"


# Pruned Best-of-N (decode.bon_prune; docs/pruned.md): the prefixes of the sampled responses (calibration samples,
# the test prompts' N candidates) scored at its checkpoints by the partial models; the decoder's own lambda from the
# calibration prefixes (rules/calibrate.smk: calibrate_prune); its choice on the same N candidates as Best-of-N's,
# with the tokens it would have generated
rule score_prefixes:
    input:
        scores="results/{exp}/{pool}/scores.parquet",
        sft="results/{exp}/models/sft",
        reward="results/{exp}/models/partial_reward",
        cost="results/{exp}/models/partial_cost",
    output:
        "results/{exp}/{pool}/prefix_scores.parquet",
    log:
        "logs/{exp}/score_prefixes_{pool}.log",
    benchmark:
        "benchmarks/{exp}/score_prefixes_{pool}.tsv"
    wildcard_constraints:
        pool="calibration|bon|selection",
    priority: 1  # ahead of the deployment arms: the token-budget chooser waits on all three pools' prefixes
    conda:
        "../envs/train.yaml"
    threads: job_threads("score")
    resources:
        **job_resources("score"),
    params:
        settings=step_settings("score-prefixes"),
        code=step_code("score-prefixes"),
    shell:
        "lara score-prefixes --input {input.scores:q} --tokenizer {input.sft:q} --reward {input.reward:q}"
        " --cost {input.cost:q} --settings {params.settings:q} --out {output:q} > {log:q} 2>&1"


rule select_bon_prune:
    input:
        candidates="results/{exp}/bon/prefix_scores.parquet",
        lam=lambda w: lambda_input(w, "bon_prune"),
    output:
        "results/{exp}/decode/bon_prune/{lam}/responses.parquet",
    log:
        "logs/{exp}/select_bon_prune_{lam}.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("select_bon")
    resources:
        **job_resources("select_bon"),
    params:
        options=lambda w: lambda_options(w.lam, "bon_prune"),
        settings=step_settings("select-bon-prune"),
        code=step_code("select-bon-prune"),
    shell:
        "lara select-bon-prune --candidates {input.candidates:q} {params.options} --settings {params.settings:q}"
        " --out {output:q} > {log:q} 2>&1"


rule bon_prune_sweep:
    input:
        candidates="results/{exp}/bon/prefix_scores.parquet",
        lam="results/{exp}/calibration/lambda_bon_prune.json",
    output:
        "results/{exp}/decode/bon_prune/sweep.csv",
    log:
        "logs/{exp}/bon_prune_sweep.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("bon_sweep")
    resources:
        **job_resources("bon_sweep"),
    params:
        settings=step_settings("bon-prune-sweep"),
        code=step_code("bon-prune-sweep"),
    shell:
        "lara bon-prune-sweep --candidates {input.candidates:q} --lambda-json {input.lam:q} --settings {params.settings:q}"
        " --out {output:q} > {log:q} 2>&1"


# At each token budget the certified decoder (decode.budget; docs/budget.md): Best-of-k for every k <= N and the pruned
# schedules of the search space, chosen on the selection prompts, the winner calibrated and certified on the
# calibration prompts and audited on the test prompts' candidates
rule choose_decoder:
    input:
        selection="results/{exp}/selection/prefix_scores.parquet",
        calibration="results/{exp}/calibration/prefix_scores.parquet",
        test="results/{exp}/bon/prefix_scores.parquet",
    output:
        choice="results/{exp}/decode/budget/choice.json",
        table="results/{exp}/decode/budget/frontier.csv",
    log:
        "logs/{exp}/choose_decoder.log",
    benchmark:
        "benchmarks/{exp}/choose_decoder.tsv"
    priority: 1  # started as soon as its inputs are there, beside the deployment arms, not after them
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("bon_sweep")
    resources:
        **job_resources("bon_sweep"),
    params:
        settings=step_settings("decode.budget"),
        code=step_code("choose-decoder"),
    shell:
        "lara choose-decoder --selection {input.selection:q} --calibration {input.calibration:q} --test {input.test:q}"
        " --settings {params.settings:q} --out {output.choice:q} --table {output.table:q} > {log:q} 2>&1"
