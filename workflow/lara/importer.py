"""``lara import-table``: a researcher's own table into the workflow, checked against the contract of the kind it is.

    lara import-table --kind stream --role deployment --input my_log.csv --out stream.parquet \\
        --state scenario=field --state tau=-0.5

Every command reads its inputs through one reader (:mod:`lara.read.expect`) against one contract table
(:mod:`lara.read.contracts`). An artifact a step wrote carries an identity (its kind, the prompt pool it covers, the
scorers and budget it was made with) that the commands compare across their inputs. A table written outside the
workflow has none, and **one rule** holds for every kind: it is read on its content alone wherever no command
compares what only an identity states, and refused where one must (a stream, judge ratings: "written by its step
only"), naming this step. This step gives it an identity of its own:

* its content is checked as its kind's consumers check it: the columns, numbers (finite, in range, not text or
  booleans), booleans, one row per (prompt, sample), one response text per candidate, one row per prompt where the
  kind has one; a stream's visits (0..T-1, the same N candidates of one prompt at each);
* the identity says where it came from (``imported``: the source file, its sha256, ``outside_workflow: true``), the
  pool it covers (``--role``), the prompt set its rows cover, and whatever ``--state`` names (a stream's scenario and
  tau, the scorers' names): exactly the fields the consumers of that kind compare with their other inputs, so a
  stated field is held to agree like a step's own; an unstated one is not compared (say it to have it checked);
* it is written sealed (:mod:`lara.read.files`): an edit after the import is refused like an edit of a step's output.

docs/own-data.md walks through ``lara calibrate`` on hand-made scores, ``lara online`` on a hand-recorded stream and
the audit on hand-made outputs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

log = logging.getLogger(__name__)

HELP = "import a table made outside the workflow (scores, candidates, a stream, prompts, responses, judge ratings)"

ROLES = ("calibration", "test", "deployment", "train")
COUNTED = ("visits", "n")  # a stream's visits and candidates per visit: counted from its rows, never stated


def kinds() -> dict:
    """kind -> (the contract row its consumers read it with, the roles it may cover)."""
    from lara.read import contracts as c

    return {"prompts": (c.PROMPTS, ROLES), "samples": (c.SAMPLES, ROLES), "scores": (c.SCORES_ANY, ROLES),
            "stream": (c.STREAM, ("deployment",)), "responses": (c.RESPONSES, ("test",)),
            "evaluation": (c.EVALUATION, ("test",)), "judged": (c.JUDGED, ("test",))}


def stated_fields(kind: str) -> set[str]:
    """The identity fields the consumers of ``kind`` compare with their other inputs: what ``--state`` may name."""
    from lara.read.contracts import CONTRACTS

    fields = set()
    for command in CONTRACTS.values():
        for e in (*command.inputs.values(), *command.with_constraints.values()):
            if kind in e.kinds:
                fields |= set(e.agree) | set(e.states)
    return fields - {"lambda_record", *COUNTED}  # (a record's digest is its step's; the counts are the table's own)


def parse_states(pairs: list[str], kind: str) -> dict:
    """``--state KEY=VALUE`` pairs: each KEY a field the kind's consumers compare, once; VALUE JSON where it parses
    (numbers, true/false), else text."""
    from lara.settings import ConfigError

    allowed, out = stated_fields(kind), {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--state {pair!r}: write KEY=VALUE")
        if key not in allowed:
            raise ConfigError(f"--state {key}: not a field the consumers of a {kind} compare (they compare: "
                              f"{', '.join(sorted(allowed)) or 'none'})")
        if key in out:
            raise ConfigError(f"--state {key}: given twice")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
        if isinstance(out[key], float) and out[key] != out[key]:
            raise ConfigError(f"--state {key}: NaN is not a value")
    return out


def add_arguments(parser) -> None:
    parser.add_argument("--kind", required=True, choices=sorted(kinds()), help="what the table is")
    parser.add_argument("--role", required=True, choices=ROLES,
                        help="the prompt pool its rows cover (calibration, test, deployment, train)")
    parser.add_argument("--input", required=True, help="the researcher's table (parquet, CSV or jsonl)")
    parser.add_argument("--state", action="append", default=[], metavar="KEY=VALUE",
                        help="an identity field its consumers compare (a stream's scenario and tau, reward_scorer, "
                             "cost_scorer, ...); repeat for several")
    parser.add_argument("--out", required=True, help="the imported table (parquet), with its identity")


def run(args) -> None:
    from lara import identity
    from lara.io import sha256_file
    from lara.read.expect import read
    from lara.read.files import write_table
    from lara.settings import ConfigError

    expect, roles = kinds()[args.kind]
    if args.role not in roles:
        raise ConfigError(f"--role {args.role}: a {args.kind} covers {' or '.join(roles)} prompts")
    states = parse_states(args.state, args.kind)
    found = identity.read_identity(args.input)
    if found.get("kind"):
        raise ConfigError(f"--input {args.input}: already has an identity (kind {found['kind']}, written by a step): "
                          "pass it to its consumers as it is")
    art = read(args.input, "--input", replace(expect, kinds=(), roles=(), stamped=False))
    df, extra = art.df, {}
    if args.kind == "stream":
        from lara.deploy.online import read_stream

        stream = read_stream(args.input)
        extra = {"visits": int(stream.reward.shape[0]), "n": int(stream.reward.shape[1])}
    prompts = identity.prompt_set(df, f"--input {args.input}") if "prompt_id" in df.columns else None
    made = identity.stamp(args.kind, args.out, role=args.role, **extra, **states,
                          prompts=None if prompts is None else prompts.record(with_keys=True),
                          imported={"source": str(args.input), "sha256": sha256_file(args.input),
                                    "outside_workflow": True},
                          made_from={"--input": args.input})
    write_table(df, args.out, {identity.KEY: made})
    log.info("%s: %d rows of a %s (%s prompts) imported from %s as %s; states %s", args.out, len(df), args.kind,
             args.role, args.input, "sealed", states or "nothing")
