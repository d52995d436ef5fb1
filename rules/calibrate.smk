# Calibration stage: the dual multiplier from reward/cost scores of samples from pi_ref.
# (sample_calibration and score_calibration, which produce scores.parquet, come with the
# training stage's SFT policy and scorers.)


rule calibrate_lambda:
    input:
        scores="results/{exp}/calibration/scores.parquet",
    output:
        "results/{exp}/calibration/lambda.json",
    params:
        options=opts(
            tau=config["calibration"]["tau"],
            beta=config["calibration"]["beta"],
            lambda_max=config["calibration"]["lambda_max"],
            bootstrap=config["calibration"]["bootstrap"],
            quantile=config["calibration"]["quantile"],
            mode=config["calibration"]["mode"],
            tolerance=config["calibration"]["tolerance"],
            seed=config["seed"],
        ),
        code=code("lara.calibrate"),
    log:
        "logs/{exp}/calibrate_lambda.log",
    benchmark:
        "benchmarks/{exp}/calibrate_lambda.tsv"
    resources:
        **job_resources("calibrate_lambda"),
    conda:
        "../envs/analysis.yaml"
    shell:
        "lara calibrate --scores {input.scores} {params.options} --out {output} 2> {log}"
