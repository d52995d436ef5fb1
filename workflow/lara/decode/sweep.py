"""``lara bon-sweep``: the Best-of-N lambda sweep (the data of the paper's Fig. 1)."""

from __future__ import annotations

import json
import logging
import time

import numpy as np

from lara.decode.bon import score_matrix, sweep, warn_if_fewer_than_k

log = logging.getLogger(__name__)

HELP = "Best-of-N lambda sweep: mean reward, mean cost and safe fraction over a lambda grid"


def add_arguments(parser) -> None:
    parser.add_argument("--candidates", required=True, help="scored candidates (prompt_id, sample_id, reward, cost)")
    parser.add_argument("--grid", required=True, help="JSON list of lambda values")
    parser.add_argument("--lambda-json", default=None, help="lambda.json: adds lambda-hat and lambda*")
    parser.add_argument("--out", required=True, help="output CSV")


def run(args) -> None:
    from lara.data.tables import read_table, write_table

    df = read_table(args.candidates, required=("prompt_id", "sample_id", "reward", "cost"))
    _, reward, cost, _ = score_matrix(df)
    warn_if_fewer_than_k(reward.shape[1], args.lambda_json)
    lams = [float(x) for x in json.loads(args.grid)]
    labels = ["grid"] * len(lams)
    if args.lambda_json:
        rec = json.loads(open(args.lambda_json).read())
        lams += [rec["lambda_hat"], rec["lambda_star"]]
        labels += ["lambda_hat", "lambda_star"]
    t0 = time.perf_counter()
    table = sweep(reward, cost, np.asarray(lams))
    log.info("sweep of %d lambdas x %d prompts x %d candidates in %.4f s", len(lams), *reward.shape,
             time.perf_counter() - t0)
    table.insert(1, "label", labels)
    for row in table.itertuples(index=False):
        log.info("lambda=%.4f (%s): mean reward %.4f, mean cost %.4f, safe %.3f", row[0], row[1], row[2], row[3], row[4])
    write_table(table, args.out)
