# Lambda after deployment (docs/deployment.md): a deployment prompt pool disjoint from the calibration prompts,
# sampled once from pi_ref (K candidates per prompt) and scored (rules sample and score, pool `deployment`);
# each scenario of deployment.scenarios a stream of T visits drawn from it by its schedule; Best-of-N on each
# stream with the calibrated lambda fixed, the online lambda (one arm per deployment.step_size) and the oracle;
# every scenario's arms in one report (lara summary, the deployment figure), beside its shift check and the
# covariate-shift weighted lambda. deployment.follows: constraints follows the vector lambda of calibration.constraints
# instead (the pool scored by score_constraints, constraints/lambda.json, one online lambda per constraint; no
# weighted arm, and no deployment figure).


rule deployment_pool:
    input:
        pool=deployment_input(),
        calibration="results/{exp}/data/prompts_calibration.parquet",
    output:
        "results/{exp}/data/prompts_deployment.parquet",
    log:
        "logs/{exp}/deployment_pool.log",
    wildcard_constraints:
        exp=DEPLOYMENT_EXP,
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("deployment_pool")
    resources:
        **job_resources("deployment_pool"),
    params:
        settings=step_settings("deployment.prompts"),
        options=opts(source=deployment_source()),
        code=step_code("deployment-pool"),
    shell:
        "lara deployment-pool --settings {params.settings:q} {params.options} --calibration {input.calibration:q}"
        " --out {output:q} > {log:q} 2>&1"


rule make_stream:
    input:
        pool="results/{exp}/data/prompts_deployment.parquet",
        scores=DEPLOYMENT_SCORES,
    output:
        "results/{exp}/deployment/{scenario}/stream.parquet",
    log:
        "logs/{exp}/make_stream_{scenario}.log",
    wildcard_constraints:
        exp=DEPLOYMENT_EXP,
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("make_stream")
    resources:
        **job_resources("make_stream"),
    params:
        settings=step_settings("deployment"),
        schedule=lambda w: json.dumps(SCENARIOS[w.scenario], sort_keys=True),
        options=deployment_constraints(),
        code=step_code("make-stream"),
    shell:
        "lara make-stream --pool {input.pool:q} --scores {input.scores:q} --scenario {wildcards.scenario:q}"
        " --schedule {params.schedule:q} --settings {params.settings:q} {params.options} --out {output:q}"
        " > {log:q} 2>&1"


rule online:
    input:
        stream="results/{exp}/deployment/{scenario}/stream.parquet",
        lam=DEPLOYMENT_LAMBDA,
    output:
        out="results/{exp}/deployment/{scenario}/online_{eta}.parquet",
        record="results/{exp}/deployment/{scenario}/online_{eta}.json",
    log:
        "logs/{exp}/online_{scenario}_{eta}.log",
    wildcard_constraints:
        exp=DEPLOYMENT_EXP,
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("online")
    resources:
        **job_resources("online"),
    params:
        settings=lambda w: step_settings("deployment", step_size=parse_setting(w.eta)),
        options=deployment_constraints(),
        code=step_code("online"),
    shell:
        "lara online --candidates {input.stream:q} --lambda-json {input.lam:q} --settings {params.settings:q}"
        " {params.options} --out {output.out:q} --record {output.record:q} > {log:q} 2>&1"


# the shift check: the reward model's mean-pooled hidden states of every calibration and deployment prompt, a
# classifier two-sample test per scenario (calibration prompts against the stream's first distinct prompts),
# and the covariate-shift weighted lambda from the same calibration scores (docs/shift.md)
rule prompt_features:
    input:
        model=FEATURE_MODEL,
        calibration="results/{exp}/data/prompts_calibration.parquet",
        deployment="results/{exp}/data/prompts_deployment.parquet",
    output:
        "results/{exp}/deployment/features.parquet",
    log:
        "logs/{exp}/prompt_features.log",
    wildcard_constraints:
        exp=DEPLOYMENT_EXP,
    conda:
        "../envs/train.yaml"
    threads: job_threads("prompt_features")
    resources:
        **job_resources("prompt_features"),
    params:
        settings=step_settings("prompt-features"),
        code=step_code("prompt-features"),
    shell:
        "lara prompt-features --model {input.model:q} --prompts {input.calibration:q} {input.deployment:q}"
        " --settings {params.settings:q} --out {output:q} > {log:q} 2>&1"


rule shift_check:
    input:
        features="results/{exp}/deployment/features.parquet",
        calibration="results/{exp}/data/prompts_calibration.parquet",
        stream="results/{exp}/deployment/{scenario}/stream.parquet",
    output:
        out="results/{exp}/deployment/{scenario}/shift.json",
        weights="results/{exp}/deployment/{scenario}/weights.parquet",
    log:
        "logs/{exp}/shift_check_{scenario}.log",
    wildcard_constraints:
        exp=DEPLOYMENT_EXP,
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("shift_check")
    resources:
        **job_resources("shift_check"),
    params:
        settings=step_settings("deployment.shift"),
        code=step_code("shift-check"),
    shell:
        "lara shift-check --features {input.features:q} --calibration {input.calibration:q}"
        " --deployment {input.stream:q} --settings {params.settings:q} --out {output.out:q}"
        " --weights {output.weights:q} > {log:q} 2>&1"


rule calibrate_weighted:
    input:
        scores="results/{exp}/calibration/scores.parquet",
        weights="results/{exp}/deployment/{scenario}/weights.parquet",
    output:
        "results/{exp}/deployment/{scenario}/lambda_weighted.json",
    log:
        "logs/{exp}/calibrate_weighted_{scenario}.log",
    wildcard_constraints:
        exp=DEPLOYMENT_EXP,
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("calibrate_lambda")
    resources:
        **job_resources("calibrate_lambda"),
    params:
        settings=calibration_settings(config["decode"]["bon_n"]),
        code=step_code("calibrate"),
    shell:
        "lara calibrate --scores {input.scores:q} --weights {input.weights:q} --settings {params.settings:q}"
        " --out {output:q} > {log:q} 2>&1"


rule deploy_arms:
    input:
        stream="results/{exp}/deployment/{scenario}/stream.parquet",
        lam=DEPLOYMENT_LAMBDA,
        online=lambda w: online_outputs(w.scenario),
        # the covariate-shift weighted lambda is scalar only: no weighted arm when the stage follows the vector one
        weighted=[] if DEPLOYMENT_VECTOR else "results/{exp}/deployment/{scenario}/lambda_weighted.json",
    output:
        arms="results/{exp}/deployment/{scenario}/arms.csv",
        trace="results/{exp}/deployment/{scenario}/trace.parquet",
    log:
        "logs/{exp}/deploy_arms_{scenario}.log",
    wildcard_constraints:
        exp=DEPLOYMENT_EXP,
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("deploy_arms")
    resources:
        **job_resources("deploy_arms"),
    params:
        settings=step_settings("deployment"),
        options=lambda w, input: opts(
            weighted=input.weighted or None, constraints=CONSTRAINTS_JSON if DEPLOYMENT_VECTOR else None
        ),
        code=step_code("deploy-arms"),
    shell:
        "lara deploy-arms --candidates {input.stream:q} --lambda-json {input.lam:q} --online {input.online:q}"
        " {params.options} --settings {params.settings:q} --out {output.arms:q}"
        " --trace {output.trace:q} > {log:q} 2>&1"


rule deployment_report:
    input:
        arms=expand("results/{{exp}}/deployment/{scenario}/arms.csv", scenario=list(SCENARIOS)),
        shift=expand("results/{{exp}}/deployment/{scenario}/shift.json", scenario=list(SCENARIOS)),
    output:
        "results/{exp}/deployment/report.csv",
    log:
        "logs/{exp}/deployment_report.log",
    wildcard_constraints:
        exp=DEPLOYMENT_EXP,
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("deployment_report")
    resources:
        **job_resources("deployment_report"),
    params:
        code=step_code("deployment-report"),
    shell:
        "lara deployment-report --arms {input.arms:q} --shift {input.shift:q} --out {output:q} > {log:q} 2>&1"


rule figure_deployment:
    input:
        report="results/{exp}/deployment/report.csv",
        traces=expand("results/{{exp}}/deployment/{scenario}/trace.parquet", scenario=list(SCENARIOS)),
        lam="results/{exp}/calibration/lambda.json",
        settings="results/{exp}/settings.tsv",
    output:
        png=report(
            "results/{exp}/figures/deployment.png",
            caption="../report/deployment.rst",
            category="Figures",
            labels={"figure": "After deployment: running mean cost and lambda per arm"},
        ),
        pdf="results/{exp}/figures/deployment.pdf",
        provenance="results/{exp}/figures/deployment.provenance.json",
    log:
        "logs/{exp}/figure_deployment.log",
    wildcard_constraints:
        exp=DEPLOYMENT_EXP,
    conda:
        "../envs/analysis.yaml"
    threads: job_threads("figures")
    resources:
        **job_resources("figures"),
    params:
        **figure_params(),
    shell:
        "lara figure --kind deployment --report {input.report:q} --traces {input.traces:q}"
        " --lambda-json {input.lam:q} --settings {params.settings:q} --experiment-settings {input.settings:q}"
        " --rule figure_deployment --png {output.png:q} --pdf {output.pdf:q} --provenance {output.provenance:q}"
        " > {log:q} 2>&1"


# a target in the folder of a scenario the configuration lacks: refused naming the scenarios it has
_SCENARIO_NAMES = [s["name"] for s in config["deployment"]["scenarios"]]


rule unknown_scenario:
    output:
        "results/{exp}/deployment/{unknown}/{name}",
    log:
        "logs/{exp}/unknown_scenario_{unknown}_{name}.log",
    wildcard_constraints:
        unknown=(f"(?!(?:{_alternatives(_SCENARIO_NAMES)})/)[^/]+" if _SCENARIO_NAMES else "[^/]+"),
        name="[^/]+",
    conda:
        "../envs/analysis.yaml"
    resources:
        **job_resources("unknown_scenario"),
    params:
        refused=lambda w: refused_target(
            f"results/{w.exp}/deployment/{w.unknown}/{w.name}",
            (
                f"no scenario is named {w.unknown!r} (deployment.scenarios: {', '.join(_SCENARIO_NAMES)})"
                if _SCENARIO_NAMES
                else "deployment.scenarios is empty, so the deployment stage does not run"
            ),
        ),
    shell:
        "false"


if not SCENARIOS:

    rule no_deployment:
        output:
            "results/{exp}/deployment/{name}",
        log:
            "logs/{exp}/no_deployment_{name}.log",
        wildcard_constraints:
            name="[^/]+",
        conda:
            "../envs/analysis.yaml"
        resources:
            **job_resources("no_deployment"),
        params:
            refused=lambda w: refused_target(
                f"results/{w.exp}/deployment/{w.name}",
                "deployment.scenarios is empty, so the deployment stage does not run",
            ),
        shell:
            "false"
