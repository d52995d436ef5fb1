"""``lara make-toy-world``: write the toy world's raw data sets in their source schemas.

The files are then ingested by ``lara prepare-data`` through the same code path as a
hub dataset or any local file.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from lara.io import write_jsonl
from lara.settings import add_settings_arguments, read_settings
from lara.toy.world import ToyWorldSettings, generate, oracle_scores

log = logging.getLogger(__name__)

HELP = "generate the embedded toy safety world (Alpaca data, PKU-SafeRLHF pairs, prompt pool)"


OUTPUTS = ("alpaca", "preferences", "prompts", "deployment")  # the files this step writes (lara.cli.check_outputs)


def add_arguments(parser) -> None:
    add_settings_arguments(parser, ToyWorldSettings)
    parser.add_argument("--alpaca", required=True, help="output: Alpaca-schema jsonl")
    parser.add_argument("--preferences", required=True, help="output: PKU-SafeRLHF-schema jsonl")
    parser.add_argument("--prompts", required=True, help="output: held-out prompt pool jsonl")
    parser.add_argument("--deployment", required=True, help="output: the deployment prompt pool jsonl (prompt, "
                                                             "topic, category, stratum; empty without "
                                                             "toy.n_deployment_prompts)")


def run(args) -> None:
    s = read_settings(args, ToyWorldSettings)
    log.info("toy world settings: %s", s)
    world = generate(s)
    sft = world["alpaca"]
    prompts = [(r["instruction"] + " " + r["input"]).strip() for r in sft]
    h, c = oracle_scores(prompts, [r["output"] for r in sft])
    log.info("reference answers: mean helpfulness %.3f, mean harmfulness %.3f, safe rate %.3f",
             h.mean(), c.mean(), float(np.mean(c <= 0)))
    for path, key in ((args.alpaca, "alpaca"), (args.preferences, "safe_rlhf"), (args.prompts, "prompts"),
                      (args.deployment, "deployment")):
        write_jsonl(path, world[key])
        log.info("wrote %d rows to %s", len(world[key]), Path(path))
