# Figures: Fig. 1 (Best-of-N against lambda), Fig. 2 (helpfulness against harmlessness, model and judge panels)
# and the calibration diagnostics, each as PNG (in the report, with a caption templated from the config) and
# PDF, with a provenance sidecar that `lara trail FIGURE` prints and verifies. The plot options are the
# only config slice these rules read besides their inputs, so changing one redraws the figures and nothing else.


rule figure_lambda_sweep:
    input:
        sweep="results/{exp}/decode/bon/sweep.csv",
        prune=["results/{exp}/decode/bon_prune/sweep.csv", PRUNE_LAMBDA] if PRUNE else [],
        lam="results/{exp}/calibration/lambda.json",
        settings="results/{exp}/settings.tsv",
    output:
        png=report(
            "results/{exp}/figures/lambda_sweep.png",
            caption="../report/lambda_sweep.rst",
            category="Figures",
            labels={"figure": "Fig. 1: Best-of-N against lambda"},
        ),
        pdf="results/{exp}/figures/lambda_sweep.pdf",
        provenance="results/{exp}/figures/lambda_sweep.provenance.json",
    log:
        "logs/{exp}/figure_lambda_sweep.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("figures")
    resources:
        **job_resources("figures"),
    params:
        **figure_params(),
        options=opts(
            prune_sweep=f"results/{EXP}/decode/bon_prune/sweep.csv" if PRUNE else None,
            prune_lambda_json=PRUNE_LAMBDA if PRUNE else None,
        ),
    shell:
        "lara figure --kind lambda_sweep --sweep {input.sweep:q} --lambda-json {input.lam:q} --settings {params.settings:q}"
        " {params.options}"
        " --experiment-settings {input.settings:q}"
        " --rule figure_lambda_sweep --png {output.png:q} --pdf {output.pdf:q} --provenance {output.provenance:q}"
        " > {log:q} 2>&1"


rule figure_tradeoff:
    input:
        summary="results/{exp}/eval/summary.csv",
        lam="results/{exp}/calibration/lambda.json",
        settings="results/{exp}/settings.tsv",
    output:
        png=report(
            "results/{exp}/figures/tradeoff.png",
            caption="../report/tradeoff.rst",
            category="Figures",
            labels={"figure": "Fig. 2: helpfulness against harmlessness"},
        ),
        pdf="results/{exp}/figures/tradeoff.pdf",
        provenance="results/{exp}/figures/tradeoff.provenance.json",
    log:
        "logs/{exp}/figure_tradeoff.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("figures")
    resources:
        **job_resources("figures"),
    params:
        **figure_params(),
    shell:
        "lara figure --kind tradeoff --summary {input.summary:q} --lambda-json {input.lam:q} --settings {params.settings:q}"
        " --experiment-settings {input.settings:q}"
        " --rule figure_tradeoff --png {output.png:q} --pdf {output.pdf:q} --provenance {output.provenance:q} > {log:q} 2>&1"


rule figure_calibration:
    input:
        lam="results/{exp}/calibration/lambda.json",
        settings="results/{exp}/settings.tsv",
    output:
        png=report(
            "results/{exp}/figures/calibration.png",
            caption="../report/calibration.rst",
            category="Figures",
            labels={"figure": "Calibration diagnostics"},
        ),
        pdf="results/{exp}/figures/calibration.pdf",
        provenance="results/{exp}/figures/calibration.provenance.json",
    log:
        "logs/{exp}/figure_calibration.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("figures")
    resources:
        **job_resources("figures"),
    params:
        **figure_params(),
    shell:
        "lara figure --kind calibration --lambda-json {input.lam:q} --settings {params.settings:q}"
        " --experiment-settings {input.settings:q}"
        " --rule figure_calibration --png {output.png:q} --pdf {output.pdf:q} --provenance {output.provenance:q}"
        " > {log:q} 2>&1"


rule figure_decoders:
    input:
        audit="results/{exp}/eval/constraint_audit.json",
        lam="results/{exp}/calibration/lambda.json",
        settings="results/{exp}/settings.tsv",
    output:
        png=report(
            "results/{exp}/figures/decoders.png",
            caption="../report/decoders.rst",
            category="Figures",
            labels={"figure": "Every decoder against tau"},
        ),
        pdf="results/{exp}/figures/decoders.pdf",
        provenance="results/{exp}/figures/decoders.provenance.json",
    log:
        "logs/{exp}/figure_decoders.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("figures")
    resources:
        **job_resources("figures"),
    params:
        **figure_params(),
    shell:
        "lara figure --kind decoders --audit {input.audit:q} --lambda-json {input.lam:q} --settings {params.settings:q}"
        " --experiment-settings {input.settings:q}"
        " --rule figure_decoders --png {output.png:q} --pdf {output.pdf:q} --provenance {output.provenance:q}"
        " > {log:q} 2>&1"


# lambda*(tau) for every listed calibration.tau, with Best-of-N's held-out cost and reward at each (read from the
# constraint audit's `taus`); built only when calibration.tau lists more than one
rule figure_taus:
    input:
        audit="results/{exp}/eval/constraint_audit.json",
        lam="results/{exp}/calibration/lambda.json",
        settings="results/{exp}/settings.tsv",
    output:
        png=report(
            "results/{exp}/figures/taus.png",
            caption="../report/taus.rst",
            category="Figures",
            labels={"figure": "lambda* against tau"},
        ),
        pdf="results/{exp}/figures/taus.pdf",
        provenance="results/{exp}/figures/taus.provenance.json",
    log:
        "logs/{exp}/figure_taus.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("figures")
    resources:
        **job_resources("figures"),
    params:
        **figure_params(),
    shell:
        "lara figure --kind taus --audit {input.audit:q} --lambda-json {input.lam:q} --settings {params.settings:q}"
        " --experiment-settings {input.settings:q}"
        " --rule figure_taus --png {output.png:q} --pdf {output.pdf:q} --provenance {output.provenance:q}"
        " > {log:q} 2>&1"


rule figure_coverage:
    input:
        coverage="results/{exp}/calibration/coverage.json",
        lam="results/{exp}/calibration/lambda.json",
        settings="results/{exp}/settings.tsv",
    output:
        png=report(
            "results/{exp}/figures/coverage.png",
            caption="../report/coverage.rst",
            category="Figures",
            labels={"figure": "coverage of the calibration procedures"},
        ),
        pdf="results/{exp}/figures/coverage.pdf",
        provenance="results/{exp}/figures/coverage.provenance.json",
    log:
        "logs/{exp}/figure_coverage.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("figures")
    resources:
        **job_resources("figures"),
    params:
        **figure_params(),
    shell:
        "lara figure --kind coverage --coverage {input.coverage:q} --lambda-json {input.lam:q}"
        " --settings {params.settings:q} --experiment-settings {input.settings:q}"
        " --rule figure_coverage --png {output.png:q} --pdf {output.pdf:q} --provenance {output.provenance:q}"
        " > {log:q} 2>&1"


# Several constraints at once (rules/constraints.smk): the vector lambda's feasible region in (lambda_1, lambda_2)
# for two constraints, each constraint's cost along the searched ray otherwise; exact, on the calibration scores
rule figure_constraints:
    input:
        lam="results/{exp}/constraints/lambda.json",
        scores="results/{exp}/constraints/calibration_scores.parquet",
        settings="results/{exp}/settings.tsv",
    output:
        png=report(
            "results/{exp}/figures/constraints.png",
            caption="../report/constraints.rst",
            category="Figures",
            labels={"figure": "Several constraints: the vector lambda"},
        ),
        pdf="results/{exp}/figures/constraints.pdf",
        provenance="results/{exp}/figures/constraints.provenance.json",
    log:
        "logs/{exp}/figure_constraints.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("figures")
    resources:
        **job_resources("figures"),
    params:
        **figure_params(),
        constraints=CONSTRAINTS_JSON,
    shell:
        "lara figure --kind constraints --lambda-json {input.lam:q} --scores {input.scores:q}"
        " --constraints {params.constraints:q} --settings {params.settings:q} --experiment-settings {input.settings:q}"
        " --rule figure_constraints --png {output.png:q} --pdf {output.pdf:q} --provenance {output.provenance:q}"
        " > {log:q} 2>&1"


# Several constraints at once, held out: Fig. 1 per constraint for the vector lambda, each constraint's mean cost (and
# the mean reward) of the Best-of-N pick on the test candidates along the searched ray, with the audited outputs
rule figure_constraints_sweep:
    input:
        lam="results/{exp}/constraints/lambda.json",
        scores="results/{exp}/constraints/bon_scores.parquet",
        audit="results/{exp}/constraints/audit.json",
        settings="results/{exp}/settings.tsv",
    output:
        png=report(
            "results/{exp}/figures/constraints_sweep.png",
            caption="../report/constraints_sweep.rst",
            category="Figures",
            labels={"figure": "Several constraints: Fig. 1 per constraint"},
        ),
        pdf="results/{exp}/figures/constraints_sweep.pdf",
        provenance="results/{exp}/figures/constraints_sweep.provenance.json",
    log:
        "logs/{exp}/figure_constraints_sweep.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("figures")
    resources:
        **job_resources("figures"),
    params:
        **figure_params(),
        constraints=CONSTRAINTS_JSON,
    shell:
        "lara figure --kind constraints_sweep --lambda-json {input.lam:q} --scores {input.scores:q}"
        " --audit {input.audit:q} --constraints {params.constraints:q} --settings {params.settings:q}"
        " --experiment-settings {input.settings:q} --rule figure_constraints_sweep --png {output.png:q}"
        " --pdf {output.pdf:q} --provenance {output.provenance:q} > {log:q} 2>&1"


# Every resolved config value with its origin (a file, a step default), beside the results; each figure
# takes it as an input, so its provenance (and `lara trail`) names the settings it was made with.
rule experiment_settings:
    output:
        "results/{exp}/settings.tsv",
    log:
        "logs/{exp}/experiment_settings.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("figures")
    resources:
        **job_resources("figures"),
    params:
        layers=CONFIG_LAYERS_JSON,
        code=step_code("validate-config"),
    shell:
        "lara validate-config --layers {params.layers:q} --quiet --out {output:q} > {log:q} 2>&1"


# The token-budget chooser (decode.budget; docs/budget.md): held-out reward against tokens per prompt, each decoder at
# its own certified lambda*, each budget dashed and the decoder chosen at it starred
rule figure_frontier:
    input:
        frontier="results/{exp}/decode/budget/frontier.csv",
        choice="results/{exp}/decode/budget/choice.json",
        settings="results/{exp}/settings.tsv",
    output:
        png=report(
            "results/{exp}/figures/frontier.png",
            caption="../report/frontier.rst",
            category="Figures",
            labels={"figure": "Token budgets: reward against tokens"},
        ),
        pdf="results/{exp}/figures/frontier.pdf",
        provenance="results/{exp}/figures/frontier.provenance.json",
    log:
        "logs/{exp}/figure_frontier.log",
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("figures")
    resources:
        **job_resources("figures"),
    params:
        **figure_params(),
    shell:
        "lara figure --kind frontier --frontier {input.frontier:q} --choice {input.choice:q} --settings {params.settings:q}"
        " --experiment-settings {input.settings:q}"
        " --rule figure_frontier --png {output.png:q} --pdf {output.pdf:q} --provenance {output.provenance:q} > {log:q} 2>&1"
