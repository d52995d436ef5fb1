"""``lara score-constraints``: one reward and one cost per constraint for a table of sampled responses.

The output keeps the input's columns and adds ``reward`` and ``cost_<name>`` for every ``--cost name=SPEC``
(in the constraints' order): each constraint's scorer as the rule resolved it (a model directory for ``cost`` and
``category:<c>``, else the constraint's own spec). The budgets are not this step's: a new tau rescores nothing.
"""

from __future__ import annotations

from lara.score import ScoreSettings
from lara.settings import add_settings_arguments, read_settings

HELP = "score sampled responses with a reward and one cost per constraint (calibration.constraints)"


def cost_specs(pairs: list[str], constraints=None, flag: str = "--cost") -> dict[str, str]:
    """``name=SPEC`` pairs as an ordered mapping; with ``constraints``, exactly one per constraint."""
    from lara.config import ConfigError
    from lara.constraints.spec import NAME

    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, spec = pair.partition("=")
        if not sep or not name or not spec:
            raise ConfigError(f"{flag} {pair!r}: expected NAME=SPEC")
        if not NAME.match(name):
            raise ConfigError(f"{flag} {pair!r}: {name!r} is not a constraint name (lower-case identifier)")
        if name in out:
            raise ConfigError(f"{flag}: the constraint {name!r} is given twice")
        out[name] = spec
    if not out:
        raise ConfigError(f"{flag}: no constraint")
    if constraints is not None:
        want = [c.name for c in constraints]
        if sorted(out) != sorted(want):
            raise ConfigError(f"{flag}: scorers for {sorted(out)}, but --constraints names {want}")
    return out


def add_arguments(parser) -> None:
    parser.add_argument("--input", required=True, help="parquet with prompt and response columns (the samples)")
    parser.add_argument("--reward", required=True, help="reward scorer: model directory or scorer spec")
    parser.add_argument("--cost", action="append", default=[], metavar="NAME=SPEC",
                        help="the cost scorer of one constraint (once per constraint, in their order)")
    parser.add_argument("--batch-size", type=int, default=32)
    add_settings_arguments(parser, ScoreSettings)
    parser.add_argument("--out", required=True, help="output parquet (input columns + reward, cost_<name>...)")


def run(args) -> None:
    from lara.score import score_and_write

    s = read_settings(args, ScoreSettings)
    specs = cost_specs(args.cost)
    jobs = [("reward", args.reward, "reward")] + [(f"cost_{name}", spec, name) for name, spec in specs.items()]
    score_and_write(args, s, "constraint_scores", jobs,
                    {"constraints": list(specs), "reward_scorer": args.reward, "cost_scorers": specs},
                    {"reward": args.reward, "costs": specs})
