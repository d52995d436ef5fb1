"""``lara decode-vector``: Best-of-N or ARGS with the vector lambda, scoring r - sum_j lambda_j c_j.

Settings: ``zero`` (lambda = 0), and the vector record's procedures: ``hat``, ``star`` (the deployed lambda*),
``soft``, ``bootstrap``, ``ltt``. Best-of-N picks, per test prompt, the candidate with the largest
r - sum_j lambda_j c_j (ties to the lower combined cost, then the lower sample index: the order the calibration
computed its expected costs with; one constraint is the scalar decoder's own order). ARGS scores each of the top-k
tokens by log pi_ref + w (r - sum_j lambda_j c_j) with one stepping scorer per cost (a model directory, or any
text scorer through :mod:`lara.decode.textstep`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

HELP = "decode with the vector lambda of several constraints: Best-of-N or ARGS, r - sum_j lambda_j c_j"
SETTINGS = ("zero", "hat", "star", "soft", "bootstrap", "ltt", "ltt_wsr")


def read_vector(path, constraints) -> dict:
    """A vector lambda record, checked against the constraints the step was given (names and taus)."""
    from lara.read.files import DataError, json_file

    try:
        data = json_file(Path(path), mapping=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"--lambda-json {path}: not a readable JSON record ({exc})") from None
    kind = (data.get("identity") or {}).get("kind")
    if kind != "lambda_vector":
        raise DataError(f"--lambda-json {path}: kind {kind!r}, expected lambda_vector (lara calibrate-vector's record; "
                        "a scalar lambda.json is not a vector lambda)")
    if data.get("names") != [c.name for c in constraints]:
        raise DataError(f"--lambda-json {path}: calibrated for the constraints {data.get('names')}, expected "
                        f"{[c.name for c in constraints]}")
    if data.get("tau") != [c.tau for c in constraints]:
        raise DataError(f"--lambda-json {path}: calibrated for tau {data.get('tau')}, expected "
                        f"{[c.tau for c in constraints]}")
    def plain(v):  # bounds: a tuple in the spec, a list in JSON
        return list(v) if isinstance(v, tuple | list) else v

    defaults = {"kind": "mean", "threshold": None}  # (a record of mean constraints may not name them)
    for c, got in zip(constraints, data.get("constraints") or [{}] * len(constraints), strict=False):
        for key in ("kind", "threshold", "cost", "bounds"):
            want = getattr(c, key)
            have = got.get(key, defaults.get(key, want))
            if plain(have) != plain(want):
                raise DataError(f"--lambda-json {path}: constraint {c.name} was calibrated with {key} {have!r}, "
                                f"expected {want!r} (the constraint as configured)")
    return data


UNCERTIFIED = "_uncertified"  # the name an output decoded at a procedure's lambda that certified nothing carries


def certified(setting: str, record: dict | None) -> bool:
    """Whether the record's procedure for ``setting`` found (certified) its lambda (star, zero: always)."""
    if record is None or setting == "zero":
        return True
    if setting == "star":  # lambda*: the deployed procedure's, written with --allow-infeasible when it found none
        return record.get("feasible") is not False
    return (record.get("procedures") or {}).get(setting, {}).get("feasible") is not False


def label(setting: str, record: dict | None) -> str:
    """The name an output decoded at ``setting`` is reported under: the setting, or ``<setting>_uncertified`` where
    its procedure certified nothing (the lambda where its search ended): the status is carried, never lost."""
    return setting if certified(setting, record) else setting + UNCERTIFIED


def resolve_vector(setting: str, record: dict | None, m: int, path=None, uncertified: bool = False) -> list[float]:
    """The multipliers of a setting: zeros, or the record's procedure (refused when it found none; one that
    certified nothing only where ``uncertified``: an output named so)."""
    from lara.config import ConfigError
    from lara.read.files import DataError

    if setting not in SETTINGS:
        raise ConfigError(f"--setting {setting}: one of {', '.join(SETTINGS)}")
    if setting == "zero":
        return [0.0] * m
    if record is None:
        raise ConfigError(f"--setting {setting}: read from the vector record; pass --lambda-json")
    entry = record["procedures"].get(setting if setting != "star" else record.get("guarantee", {}).get(
        "procedure", "bootstrap"), {})
    lam = record["lambda_star"] if setting == "star" else entry.get("lambda")
    if lam is None:
        raise DataError(f"--lambda-json {path}: no lambda for {setting} (the procedure did not run or found none)")
    if entry.get("feasible") is False and setting != "star" and not uncertified:
        raise DataError(f"--lambda-json {path}: the {setting} procedure found or certified no lambda (feasible: "
                        f"false; its lambda {lam} is where the search ended): decoding it as {setting!r} would report "
                        "a certificate that does not exist")
    lam = [float(x) for x in lam]
    if len(lam) != m or not all(np.isfinite(lam)) or min(lam) < 0:
        raise DataError(f"--lambda-json {path}: {setting} lambda {lam} is not {m} finite numbers >= 0")
    return lam


def select_vector(reward: np.ndarray, costs: np.ndarray, lam) -> np.ndarray:
    """(P,) the chosen candidate per prompt: argmax r - lam.c, ties as the calibration orders them."""
    from lara.calibrate.bestofn import select
    from lara.calibrate.vector import combined

    if costs.shape[2] == 1:  # the scalar decoder itself
        return select(reward, costs[..., 0], float(lam[0]))
    return select(reward, combined(costs, lam), 1.0)


def add_arguments(parser) -> None:
    parser.add_argument("--method", required=True, choices=("bon", "args"))
    parser.add_argument("--setting", required=True, choices=SETTINGS)
    parser.add_argument("--constraints", required=True, help="JSON list of the constraints (calibration.constraints)")
    parser.add_argument("--lambda-json", default=None, help="the vector lambda record (lara calibrate-vector)")
    parser.add_argument("--candidates", help="bon: the test prompts' scored candidates (lara score-constraints)")
    parser.add_argument("--prompts", help="args: parquet with prompt_id, prompt")
    parser.add_argument("--policy", help="args: pi_ref")
    parser.add_argument("--reward", help="args: the reward scorer")
    parser.add_argument("--cost", action="append", default=[], metavar="NAME=SPEC",
                        help="args: one constraint's cost scorer (once per constraint)")
    parser.add_argument("--settings", default=None, help="args: JSON of decode.rgtg.args")
    parser.add_argument("--out", required=True, help="output parquet: one response per prompt")


def _bon(args, constraints, lam, record):
    from lara import identity
    from lara.constraints.calibrate import load_vector_scores
    from lara.read.files import DataError

    if args.candidates is None:
        raise DataError("--method bon needs --candidates")
    scores = load_vector_scores(args.candidates, constraints, "--candidates")
    counts = scores.mask.sum(axis=1)
    if counts.min() != counts.max():
        raise DataError(f"--candidates {args.candidates}: prompts have {counts.min()}..{counts.max()} candidates; "
                        "Best-of-N needs N each")
    n = int(counts[0])
    if record is not None and record["decoder"]["n"] != n:
        raise DataError(f"--candidates {args.candidates}: Best-of-{n}, but {args.lambda_json} was calibrated for "
                        f"Best-of-{record['decoder']['n']}")
    art = scores.source
    df = art.df
    pick = select_vector(scores.reward, scores.costs, lam)
    # the rows in from_long's layout: prompts sorted by id, samples in file order
    order = np.argsort(df["prompt_id"].to_numpy(), kind="stable")
    rows = order.reshape(len(scores.prompt_ids), n)[np.arange(len(pick)), pick]
    out = df.iloc[rows].reset_index(drop=True)
    scorers = identity.inherit(art.identity, "reward_scorer", "cost_scorers")
    return out, scores.prompts, {"n": n}, scorers


def _args(args, constraints, lam):
    from lara import identity
    from lara.config import require_model
    from lara.constraints.score import cost_specs
    from lara.decode.rgtg import ARGSSettings, decode
    from lara.read.files import DataError, read_table
    from lara.settings import read_settings

    for flag in ("prompts", "policy", "reward", "settings"):
        if getattr(args, flag) is None:
            raise DataError(f"--method args needs --{flag}")
    s = read_settings(args, ARGSSettings)
    specs = cost_specs(args.cost, constraints)
    df = read_table(args.prompts, required=("prompt_id", "prompt"))
    prompts = identity.prompt_set(df, f"--prompts {args.prompts}", per_prompt=1)
    require_model(args.policy, "--policy")
    tok, pm, rm, cms, steppers = load_vector_models(args.policy, args.reward, constraints, specs, s.dtype)
    tokens = decode(pm, rm, cms, tok, df["prompt"].tolist(), lam, s, s.seed, steppers=steppers)
    out = df[["prompt_id", "prompt"]].copy()
    out["response"] = [tok.decode(t, skip_special_tokens=True).strip() for t in tokens]
    out["n_tokens"] = [len(t) for t in tokens]
    return out, prompts, {"settings": s.__dict__}, {"reward_scorer": args.reward, "cost_scorers": specs}


class LossStepper:
    """A cost stepper scoring a probability constraint's loss, 1[c > threshold], of every candidate token (the
    loss Best-of-N is calibrated and audited on; token by token a step, so ARGS only sees a candidate cross it)."""

    def __init__(self, inner, threshold: float):
        self.inner, self.threshold = inner, threshold

    def __getattr__(self, name):  # start, commit: the inner stepper's own
        return getattr(self.inner, name)

    def candidates(self, cand):
        return (self.inner.candidates(cand) > self.threshold).float()


def load_vector_models(policy: str, reward: str, constraints, specs: dict, dtype: str):
    """pi_ref, the reward and cost models, and a function building every scorer's stepper for a batch: text steppers
    when any scorer is not a model directory of the policy's vocabulary (e.g. a named text classifier), each
    probability constraint's cost stepper scoring its loss (:class:`LossStepper`); None when neither is needed, so
    decode builds the model directories' steppers itself, as before."""
    from lara.decode.rgtg import load_models, make_scorer
    from lara.scoring import named_scorers

    costs = [specs[c.name] for c in constraints]
    named = named_scorers()
    text = any(spec.split(":", 1)[0] in named for spec in [reward, *costs])
    tok, pm, rm, cms = load_models("args", policy, reward, costs, dtype, scorers=not text)
    if not text and all(c.kind == "mean" for c in constraints):
        return tok, pm, rm, cms, None
    if text:
        from lara.decode.textstep import TextScorerStepper
        from lara.scoring import load_scorer

        own_fluency = _is_policy_fluency(reward, policy)
        scorers = [None if own_fluency and i == 0 else load_scorer(spec, role=role) for i, (spec, role)
                   in enumerate(zip([reward, *costs], ["reward", *(c.name for c in constraints)], strict=True))]

    def steppers(batch):
        made = ([PolicyFluencyStepper(pm) if sc is None else TextScorerStepper(sc, tok, batch) for sc in scorers]
                if text else [make_scorer(m) for m in (rm, *cms)])
        return made[0], [LossStepper(st, c.threshold) if c.kind == "probability" else st
                         for c, st in zip(constraints, made[1:], strict=True)]

    return tok, pm, rm, cms, steppers


def _is_policy_fluency(spec: str, policy: str) -> bool:
    name, sep, arg = spec.partition(":")
    return name == "fluency" and bool(sep) and Path(arg).resolve() == Path(policy).resolve()


class PolicyFluencyStepper:
    """The fluency reward (:mod:`lara.realtext.fluency`) of a partial response when its scorer is the policy itself:
    the mean log pi_ref of the generated tokens and the candidate, read off the policy's own next-token
    log-probabilities (a second incremental state; no re-encoding of the text). A partial response has no EOS yet,
    so this is the complete-response reward's running part."""

    def __init__(self, model):
        from lara.decode.rgtg import PolicyStepper

        self.policy = PolicyStepper(model)
        self.dev = self.policy.dev

    def start(self, ids, mask):
        import torch

        self.policy.start(ids, mask)
        self.total = torch.zeros(ids.shape[0], device=self.dev)
        self.count = 0

    def candidates(self, cand):
        self.lp = self.policy.logprobs().gather(1, cand.to(self.dev))
        return (self.total[:, None] + self.lp) / (self.count + 1)

    def commit(self, tokens, choice, alive):
        import torch

        rows = torch.arange(len(choice), device=self.dev)
        self.total = torch.where(alive.to(self.dev), self.total + self.lp[rows, choice.to(self.dev)], self.total)
        self.count += 1
        self.policy.commit(tokens, choice, alive)


def run(args) -> None:
    from lara import identity
    from lara.constraints.spec import from_arg
    from lara.provenance import code_version
    from lara.read.files import write_table

    constraints = from_arg(args.constraints)
    record = None if args.lambda_json is None else read_vector(args.lambda_json, constraints)
    lam = resolve_vector(args.setting, record, len(constraints), args.lambda_json, uncertified=True)
    name = label(args.setting, record)
    if name != args.setting:
        log.warning("the %s procedure of %s certified nothing: decoding at its search's end %s, reported as %s",
                    args.setting, args.lambda_json, lam, name)
    out, prompts, extra, scorers = (_bon(args, constraints, lam, record) if args.method == "bon"
                                    else _args(args, constraints, lam))
    out["method"], out["setting"] = args.method, name
    out["lambda"] = json.dumps(lam)
    log.info("%s at %s lambda %s: %d responses", args.method, args.setting, lam, len(out))
    src = args.candidates if args.method == "bon" else args.prompts
    rec = {} if record is None or args.setting == "zero" else {"lambda_record": identity.file_digest(args.lambda_json),
                                                                "tau": record["tau"]}
    made = identity.stamp("responses_vector", args.out, method=args.method, setting=name, lambdas=lam,
                          certified=certified(args.setting, record),
                          names=[c.name for c in constraints], role=identity.role_of(src), prompts=prompts.record(),
                          **rec, **({"n": extra["n"]} if "n" in extra else {}), **scorers,
                          made_from={"--candidates" if args.method == "bon" else "--prompts": src})
    write_table(out, args.out, {"method": args.method, "setting": name, "lambda": lam, "code": code_version(),
                                **extra, identity.KEY: made})
