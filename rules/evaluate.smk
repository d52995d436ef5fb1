# Evaluation stage: every decoded output (each method at each lambda setting) and every fine-tuned policy is
# scored by the evaluation scorers (never the models that guided decoding), rated by the LLM judge when one is
# configured (the oracle on the toy world), and aggregated with bootstrap intervals; the aggregate also audits
# whether every decoder meets E[c] <= tau on the held-out test prompts, in tau's units: Best-of-N's candidates
# were scored by the decoding reward and cost models already; every other output is scored by them in its
# evaluation job (decoder_reward, decoder_cost).


rule evaluate_decoded:
    input:
        responses="results/{exp}/decode/{decoder}/{lam}/responses.parquet",
        decoding_models=decoding_models,
        hub=hub_input("evaluation.reward_model", "evaluation.cost_model"),
    output:
        "results/{exp}/eval/{decoder}/{lam}/scores.parquet",
    log:
        "logs/{exp}/evaluate_{decoder}_{lam}.log",
    benchmark:
        "benchmarks/{exp}/evaluate_{decoder}_{lam}.tsv"
    conda:
        "../envs/train.yaml"
    threads: job_threads("evaluate_decoded")
    resources:
        **job_resources("evaluate_decoded"),
    params:
        options=evaluation_options,
        code=step_code("evaluate", *EVAL_SCORER_MODULES),
    shell:
        "lara evaluate --responses {input.responses:q} {params.options} --out {output:q} > {log:q} 2>&1"


use rule evaluate_decoded as evaluate_policy with:
    input:
        responses="results/{exp}/decode/{policy}/responses.parquet",
        decoding_models=decoding_models,
        hub=hub_input("evaluation.reward_model", "evaluation.cost_model"),
    output:
        "results/{exp}/eval/{policy}/scores.parquet",
    log:
        "logs/{exp}/evaluate_{policy}.log",
    benchmark:
        "benchmarks/{exp}/evaluate_{policy}.tsv"
    threads: job_threads("evaluate_policy")
    resources:
        **job_resources("evaluate_policy"),


rule judge_decoded:
    input:
        "results/{exp}/decode/{decoder}/{lam}/responses.parquet",
    output:
        "results/{exp}/eval/{decoder}/{lam}/judge.parquet",
    log:
        "logs/{exp}/judge_{decoder}_{lam}.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("judge")
    resources:
        **job_resources("judge"),
    params:
        options=judge_options(),
        code=step_code("judge"),
    shell:
        "lara judge --responses {input:q} {params.options} --out {output:q} > {log:q} 2>&1"


use rule judge_decoded as judge_policy with:
    input:
        "results/{exp}/decode/{policy}/responses.parquet",
    output:
        "results/{exp}/eval/{policy}/judge.parquet",
    log:
        "logs/{exp}/judge_{policy}.log",


rule aggregate:
    input:
        scores=eval_outputs("scores"),
        judge=eval_outputs("judge") if JUDGE_ENABLED else [],
        bon_star=BON_STAR_EVAL,
        lam=BON_STAR_LAMBDA,
        sweep=BON_SWEEP,
        taus=tau_lambda_inputs(),
        prune=[PRUNE_LAMBDA] if PRUNE else [],
    output:
        summary="results/{exp}/eval/summary.csv",
        audit="results/{exp}/eval/constraint_audit.json",
    log:
        "logs/{exp}/aggregate.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("aggregate")
    resources:
        **job_resources("aggregate"),
    params:
        settings=step_settings("aggregate"),
        audit=opts(
            bon_star=BON_STAR_EVAL or None,
            lambda_json=BON_STAR_LAMBDA or None,
            sweep=BON_SWEEP or None,
            prune_lambda_json=PRUNE_LAMBDA if PRUNE else None,
        ),
        code=step_code("aggregate"),
    shell:
        "lara aggregate --scores {input.scores:q} --judge {input.judge:q} {params.audit} --tau-lambda-json {input.taus:q}"
        " --settings {params.settings:q} --out {output.summary:q} --audit {output.audit:q} > {log:q} 2>&1"
