# LARA: Lagrangian Reward Augmentation, safe inference-time alignment, end to end.
#
#   snakemake --cores all                                      # the embedded toy world (config/config.yaml)
#   snakemake --profile slurm --configfile config/paper-llama.yaml   # the paper, on a SLURM GPU cluster
#
# Results path grammar (one experiment = config key `experiment`; wildcard values hold no "." or "/"):
#   results/{exp}/toy/{alpaca,safe_rlhf,prompts}.jsonl       the toy world's raw data (toy sources only)
#   results/{exp}/models/{model}/                             Hugging Face model directories (base, sft, ...)
#   results/{exp}/data/{sft,preferences}.parquet              normalised training data
#   results/{exp}/data/prompts_{calibration,test}.parquet     disjoint prompt splits
#   results/{exp}/data/prompts_value.parquet                  CD-Q training prompts (safety + instruction, neither split)
#   results/{exp}/{pool}/{samples,scores}.parquet            responses from pi_ref and their r and c; pool:
#                                                             calibration (K per calibration prompt), value
#                                                             (CD-Q training data), bon (N candidates per test prompt)
#   results/{exp}/calibration/lambda.json                     lambda-hat, bootstrap, lambda*, diagnostics
#   results/{exp}/decode/bon/sweep.csv                        Best-of-N lambda sweep (Fig. 1 data)
#   results/{exp}/decode/{method}/{lam}/responses.parquet     method: bon, args, pargs, cdq; lam: zero, star, max, 0p5
#   results/{exp}/decode/{policy}/responses.parquet           policy: sft, safe_rlhf, safedpo (fine-tuned baselines)
#   results/{exp}/eval/{method}/{lam}/{scores,judge}.parquet  evaluation scores and judge ratings (policies: eval/{policy}/)
#   results/{exp}/eval/{summary.csv,constraint_audit.json}    means with bootstrap CIs; Best-of-N at lambda* vs tau
#   results/{exp}/data/prompts_deployment.parquet           the deployment pool (never a calibration prompt)
#   results/{exp}/deployment/{samples,scores}.parquet         its K candidates per prompt from pi_ref, scored
#   results/{exp}/deployment/{scenario}/stream.parquet        a shift scenario's stream (T visits x N candidates)
#   results/{exp}/deployment/{scenario}/online_{eta}.{parquet,json}   Best-of-N with the online lambda
#   results/{exp}/deployment/{scenario}/{arms.csv,trace.parquet}     fixed lambda*, LTT, online, the oracle
#   results/{exp}/deployment/report.csv                       every scenario's arms (lara summary)
#   results/{exp}/figures/{name}.{png,pdf,provenance.json}    lambda_sweep (Fig. 1), tradeoff (Fig. 2), calibration
#   logs/{exp}/{rule}.log, benchmarks/{exp}/{rule}.tsv        per-job logs and timings
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"


wildcard_constraints:
    **WILDCARDS,


include: "rules/data.smk"
include: "rules/train.smk"
include: "rules/baselines.smk"
include: "rules/calibrate.smk"
include: "rules/decode.smk"
include: "rules/evaluate.smk"
include: "rules/deploy.smk"
include: "rules/constraints.smk"
include: "rules/figures.smk"


rule all:
    default_target: True
    input:
        final_outputs(),


check_resource_rules()
