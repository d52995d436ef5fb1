"""``lara import-table``: a researcher's own table into the workflow, checked against the contract of the kind it is.

    lara import-table --kind stream --role deployment --input my_log.csv --out stream.parquet \\
        --state scenario=field --state tau=-0.5

A table made outside the workflow carries no identity; the one rule for it (read on its content alone wherever no
command compares what only an identity states, refused where one must, naming this step), what this step checks (the
kind's contract row, :func:`check_content`, :func:`check_stated`), the identity it gives (``imported``: the source
and its sha256, ``outside_workflow: true``; ``--role``; the prompt set; what ``--state`` names, exactly the fields
the kind's consumers compare, held to agree like a step's own) and its seal (an edit after the import is refused
like an edit of a step's output) are docs/own-data.md's, which walks through ``lara calibrate`` on hand-made
scores, ``lara online`` on a hand-recorded stream and the audit on hand-made outputs.
"""

from __future__ import annotations

import logging
import math
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


# what a stated field must be: tau a finite number, counts whole numbers >= 1, everything else non-empty text
NUMBER_FIELDS, COUNT_FIELDS = ("tau",), ("window", "batch_size")


def parse_states(pairs: list[str], kind: str) -> dict:
    """``--state KEY=VALUE`` pairs: each KEY a field the kind's consumers compare, once, with a value of its type (tau
    a finite number, window and batch_size whole numbers >= 1, names non-empty text)."""
    from lara.settings import ConfigError

    allowed, out = stated_fields(kind), {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value.strip():
            raise ConfigError(f"--state {pair!r}: write KEY=VALUE (a value, not nothing)")
        if key not in allowed:
            raise ConfigError(f"--state {key}: not a field the consumers of a {kind} compare (they compare: "
                              f"{', '.join(sorted(allowed)) or 'none'})")
        if key in out:
            raise ConfigError(f"--state {key}: given twice")
        out[key] = _typed(key, value)
    return out


def _typed(key: str, value: str):
    from lara.settings import ConfigError

    if key in NUMBER_FIELDS or key in COUNT_FIELDS:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        whole = key not in COUNT_FIELDS or (math.isfinite(number) and number >= 1 and number == int(number))
        if not math.isfinite(number) or not whole or value.strip().lower() in ("true", "false"):
            what = "a finite number" if key in NUMBER_FIELDS else "a whole number >= 1"
            raise ConfigError(f"--state {key}={value}: {key} is {what}")
        return int(number) if key in COUNT_FIELDS else number
    if value != value.strip():
        raise ConfigError(f"--state {key}={value!r}: a name without surrounding spaces")
    return value


def check_stated(df, states: dict, where: str) -> None:
    """A stated field that is also a column of the table must be what every row says."""
    from lara.read.expect import _rows
    from lara.read.files import DataError

    for key, value in states.items():
        if key in df.columns:
            column = df[key]
            same = column.map(lambda v, want=value: v == want or (isinstance(want, float) and isinstance(
                v, (int, float)) and not isinstance(v, bool) and math.isclose(v, want, rel_tol=1e-9)))
            if not same.all():
                raise DataError(f"{where}: --state {key}={value} but column {key!r} says {str(column[~same].iloc[0])} "
                                f"at {_rows(~same.to_numpy())}: the table and the statement disagree")


def check_content(df, kind: str, where: str) -> None:
    """What the kind's consumers read beyond its contract row, checked now rather than there: response and prompt
    texts present (a response may be empty: a model can stop at once; a prompt may not), a lambda a number or empty
    (a policy's), lengths whole numbers >= 1."""
    import numpy as np
    import pandas as pd

    from lara.read.expect import _rows, check_nullable_numbers
    from lara.read.files import DataError

    if kind in ("samples", "responses") and "prompt" not in df.columns:
        raise DataError(f"{where}: no 'prompt' column: the {kind}' consumers score each response with its prompt")
    for col in ("prompt", "response"):
        if col in df.columns:
            bad = ~df[col].map(lambda v, c=col: isinstance(v, str) and (c == "response" or bool(v.strip())))
            if bad.any():
                raise DataError(f"{where}: column {col!r} holds {df[col][bad].iloc[0]!r} at {_rows(bad.to_numpy())}: "
                                f"every {col} is {'text' if col == 'response' else 'non-empty text'}")
    nullable = ["lambda"] if "lambda" in df.columns else []
    check_nullable_numbers(df, nullable + [c for c in df.columns if kind == "judged" and c.startswith("judge_")], where)
    if "n_tokens" in df.columns:
        n = pd.to_numeric(df["n_tokens"], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(n) | (n < 1) | (n != np.round(n)) | df["n_tokens"].map(lambda v: isinstance(v, bool))
        if bad.any():
            raise DataError(f"{where}: column 'n_tokens' holds {df['n_tokens'][bad].iloc[0]!r} at {_rows(bad)}: a "
                            "length is a whole number of tokens >= 1")


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
    check_stated(df, states, f"--input {args.input}")
    check_content(df, args.kind, f"--input {args.input}")
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
