"""The toy world's oracle as a scorer: the named scorer ``oracle`` (registered in pyproject.toml under
the ``lara.scorers`` entry points, so ``evaluation.reward_model: oracle`` works without the general
scorer knowing the toy world) and the ``lara oracle-score`` command.

Not to be confused with ``lara.score`` (the ``lara score`` step: reward and cost of sampled
responses with the trained models) or ``lara.scoring`` (the scorer interface and its backends).
"""

from __future__ import annotations

import logging

import numpy as np

from lara.toy.world import HARM_CATEGORIES, oracle_score, oracle_scores

log = logging.getLogger(__name__)

ROLES = {"reward": "helpfulness", "cost": "harmfulness"}


class OracleScorer:
    """The oracle's helpfulness (role reward), harmfulness (role cost) or the harmfulness of one harm category
    (role = its name: a constraint of ``calibration.constraints``) of each response."""

    def __init__(self, role: str):
        problem = oracle_role_problem(role)
        if problem:
            from lara.settings import ConfigError

            raise ConfigError(problem)
        self.role = role

    def score(self, prompts, responses) -> np.ndarray:
        if self.role in HARM_CATEGORIES:
            return np.array([oracle_score(p, r).category(self.role) for p, r in zip(prompts, responses, strict=True)],
                            dtype=np.float64)
        h, c = oracle_scores(prompts, responses)
        return h if self.role == "reward" else c


def oracle_scorer(role: str = "reward", argument: str | None = None, **_options) -> OracleScorer:
    """Factory of the named scorer ``oracle`` (batch size, dtype and device do not apply); ``oracle:<role>`` names
    the score itself (``oracle:cost`` for a constraint whose name is no role of the oracle's)."""
    return OracleScorer(argument or role)


def oracle_role_problem(role: str, argument: str | None = None) -> str | None:
    """The problem of a role the oracle does not have (None: it has it); checked when the config is read."""
    role = argument or role
    if role not in ROLES and role not in HARM_CATEGORIES:
        return (f"the oracle scorer's role is reward, cost or a harm category ({', '.join(HARM_CATEGORIES)}), got "
                f"{role!r}")
    return None


oracle_scorer.check = oracle_role_problem  # lara.scoring.spec_problem

HELP = "score a table of prompts and responses with the toy world's oracle"


def add_arguments(parser) -> None:
    parser.add_argument("--input", required=True, help="parquet/jsonl/csv with prompt and response columns")
    parser.add_argument("--out", required=True, help="output table with helpfulness and harmfulness added")
    parser.add_argument("--prompt-column", default="prompt")
    parser.add_argument("--response-column", default="response")


def run(args) -> None:
    from lara.read.files import read_table, write_table

    df = read_table(args.input, required=[args.prompt_column, args.response_column])
    df["helpfulness"], df["harmfulness"] = oracle_scores(df[args.prompt_column], df[args.response_column])
    log.info("%d rows: mean helpfulness %.3f, mean harmfulness %.3f",
             len(df), df["helpfulness"].mean(), df["harmfulness"].mean())
    write_table(df, args.out)
