"""``lara deploy-arms``: the ways of setting lambda on one scenario's stream, side by side.

* ``fixed_star``: the calibrated lambda* (lambda.json's deployed lambda), fixed for the whole stream;
* ``fixed_ltt``: the Learn-then-Test certified lambda of the same record (when it has one), fixed;
* ``fixed_weighted``: the covariate-shift weighted lambda* for this scenario (when it is certified);
* ``online_eta_<eta>``: the online lambda from lambda* (``lara online``, one arm per step size);
* ``oracle``: the best fixed lambda in hindsight for this stream: the smallest lambda whose stream mean cost is
  <= tau (the stream's mean chosen cost and reward are non-increasing in lambda, so it is also the fixed lambda
  with the most reward that holds tau). None exists when even the stream's safest candidates average above tau.

Per arm: the long-run mean cost and reward, the worst mean cost over W consecutive visits, the certificate (online
arms), the reward given up against the oracle and the lambda trace (trace.parquet, for the figure).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd

from lara import identity
from lara.data.errors import DataError
from lara.deploy.online import worst_window
from lara.deploy.settings import DeploymentSettings
from lara.settings import add_settings_arguments, read_settings

log = logging.getLogger(__name__)

HELP = "the deployment arms on one scenario's stream: fixed lambda*, fixed LTT, online, the oracle"
OUTPUTS = ("out", "trace")
ORACLE_MAX = 1e12  # the largest fixed lambda the oracle tries: beyond it every visit takes its safest candidate


def chosen(reward: np.ndarray, cost: np.ndarray, lam) -> tuple[np.ndarray, np.ndarray]:
    """(cost, reward) of the Best-of-N choice at a fixed lambda on every visit (the decoder's order); with (T, N, m)
    costs and a lambda vector, ((T, m) costs, (T,) reward) of the vector decoder's choice."""
    from lara.calibrate.bestofn import select
    from lara.constraints.decode import select_vector

    pick = select(reward, cost, lam) if cost.ndim == 2 else select_vector(reward, cost, np.asarray(lam, dtype=float))
    rows = np.arange(len(reward))
    return cost[rows, pick], reward[rows, pick]


def oracle(reward: np.ndarray, cost: np.ndarray, tau: float, tol: float = 1e-10) -> float | None:
    """The smallest fixed lambda whose stream mean cost is <= tau (to ``tol``, relative), None if none is."""
    if chosen(reward, cost, 0.0)[0].mean() <= tau:
        return 0.0
    hi = 1.0
    while chosen(reward, cost, hi)[0].mean() > tau:
        hi *= 4.0
        if hi > ORACLE_MAX:
            return None
    lo = 0.0
    while hi - lo > tol * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if chosen(reward, cost, mid)[0].mean() <= tau:
            hi = mid
        else:
            lo = mid
    return hi


def _coords(names, *arrays):
    """(j, name, each array's column j) per constraint j of ``names``; the arrays whole, once, for the one cost."""
    if names is None:
        yield 0, None, *arrays
    for j, cname in enumerate(names or []):
        yield j, cname, *(a[:, j] for a in arrays)


def arm_rows(name: str, cost: np.ndarray, reward: np.ndarray, lam: np.ndarray, s: DeploymentSettings, names=None,
             tau=None, per: dict | None = None, **extra) -> list[dict]:
    """One arm's rows: one for the one cost (``names`` None, against deployment's tau), or one per constraint j of
    ``names`` with (T, m) costs and lambdas: its lambda_j, mean and worst-window cost_j against tau_j; an online
    arm's certificate from ``per``, its summary by constraint (the one cost's under None)."""
    rows = []
    for j, cname, c, lam_j in _coords(names, cost, lam):
        row = {"arm": name, **({} if names is None else {"constraint": cname}), "T": len(reward), "window": s.window,
               "tau": s.tau if names is None else float(tau[j]), "lambda_start": float(lam_j[0]),
               "lambda_end": float(lam_j[-1]), "lambda_min": float(lam_j.min()), "lambda_max": float(lam_j.max()),
               "mean_cost": float(c.mean()), "mean_reward": float(reward.mean()),
               "worst_window_cost": worst_window(c, s.window)}
        cert = {} if per is None else {k: float(per[cname][k]) for k in (
            "certificate", "mean_certificate", "lambda_end", "lambda_min", "lambda_max")}
        # the two tables' column orders as they always were: the one cost's step size comes before its certificate
        rows.append(row | extra | cert if names is None else row | cert | extra)
    return rows


def fixed_arms(record, weighted: float | None) -> list[tuple[str, float]]:
    """The fixed lambdas: lambda*, LTT's (if recorded), the weighted one (if given and certified)."""
    arms = [("fixed_star", record.lambda_star)]
    ltt = ((record.get("procedures") or {}).get("ltt") or {})
    if isinstance(ltt.get("lambda"), (int, float)) and ltt.get("feasible", True):
        arms.append(("fixed_ltt", float(ltt["lambda"])))
    else:
        log.info("%s has no feasible LTT lambda (calibration.cost_bounds unset?): no fixed_ltt arm", record.path)
    if weighted is not None:
        arms.append(("fixed_weighted", weighted))
    return arms


def online_arm(path, stream, s: DeploymentSettings, record_path, stream_path=None, names=None, tau=None
               ) -> tuple[str, pd.DataFrame, dict]:
    """An online arm's per-visit table, checked against the stream it claims to have run on; with constraints
    ``names`` (their budgets ``tau``) a vector run's (``lara online --constraints``), for these constraints."""
    from lara.calibrate.record import literal_name
    from lara.read.files import read_metadata, read_table

    made = identity.read_identity(path)
    if names is None and made.get("kind") != "online":
        raise DataError(f"--online {path}: not the output of `lara online` (identity kind {made.get('kind')!r})")
    if names is not None and (made.get("kind") != "online" or made.get("constraints") != list(names)):
        raise DataError(f"--online {path}: not the output of `lara online --constraints` for the constraints "
                        f"{list(names)} (identity kind {made.get('kind')!r}, constraints {made.get('constraints')!r})")
    columns = ("lambda", "cost", "mean_cost", "certificate")
    df = read_table(path, required=("t", "prompt_id", "sample_id", "reward", *(
        columns if names is None else [f"{k}_{n}" for n in names for k in columns])))
    if len(df) != len(stream.reward) or (df["prompt_id"].to_numpy(object) != stream.prompt_id).any():
        raise DataError(f"--online {path}: its visits are not this stream's ({len(df)} visits; the stream has "
                        f"{len(stream.reward)}): an online run on another scenario's stream?")
    if names is None and float(made.get("tau", math.nan)) != s.tau:
        raise DataError(f"--online {path}: run for tau = {made.get('tau')}, this audit is for tau = {s.tau:g}")
    if names is not None and [float(t) for t in made.get("tau") or []] != list(tau):
        raise DataError(f"--online {path}: run for tau {made.get('tau')}, this audit is for tau {list(tau)}")
    ran_on = (made.get("made_from") or {}).get("--candidates")
    if stream_path is not None and ran_on is not None and ran_on != identity.file_digest(stream_path):
        raise DataError(f"--online {path}: ran on another stream than --candidates {stream_path} (another scoring "
                        "or draw of the pool: its visits' candidates differ); rerun `lara online` on this stream")
    if made.get("lambda_record") != identity.file_digest(record_path):
        raise DataError(f"--online {path}: started from another lambda record than --lambda-json {record_path}")
    summary = read_metadata(path).get("summary") or {}
    if names is None and not isinstance(summary.get("certificate"), (int, float)):
        raise DataError(f"--online {path}: no summary with its certificate (written by `lara online`)")
    if names is not None and set(summary.get("constraints") or {}) != set(names):
        raise DataError(f"--online {path}: no per-constraint summary with its certificates (written by `lara online "
                        "--constraints`)")
    for key, want in (("batch_size", s.batch_size), ("lambda_cap", s.lambda_cap)):
        if made.get(key) != want:  # an identity leaves out what is None: no lambda_cap stated is no cap
            raise DataError(f"--online {path}: run with {key} {made.get(key)}, this report's deployment.{key} is "
                            f"{want}; the arms of one report share the online settings (rerun `lara online` with them)")
    # a vector run states its window in its identity; a scalar table may state it in its summary only
    window = made.get("window", summary.get("window") if names is None else None)
    if window != s.window:
        raise DataError(f"--online {path}: its certificate is stated for windows of {window} visits, this report's "
                        f"for {s.window} (deployment.window); a certificate is never restated for another window: "
                        "rerun `lara online` with this window")
    return f"online_eta_{literal_name(float(made['step_size']))}", df, made | {"summary": summary}


def weighted_lambda(path, s: DeploymentSettings, n: int, scenario: str | None, star=None
                    ) -> tuple[float | None, bool]:
    """The scenario's covariate-shift weighted lambda* and whether it is certified (its ESS reached
    deployment.shift.min_ess): an uncertified one is reported, never deployed as an arm. It and ``star`` (the
    --lambda-json record) are one calibration but for the weights: the same scores and calibration settings."""
    from lara.calibrate.record import check_budget, read_lambda

    record = read_lambda(path, allow_uncertified=True)
    if not record.weighted:
        raise DataError(f"--weighted {path}: not a weighted calibration record (lara calibrate --weights)")
    check_budget(record, s.tau, n, key="deployment (calibration.tau)")
    ours, theirs = (dict(r.get("settings") or {}, decoder=r.decoder, scores=str((r.get("scores") or {}).get(
        "sha256"))[:16]) for r in (record, star or record))
    differ = [k for k in sorted(set(ours) | set(theirs)) if ours.get(k) != theirs.get(k)][:3]
    if differ:
        raise DataError(f"--weighted {path}: calibrated with {', '.join(f'{k} {ours.get(k)}' for k in differ)}, but "
                        f"--lambda-json {star.path} with {', '.join(f'{k} {theirs.get(k)}' for k in differ)}: the "
                        "weighted arm and lambda* are one calibration but for the weights (one calibration section, "
                        "one --scores)")
    made_for = (record.get("identity") or {}).get("scenario")
    if made_for is not None and scenario is not None and made_for != scenario:
        raise DataError(f"--weighted {path}: weighted for scenario {made_for!r}, not this stream's {scenario!r}")
    return (record.lambda_star, True) if record.certified else (None, False)


def check_made_on(args, stream: str) -> None:
    """The shift check and the weighted record beside the arms were made on this stream (their identities name its
    digest): another draw of the same scenario is another deployment sample."""
    for flag, path in (("--shift", args.shift), ("--weighted", args.weighted)):
        made = identity.read_identity(path) if path else {}
        if made.get("stream") not in (None, stream):
            raise DataError(f"{flag} {path}: made on another stream ({made['stream']}) than --candidates "
                            f"{args.candidates} ({stream}): another draw of the scenario")


# ---------------------------------------------------------------------------------------------------------------
# several constraints (deployment.follows: constraints): the vector record's lambdas, one row per arm and constraint


def oracle_vector(reward: np.ndarray, costs: np.ndarray, tau, direction) -> tuple[float | None, dict]:
    """The best fixed lambda in hindsight along the record's direction d: the smallest s >= 0 whose stream mean
    cost vector at lambda = s d meets every tau_j, found exactly (every s where some visit's choice changes, as
    :func:`lara.calibrate.vector.ray_path` walks a calibration pool, with the stream's visits as its prompts and
    N = K: the choice is the decoder's, no expectation), and the s actually decoded: where rounding puts the
    first feasible breakpoint itself a hair above some tau, the middle of its segment. None: no s meets every
    tau (the visits' lowest-combined-cost candidates average above some tau). Restricted to one ray, it is not
    the best fixed vector lambda over all directions."""
    from lara.calibrate.vector import first_feasible, ray_path

    d = np.asarray(direction, dtype=float)
    tau = np.asarray(tau, dtype=float)
    path = ray_path(reward, costs, np.ones(reward.shape, dtype=bool), d, reward.shape[1], math.inf)
    s, t = first_feasible(path, tau)
    info = {"direction": d.tolist(), "breakpoints": len(path.s) - 1}
    if s is None:
        return None, info | {"safest_mean_cost": path.mean[-1].tolist()}
    nxt = path.s[t + 1] if t + 1 < len(path.s) else 2.0 * s + 1.0
    for at in (s, 0.5 * (s + nxt)):
        cost, _ = chosen(reward, costs, at * d)
        if np.all(cost.mean(axis=0) <= tau):
            return float(at), info | {"s": float(at), "s_first": float(s)}
    raise DataError(f"the oracle's s = {s:.6g} along {d.tolist()} meets tau {tau.tolist()} on the exact path but not "
                    "when decoded: a rounding case this search does not resolve")


def fixed_arms_vector(record: dict, path) -> list[tuple[str, list[float]]]:
    """The vector record's fixed lambdas: lambda*, then each certified LTT procedure's (ltt, ltt_wsr)."""
    arms = [("fixed_star", [float(x) for x in record["lambda_star"]])]
    for proc in ("ltt", "ltt_wsr"):
        entry = (record.get("procedures") or {}).get(proc) or {}
        if entry.get("lambda") is not None and entry.get("feasible") is True:
            arms.append((f"fixed_{proc}", [float(x) for x in entry["lambda"]]))
        else:
            log.info("%s has no certified %s lambda: no fixed_%s arm", path, proc, proc)
    return arms


def run_arms(stream, record, online: list, s: DeploymentSettings, weighted: float | None = None, names=None,
             tau=None, path=None):
    """The arms' summary rows, traces and oracle search on ``stream``: one row per arm for the one cost (``weighted``
    the weighted lambda*, if certified); with constraints ``names`` (budgets ``tau``, the vector ``record`` at
    ``path``, (T, N, m) costs) one row per arm and constraint, the oracle along the record's ray."""
    rows, traces = [], []
    length, vector = len(stream.reward), names is not None
    if vector:
        d = np.asarray(record["direction"], dtype=float)
        at, info = oracle_vector(stream.reward, stream.cost, tau, record["direction"])
        fixed = fixed_arms_vector(record, path)
        lam_oracle = None if at is None else (at * d).tolist()
    else:
        at, info, fixed = None, None, fixed_arms(record, weighted)
        lam_oracle = oracle(stream.reward, stream.cost, s.tau)
    for name, lam in fixed + ([("oracle", lam_oracle)] if lam_oracle is not None else []):
        cost, reward = chosen(stream.reward, stream.cost, lam)
        lam_t = np.tile(np.asarray(lam, dtype=float), (length, 1)) if vector else np.full(len(cost), lam)
        rows += arm_rows(name, cost, reward, lam_t, s, names, tau, **({"oracle_s": at} if vector and name == "oracle"
                                                                       else {}))
        traces.append((name, lam_t, cost, reward))
    if lam_oracle is None:
        cost, reward = chosen(stream.reward, stream.cost, ORACLE_MAX * d if vector else ORACLE_MAX)
        if vector:
            log.warning("no lambda along %s meets every tau %s on this stream: its lowest-combined-cost candidates "
                        "average %s", d.tolist(), list(tau), cost.mean(axis=0).tolist())
        else:
            log.warning("no fixed lambda meets tau = %g on this stream: its safest candidates average %.4g", s.tau,
                        cost.mean())
        rows += arm_rows("oracle", cost, reward, np.full(cost.shape, math.inf), s, names, tau, feasible=False)
    for name, df, made in online:
        cost, lam_t, reward = (df[k].to_numpy(float) if not vector or k == "reward" else
                               np.stack([df[f"{k}_{n}"].to_numpy(float) for n in names], axis=1)
                               for k in ("cost", "lambda", "reward"))
        summary = made["summary"]
        rows += arm_rows(name, cost, reward, lam_t, s, names, tau, per=summary["constraints"] if vector else
                         {None: summary}, step_size=float(made["step_size"]), batch_size=int(made["batch_size"]))
        traces.append((name, lam_t, cost, reward))
    table = pd.DataFrame(rows)
    table["feasible"] = table["feasible"].fillna(True).astype(bool) if "feasible" in table else True
    best = table.loc[table.arm == "oracle", "mean_reward"].iloc[0]
    given_up = {"reward_given_up": (best - table.mean_reward) if lam_oracle is not None else math.nan}
    met = {"met": table.mean_cost <= table.tau, "window_met": table.worst_window_cost <= table.tau}
    if vector:  # the vector table's verdicts, each arm's over all constraints, then the reward given up
        met |= {f"{k}_all": v.groupby(table["arm"]).transform("all") for k, v in met.items()}
    table = table.assign(**(met | given_up if vector else given_up | met))
    trace = pd.concat([pd.DataFrame({"t": np.arange(length), "arm": n, **({} if cname is None else
                                                                          {"constraint": cname}),
                                     "lambda": lam_j, "cost": c, "reward": r,
                                     "mean_cost": np.cumsum(c) / np.arange(1, length + 1)})
                       for n, lam, cost, r in traces for _, cname, lam_j, c in _coords(names, lam, cost)],
                      ignore_index=True)
    return table, trace, info


def add_arguments(parser) -> None:
    add_settings_arguments(parser, DeploymentSettings)
    parser.add_argument("--candidates", required=True, help="the scenario's stream (lara make-stream)")
    parser.add_argument("--lambda-json", required=True, help="the calibration record (lambda*, LTT's lambda)")
    parser.add_argument("--online", nargs="*", default=[], help="the online arms (lara online outputs)")
    parser.add_argument("--shift", default=None, help="the scenario's shift check (lara shift-check), optional")
    parser.add_argument("--weighted", default=None, help="the scenario's weighted lambda.json, optional")
    parser.add_argument("--out", required=True, help="output CSV: one row per arm")
    parser.add_argument("--trace", required=True, help="output parquet: per visit and arm, lambda, cost, reward")
    parser.add_argument("--constraints", default=None,
                        help="vector mode (deployment.follows: constraints): the JSON list of calibration.constraints; "
                             "--lambda-json is the vector record, one row per arm and constraint, no weighted arm")


def run(args) -> None:
    from lara.deploy.online import budgets, constraints_of, read_inputs
    from lara.read.files import write_table

    s = read_settings(args, DeploymentSettings)
    constraints = constraints_of(args, s)  # None: the one cost and the scalar record
    if constraints is not None and args.weighted is not None:
        raise DataError(f"--weighted {args.weighted}: the covariate-shift weighted lambda is scalar only; the vector "
                        "mode (--constraints) has no weighted arm")
    names, tau = budgets(constraints, s)
    identity.distinct_files(args.online, "--online")
    stream, record = read_inputs(args, s, constraints)
    scenario = identity.read_identity(args.candidates).get("scenario")
    online = [online_arm(p, stream, s, args.lambda_json, args.candidates, names, tau) for p in args.online]
    arm_names = [name for name, _, _ in online]
    if len(set(arm_names)) != len(arm_names):
        raise DataError(f"--online: two runs with one step size ({', '.join(arm_names)})")
    check_made_on(args, identity.file_digest(args.candidates))
    weighted, certified = (None, None) if args.weighted is None else weighted_lambda(
        args.weighted, s, stream.reward.shape[1], scenario, record)
    table, trace, info = run_arms(stream, record, online, s, weighted, names, tau, args.lambda_json)
    if constraints is None:
        table["weighted_certified"] = certified
    vector = {} if constraints is None else {"constraints": names, "oracle": info}
    table.insert(0, "scenario", scenario)
    # what the report checks the arms of all scenarios against: one lambda record, one stream per scenario
    table["lambda_record"] = identity.file_digest(args.lambda_json)
    table["stream"] = identity.file_digest(args.candidates)
    made = identity.stamp("deployment_trace", args.trace, scenario=scenario, tau=tau, **vector,
                          made_from={"--candidates": args.candidates, "--lambda-json": args.lambda_json})
    write_table(trace, args.trace, {identity.KEY: made})
    write_table(table, args.out)
    for row in table.itertuples(index=False):
        log.info("%-18s %s mean cost %8.4f  worst %d-window %8.4f  reward %8.4f  lambda %.4g..%.4g  %s", row.arm,
                 "" if names is None else f"{row.constraint:<12} ", row.mean_cost, row.window, row.worst_window_cost,
                 row.mean_reward, row.lambda_min, row.lambda_max, "met" if row.met else "VIOLATED")
