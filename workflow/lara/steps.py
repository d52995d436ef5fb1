"""The step registry: each ``lara`` subcommand, the module that implements it and, for a step without a config
section of its own, its settings class (one place, read by the command line (:mod:`lara.cli`), the code hashes of the
rules (:mod:`lara.codehash`) and the settings (:mod:`lara.settings`))."""

from __future__ import annotations

# the calibration core's decoders with a command of their own (lara.calibrate.decoder): each is calibrated on the lambda
# grid from the calibration samples with their lengths (--scores) and writes a record of its decoder kind. Registered
# here once: the command, its settings, its input row and its record's row (lara.read.contracts) and the jobs
# validate-config builds (lara.config.runs, from the settings class's ``jobs``) all derive from this table.
# command -> (module, settings class, decoder kind)
CORE_DECODERS: dict[str, tuple[str, str, str]] = {
    "calibrate-best-of-k": ("lara.calibrate.best_of_k", "BestOfKSettings", "best_of_k"),
}

# subcommand -> module; grouped by workflow stage, in DAG order.
COMMANDS: dict[str, str] = {
    # configuration
    "validate-config": "lara.config",
    "settings-schema": "lara.settings",
    "fetch": "lara.hub",
    # data
    "make-toy-world": "lara.toy.make_world",
    "make-toy-model": "lara.toy.model",
    "import-gguf": "lara.gguf",
    "prepare-data": "lara.data.ingest",
    "import-table": "lara.importer",
    "split-prompts": "lara.data.splits",
    "value-prompts": "lara.data.value_prompts",
    "rtp-prompts": "lara.realtext.prompts",
    "realtext-pool": "lara.realtext.pool",
    "slur-prompts": "lara.realtext.slurs",
    # training
    "train-sft": "lara.train.sft",
    "train-reward": "lara.train.reward",
    "train-cost": "lara.train.cost",
    "train-partial": "lara.train.partial",
    "train-value": "lara.train.value",
    # baselines that update the weights
    "train-safe-rlhf": "lara.train.ppo_lag",
    "train-safedpo": "lara.train.safedpo",
    # sampling and scoring (calibration, Best-of-N candidates, policies)
    "sample": "lara.sample",
    "score": "lara.score",
    # calibration
    "calibrate": "lara.calibrate.calibrate",
    "calibrate-decoder": "lara.decode.direct",
    "coverage": "lara.calibrate.coverage",
    "score-prefixes": "lara.decode.prefixes",
    "calibrate-prune": "lara.calibrate.prune_record",
    "coverage-prune": "lara.calibrate.prune_coverage",
    **{name: module for name, (module, _, _) in CORE_DECODERS.items()},
    # decoding
    "select-bon": "lara.decode.bon",
    "bon-sweep": "lara.decode.sweep",
    "select-bon-prune": "lara.decode.prune",
    "bon-prune-sweep": "lara.decode.prune_sweep",
    "choose-decoder": "lara.decode.budget",
    "rgtg": "lara.decode.rgtg",
    "generate-policy": "lara.decode.policy",
    # after deployment: the shift scenarios, the online lambda, the arms
    "deployment-pool": "lara.deploy.pool",
    "make-stream": "lara.deploy.stream",
    "online": "lara.deploy.online",
    "deploy-arms": "lara.deploy.arms",
    "deployment-report": "lara.deploy.report",
    "prompt-features": "lara.deploy.features",
    "shift-check": "lara.deploy.shift",
    # several constraints at once (calibration.constraints)
    "category-pairs": "lara.constraints.pairs",
    "score-constraints": "lara.constraints.score",
    "calibrate-vector": "lara.constraints.calibrate",
    "decode-vector": "lara.constraints.decode",
    "audit-constraints": "lara.constraints.audit",
    "coverage-vector": "lara.constraints.coverage",
    # evaluation, figures, provenance
    "evaluate": "lara.evaluate.evaluate",
    "judge": "lara.evaluate.judge",
    "aggregate": "lara.evaluate.aggregate",
    "figure": "lara.evaluate.figures",
    "trail": "lara.trail",
    "summary": "lara.evaluate.summary",
    "oracle-score": "lara.toy.score",
}

# the steps that read no config section of their own (only other sections' keys): the settings class in each one's
# module (lara.settings.STEPS)
SECTIONLESS: dict[str, str] = {
    "score": "ScoreSettings",
    "bon-sweep": "SweepSettings",
    "coverage-prune": "PruneCoverageSettings",
    **{name: settings for name, (_, settings, _) in CORE_DECODERS.items()},
    "score-prefixes": "PrefixSettings",
    "select-bon-prune": "PruneScheduleSettings",
    "bon-prune-sweep": "PruneSweepSettings",
    "aggregate": "AuditSettings",
    "calibrate-decoder": "DirectSettings",
    "prompt-features": "FeatureSettings",
    "category-pairs": "CategoryPairsSettings",
}

# the steps that run torch models: they get deterministic algorithms and exactly the job's threads
TORCH_COMMANDS = {"make-toy-model", "import-gguf", "train-sft", "train-reward", "train-cost", "train-partial",
                  "train-value", "train-safe-rlhf", "train-safedpo", "sample", "score", "rgtg", "generate-policy",
                  "evaluate", "calibrate-decoder", "prompt-features", "score-prefixes", "score-constraints",
                  "decode-vector"}
