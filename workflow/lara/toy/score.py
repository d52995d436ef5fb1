"""``lara oracle-score``: score (prompt, response) rows with the toy world's oracle."""

from __future__ import annotations

import logging

from lara.data.tables import read_table, write_table
from lara.toy.world import oracle_scores

log = logging.getLogger(__name__)

HELP = "score a table of prompts and responses with the toy world's oracle"


def add_arguments(parser) -> None:
    parser.add_argument("--input", required=True, help="parquet/jsonl/csv with prompt and response columns")
    parser.add_argument("--out", required=True, help="output table with helpfulness and harmfulness added")
    parser.add_argument("--prompt-column", default="prompt")
    parser.add_argument("--response-column", default="response")


def run(args) -> None:
    df = read_table(args.input, required=[args.prompt_column, args.response_column])
    df["helpfulness"], df["harmfulness"] = oracle_scores(df[args.prompt_column], df[args.response_column])
    log.info("%d rows: mean helpfulness %.3f, mean harmfulness %.3f",
             len(df), df["helpfulness"].mean(), df["harmfulness"].mean())
    write_table(df, args.out)
