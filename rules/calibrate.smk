# Calibration stage: K samples per calibration prompt from pi_ref (the SFT policy), their
# reward and cost, and the dual multiplier (bisection + bootstrap) deployed as lambda*.
#
# Sampling from pi_ref and scoring with the trained reward and cost models serve three pools of
# prompts (SAMPLE_POOLS in common.smk): `calibration` (K per calibration prompt), `value` (the CD-Q
# training data) and `bon` (the N Best-of-N candidates per test prompt).


rule sample:
    input:
        prompts=lambda w: SAMPLE_POOLS[w.pool]["prompts"],
        sft="results/{exp}/models/sft",
    output:
        "results/{exp}/{pool}/samples.parquet",
    log:
        "logs/{exp}/sample_{pool}.log",
    benchmark:
        "benchmarks/{exp}/sample_{pool}.tsv"
    conda:
        "../envs/generate.yaml"
    threads: job_threads("sample")
    resources:
        **job_resources("sample"),
    params:
        settings=lambda w: sample_settings(w.pool),
        options=lambda w: sample_options(w.pool),
        code=step_code("sample"),
    shell:
        "lara sample --model {input.sft:q} --prompts {input.prompts:q} --settings {params.settings:q}"
        " {params.options} --out {output:q} > {log:q} 2>&1"


rule score:
    input:
        samples="results/{exp}/{pool}/samples.parquet",
        reward="results/{exp}/models/reward",
        cost="results/{exp}/models/cost",
    output:
        "results/{exp}/{pool}/scores.parquet",
    log:
        "logs/{exp}/score_{pool}.log",
    benchmark:
        "benchmarks/{exp}/score_{pool}.tsv"
    priority: 1  # every pool's scores feed several stages (and the selection pool the chooser): ahead of the arms
    conda:
        "../envs/train.yaml"
    threads: job_threads("score")
    resources:
        **job_resources("score"),
    params:
        settings=step_settings("score"),
        code=step_code("score"),
    shell:
        "lara score --input {input.samples:q} --reward {input.reward:q} --cost {input.cost:q} --settings {params.settings:q}"
        " --out {output:q} > {log:q} 2>&1"


rule calibrate_lambda:
    input:
        scores="results/{exp}/calibration/scores.parquet",
    output:
        "results/{exp}/calibration/lambda.json",
    log:
        "logs/{exp}/calibrate_lambda.log",
    benchmark:
        "benchmarks/{exp}/calibrate_lambda.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("calibrate_lambda")
    resources:
        **job_resources("calibrate_lambda"),
    params:
        settings=calibration_settings(config["decode"]["bon_n"]),
        code=step_code("calibrate"),
    shell:
        "lara calibrate --scores {input.scores:q} --settings {params.settings:q}" " --out {output:q} > {log:q} 2>&1"


# The coverage study (calibration.cost_bounds set, bon mode): repeated calibrations on draws from the scored
# pools, each procedure's lambda (bootstrap, CRC, LTT) evaluated exactly on the whole population
rule coverage:
    input:
        scores=coverage_population(),
    output:
        json="results/{exp}/calibration/coverage.json",
        table="results/{exp}/calibration/coverage.csv",
    log:
        "logs/{exp}/coverage.log",
    benchmark:
        "benchmarks/{exp}/coverage.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("coverage")
    resources:
        **job_resources("coverage"),
    params:
        settings=step_settings("coverage"),
        code=step_code("coverage"),
    shell:
        "lara coverage --scores {input.scores:q} --settings {params.settings:q} --out {output.json:q}"
        " --table {output.table:q} > {log:q} 2>&1"


# Every other listed calibration.tau: its own lambda.json from the same scores (no sampling, no scoring, no
# training); its lambda* is decoded as the `star_tau_<tau>` setting
rule calibrate_lambda_tau:
    input:
        scores="results/{exp}/calibration/scores.parquet",
    output:
        "results/{exp}/calibration/tau_{tau}/lambda.json",
    log:
        "logs/{exp}/calibrate_lambda_tau_{tau}.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("calibrate_lambda")
    resources:
        **job_resources("calibrate_lambda"),
    params:
        settings=lambda w: calibration_settings(config["decode"]["bon_n"], tau=parse_tau_name(w.tau)),
        code=step_code("calibrate"),
    shell:
        "lara calibrate --scores {input.scores:q} --settings {params.settings:q}" " --out {output:q} > {log:q} 2>&1"


# calibration.token_level: direct: a lambda for each token-level decoder itself (lara.decode.direct): the
# decoder decodes the calibration prompts at the scanned lambdas, the decoding models score them, the search
# deploys the first (then bisected) lambda whose own decode met tau; decoded as the `direct` setting. It does not
# read lambda.json: a new bootstrap of Best-of-N's lambda* never reruns these decodes (the audit's paired
# `direct - star` compares the two)
rule calibrate_direct:
    input:
        prompts="results/{exp}/data/prompts_calibration.parquet",
        sft="results/{exp}/models/sft",
        reward=rgtg_scorer("reward"),
        cost=rgtg_scorer("cost"),
        decoder_reward="results/{exp}/models/reward",
        decoder_cost="results/{exp}/models/cost",
    output:
        "results/{exp}/calibration/direct_{method}.json",
    log:
        "logs/{exp}/calibrate_direct_{method}.log",
    benchmark:
        "benchmarks/{exp}/calibrate_direct_{method}.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("calibrate_direct")
    resources:
        **job_resources("calibrate_direct"),
    params:
        decoder=lambda w: step_settings(f"decode.rgtg.{w.method}"),
        settings=step_settings("calibrate-decoder"),
        code=step_code("calibrate-decoder"),
    shell:
        "lara calibrate-decoder --method {wildcards.method:q} --policy {input.sft:q} --reward {input.reward:q}"
        " --cost {input.cost:q} --decoder-reward {input.decoder_reward:q} --decoder-cost {input.decoder_cost:q}"
        " --prompts {input.prompts:q} --decoder-settings {params.decoder:q} --settings {params.settings:q}"
        " --out {output:q} > {log:q} 2>&1"


# The paper's estimator as an arm: soft mode (Algorithm 1) at each beta of calibration.soft_betas, on the same
# scores; the sweep applies its lambda* to Best-of-N and the audit holds it to tau (calibration.mode decides
# which lambda.json the decoders deploy)
rule calibrate_soft:
    input:
        scores="results/{exp}/calibration/scores.parquet",
    output:
        "results/{exp}/calibration/lambda_soft_beta{beta}.json",
    log:
        "logs/{exp}/calibrate_soft_beta{beta}.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("calibrate_lambda")
    resources:
        **job_resources("calibrate_lambda"),
    params:
        settings=lambda w: step_settings(
            "calibration", mode="soft", bon_n=None, beta=parse_setting(w.beta), guarantee="bootstrap"
        ),
        code=step_code("calibrate"),
    shell:
        "lara calibrate --scores {input.scores:q} --settings {params.settings:q} --allow-infeasible"
        " --out {output:q} > {log:q} 2>&1"


# Best-of-N with other N (decode.sweep_n) for Fig. 1, each calibrated for its own N (bon mode only)
rule calibrate_lambda_for_n:
    input:
        scores="results/{exp}/calibration/scores.parquet",
    output:
        "results/{exp}/calibration/lambda_bon{n}.json",
    log:
        "logs/{exp}/calibrate_lambda_bon{n}.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("calibrate_lambda")
    resources:
        **job_resources("calibrate_lambda"),
    params:
        settings=lambda w: calibration_settings(int(w.n)),
        code=step_code("calibrate"),
    shell:
        "lara calibrate --scores {input.scores:q} --settings {params.settings:q}" " --out {output:q} > {log:q} 2>&1"


# Best-of-k for each Fig. 1 size through the calibration core (lara.calibrate.best_of_k): every procedure on the
# lambda grid of decode.bon_prune.grid_points, its tokens; the sweep audits its lambdas beside the exact calibration
rule calibrate_best_of_k:
    input:
        scores="results/{exp}/calibration/scores.parquet",
    output:
        "results/{exp}/calibration/lambda_bon_k{k}.json",
    log:
        "logs/{exp}/calibrate_best_of_k{k}.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("calibrate_lambda")
    resources:
        **job_resources("calibrate_lambda"),
    params:
        settings=lambda w: step_settings("calibrate-best-of-k", k=int(w.k)),
        code=step_code("calibrate-best-of-k"),
    shell:
        "lara calibrate-best-of-k --scores {input.scores:q} --settings {params.settings:q} --out {output:q} > {log:q} 2>&1"


# Pruned Best-of-N's own lambda (decode.bon_prune; docs/pruned.md): its expected cost per calibration prompt on a
# lambda grid from the calibration samples' prefix scores (rules/decode.smk: score_prefixes), the stable root, the
# bootstrap lambda* and, with calibration.cost_bounds, the certified lambdas (LTT in a fixed sequence down the grid)
rule calibrate_prune:
    input:
        scores="results/{exp}/calibration/prefix_scores.parquet",
    output:
        "results/{exp}/calibration/lambda_bon_prune.json",
    log:
        "logs/{exp}/calibrate_prune.log",
    benchmark:
        "benchmarks/{exp}/calibrate_prune.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("calibrate_lambda")
    resources:
        **job_resources("calibrate_lambda"),
    params:
        settings=step_settings("decode.bon_prune"),
        code=step_code("calibrate-prune"),
    shell:
        "lara calibrate-prune --scores {input.scores:q} --settings {params.settings:q} --out {output:q} > {log:q} 2>&1"


# The pruned decoder's coverage study (decode.bon_prune with calibration.cost_bounds): repeated calibrations on draws
# from the calibration and test prompts' prefix scores, each procedure's lambda read off the population's own curves
rule coverage_prune:
    input:
        scores=[f"results/{{exp}}/{pool}/prefix_scores.parquet" for pool in ("calibration", "bon")],
    output:
        json="results/{exp}/calibration/coverage_bon_prune.json",
        table="results/{exp}/calibration/coverage_bon_prune.csv",
    log:
        "logs/{exp}/coverage_prune.log",
    benchmark:
        "benchmarks/{exp}/coverage_prune.tsv"
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("coverage")
    resources:
        **job_resources("coverage"),
    params:
        settings=step_settings("coverage-prune"),
        code=step_code("coverage-prune"),
    shell:
        "lara coverage-prune --scores {input.scores:q} --settings {params.settings:q} --out {output.json:q}"
        " --table {output.table:q} > {log:q} 2>&1"
