"""``lara online``: Best-of-N on a stream of visits with a lambda that follows the traffic.

Each visit t offers N scored candidates; the decoder returns the argmax of r - lambda_t c (the decoder's own
order and tie rule, :func:`lara.calibrate.bestofn.select`) and, after every batch of B visits, updates

    lambda <- clip(lambda + eta * sum over the batch of (c_t - tau), 0, Lambda)

(c_t the cost of the returned response: Best-of-N has already computed it, so the update costs nothing).
Write l_b >= 0 for what the lower clip adds at batch b and u_b >= 0 for what the cap removes; summing the
update over any run of whole batches [s, e) gives the exact identity

    sum_{t in [s, e)} (c_t - tau) = (lambda_e - lambda_s - L + U) / eta,   L = sum l_b, U = sum u_b,

so the mean cost over any window of W visits (whole batches) is at most tau + (lambda_e - lambda_s + U) / (eta W)
<= tau + (max lambda - min lambda + U) / (eta W): the certificate, for any sequence of prompts, shifted or not.
It is informative while lambda stays bounded, which it does when a large lambda picks a response with cost
<= tau: then every visit pulls lambda down once it is large enough. When some prompts have no candidate that
safe, those visits push lambda up whatever it is; if the stream's mean of its safest candidates exceeds tau
(no fixed lambda meets tau on it, see the oracle in lara.deploy.arms) lambda grows without bound (or sits at
the cap, where U grows) and the certificate's slack grows with it: the certificate then says, correctly, that
tau is not held. Batching (B > 1) keeps the identity over whole batches but reacts B visits later, and a window
that cuts batches adds at most 2 (B - 1) max|c - tau| / W to the bound.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from lara import identity
from lara.data.errors import DataError
from lara.deploy.settings import DeploymentSettings
from lara.settings import ConfigError, add_settings_arguments, read_settings

log = logging.getLogger(__name__)

HELP = "Best-of-N on a stream with the online lambda update and its certificate (--constraints: one per constraint)"
OUTPUTS = ("out", "record")


@dataclass(frozen=True)
class Stream:
    """A stream as arrays: visit t's prompt id, its (N,) candidates' sample ids, rewards and costs."""

    prompt_id: np.ndarray
    sample_id: np.ndarray
    reward: np.ndarray
    cost: np.ndarray


def read_stream(path, constraints=None) -> Stream:
    """A candidates table (t, prompt_id, sample_id, reward, cost), checked: visits 0..T-1 in order, each with the
    same number N of distinct candidates of one prompt, finite numbers. With ``constraints`` (the vector mode) the
    costs are the columns cost_<name> of the constraints, in their order: ``cost`` is then (T, N, m)."""
    from lara.read.files import read_table, require_finite, require_in_range

    columns = ("cost",) if constraints is None else tuple(c.column for c in constraints)
    df = read_table(path, required=("t", "prompt_id", "sample_id", "reward", *columns))
    for col in ("t", "sample_id", "reward", *columns):
        if not pd.api.types.is_numeric_dtype(df[col]) or pd.api.types.is_bool_dtype(df[col]):
            raise DataError(f"{path}: column {col!r} must be numeric")
    require_finite(df, ("t", "reward", *columns), path)
    require_in_range(df, ("reward", *columns), path)
    t = df["t"].to_numpy()
    if np.any(t != np.floor(t)) or np.any(np.diff(t) < 0):
        raise DataError(f"{path}: column 't' must be whole visit numbers in stream order (non-decreasing)")
    t = t.astype(np.int64)
    counts = np.bincount(t - t.min()) if len(t) else np.array([], dtype=np.int64)
    if t.min() != 0 or (counts == 0).any():
        gap = int(np.flatnonzero(counts == 0)[0]) if (counts == 0).any() else None
        raise DataError(f"{path}: visits must be numbered 0, 1, ..., T-1; " +
                        (f"t = {gap} is missing" if gap is not None else f"the first is {t.min()}"))
    n = int(counts[0])
    if (counts != n).any():
        bad = int(np.flatnonzero(counts != n)[0])
        raise DataError(f"{path}: visit t = {bad} has {counts[bad]} candidates, visit 0 has {n}; every visit offers "
                        "the same N")
    if df.duplicated(["t", "sample_id"]).any():
        row = int(np.flatnonzero(df.duplicated(["t", "sample_id"]).to_numpy())[0])
        raise DataError(f"{path}: visit t = {t[row]} lists sample {df['sample_id'].iloc[row]} twice")
    pid = df["prompt_id"].to_numpy(object).reshape(-1, n)
    if (pid != pid[:, :1]).any():
        bad = int(np.flatnonzero((pid != pid[:, :1]).any(axis=1))[0])
        raise DataError(f"{path}: visit t = {bad} mixes candidates of two prompts")
    shape = (-1, n)
    if constraints is None:
        cost = df["cost"].to_numpy(float).reshape(shape)
    else:
        # a vector stream names the constraints its cost columns were scored for (lara make-stream --constraints):
        # a stream of other constraints is refused, even where its columns happen to share the names' form
        from lara.constraints.spec import losses

        found = identity.read_identity(path)
        made, names = found.get("constraints"), [c.name for c in constraints]
        if made is not None and list(made) != names:
            raise DataError(f"{path}: a stream of the constraints {list(made)}, not {names} (--constraints)")
        # each loss column as --constraints defines it (cost scorer, kind, threshold): a stream of a constraint's
        # other definition under the same name is another stream
        made, wanted = found.get("losses"), losses(constraints)
        if made != wanted:
            made = made if isinstance(made, list) else []
            at = next((i for i, w in enumerate(wanted) if i >= len(made) or made[i] != w), 0)
            raise DataError(f"{path}: the stream's loss of constraint {wanted[at]['name']} is "
                            f"{made[at] if at < len(made) else 'not stated'}, but "
                            f"--constraints defines it as {wanted[at]} (make the stream with these constraints)")
        cost = np.stack([df[col].to_numpy(float).reshape(shape) for col in columns], axis=2)
    return Stream(pid[:, 0], df["sample_id"].to_numpy(np.int64).reshape(shape),
                  df["reward"].to_numpy(float).reshape(shape), cost)


@dataclass(frozen=True)
class Trace:
    """What the online decoder did: per visit the lambda used and the candidate returned, and per batch
    boundary lambda_1 ... lambda_{B+1} with the lower (added) and upper (removed) clip amounts. With m
    constraints the lambdas, costs and clips have a last axis of m: (T, m), (B + 1, m), (B, m)."""

    lam: np.ndarray
    choice: np.ndarray
    cost: np.ndarray
    reward: np.ndarray
    boundaries: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    batch_size: int

    def coordinate(self, j: int) -> Trace:
        """Constraint j's part of a vector trace: a scalar trace whose lambda, costs and clips are the j-th
        coordinates. Its update is the scalar one, so the scalar identity, running certificate and window
        certificate hold for it as they stand (only the choices, shared by all constraints, differ from a scalar
        run)."""
        return Trace(self.lam[:, j], self.choice, self.cost[:, j], self.reward, self.boundaries[:, j],
                     self.lower[:, j], self.upper[:, j], self.batch_size)


def _pick(reward_row: np.ndarray, cost_row: np.ndarray, lam: float) -> int:
    """The decoder's choice for one visit: the argmax of r - lam c; a near-tie at the top goes through the
    decoder's full order (lower cost first), so the choice is exactly :func:`lara.calibrate.bestofn.select`'s."""
    from lara.calibrate.bestofn import TIE_RTOL, select

    score = reward_row - lam * cost_row
    j = int(score.argmax())
    top = score[j]
    if np.count_nonzero(score >= top - TIE_RTOL * max(1.0, abs(top))) > 1:
        return int(select(reward_row[None], cost_row[None], lam)[0])
    return j


def _pick_vector(reward_row: np.ndarray, cost_rows: np.ndarray, lam: np.ndarray) -> int:
    """One visit's choice with the vector lambda: :func:`lara.constraints.decode.select_vector`'s (the argmax of
    r - sum_j lambda_j c_j, near-ties through the decoder's full order), without building a batch."""
    from lara.calibrate.vector import combined

    if cost_rows.shape[1] == 1:  # select_vector's scalar case: the scalar decoder itself
        return _pick(reward_row, cost_rows[:, 0], float(lam[0]))
    return _pick(reward_row, combined(cost_rows[None], lam)[0], 1.0)


def _clip(moved, hi: float) -> tuple:
    """The scalar update's clip to [0, hi]: (lambda, what the lower clip added, what the cap removed)."""
    if moved < 0.0:
        return 0.0, -moved, 0.0
    if moved > hi:
        return hi, 0.0, moved - hi
    return moved, 0.0, 0.0


def _clip_vector(moved: np.ndarray, hi: float) -> tuple:
    """:func:`_clip` of every coordinate at once, in numpy (the vector run's arithmetic as it always was; the
    scalar run keeps its branches, so neither run's numbers moved when the two loops became one)."""
    return np.clip(moved, 0.0, hi), np.maximum(-moved, 0.0), np.maximum(moved - hi, 0.0)


def run_online(reward: np.ndarray, cost: np.ndarray, lam0, tau, eta: float, batch_size: int = 1,
               cap: float | None = None) -> Trace:
    """The online decoder on (T, N) candidates from lambda_1 = ``lam0`` (see the module docstring). With (T, N, m)
    costs and ``lam0``, ``tau`` of m numbers, one lambda per constraint: after every batch, lambda_j <-
    clip(lambda_j + eta sum_batch (c_j,t - tau_j), 0, cap) for each constraint j (one cap for all), the choice
    the vector decoder's (:func:`lara.constraints.decode.select_vector`)."""
    from lara.calibrate.bestofn import select
    from lara.constraints.decode import select_vector

    vector = cost.ndim == 3
    length, coords = len(reward), cost.shape[2:]  # coords: () for one cost, (m,) for m constraints
    n_batches = math.ceil(length / batch_size)
    lam_used = np.empty((length, *coords))
    choice = np.empty(length, dtype=np.int64)
    boundaries = np.empty((n_batches + 1, *coords))
    lower, upper = np.zeros((n_batches, *coords)), np.zeros((n_batches, *coords))
    hi = math.inf if cap is None else float(cap)
    if vector:
        lam, tau = np.minimum(np.asarray(lam0, dtype=float), hi), np.asarray(tau, dtype=float)
    else:
        lam = min(float(lam0), hi)
    pick, pick_batch, clip = (_pick_vector, select_vector, _clip_vector) if vector else (_pick, select, _clip)
    boundaries[0] = lam
    for b in range(n_batches):
        lo_t, hi_t = b * batch_size, min(length, (b + 1) * batch_size)
        if batch_size == 1:
            picked = pick(reward[lo_t], cost[lo_t], lam)
            excess = cost[lo_t, picked] - tau
            choice[lo_t] = picked
        else:
            picked = pick_batch(reward[lo_t:hi_t], cost[lo_t:hi_t], lam)
            # one cost: a 1-d sum, the very reduction the scalar run always did; m: one sum per constraint
            excess = (cost[np.arange(lo_t, hi_t), picked] - tau).sum(axis=0)
            choice[lo_t:hi_t] = picked
        lam_used[lo_t:hi_t] = lam
        lam, lower[b], upper[b] = clip(lam + eta * excess, hi)
        boundaries[b + 1] = lam
    rows = np.arange(length)
    return Trace(lam_used, choice, cost[rows, choice], reward[rows, choice], boundaries, lower, upper, batch_size)


def identity_residual(trace: Trace, tau: float, eta: float) -> float:
    """|sum (c_t - tau) - (lambda_{end} - lambda_1 - L + U) / eta|, relative to the sum's scale: zero but for
    rounding (a test holds it to that)."""
    lhs = float(np.sum(trace.cost - tau))
    rhs = (trace.boundaries[-1] - trace.boundaries[0] - trace.lower.sum() + trace.upper.sum()) / eta
    return abs(lhs - rhs) / max(1.0, float(np.sum(np.abs(trace.cost - tau))))


def running(trace: Trace, tau: float, eta: float) -> tuple[np.ndarray, np.ndarray]:
    """Per visit t: the running mean cost, and its certificate read off lambda: at the end of a batch
    tau + (lambda after it - lambda_1 + U so far) / (eta (t + 1)); inside a batch the pending update (eta times
    the batch's excess so far) is added to the lambda it started with. It bounds the running mean at every visit
    and exceeds it by exactly L / (eta (t + 1)), L the lower clips so far (the identity, to rounding)."""
    length = len(trace.cost)
    idx = np.arange(length)
    b = idx // trace.batch_size
    end = (idx % trace.batch_size == trace.batch_size - 1) | (idx == length - 1)
    total = np.cumsum(trace.cost - tau)
    start = b * trace.batch_size
    before = np.where(start > 0, total[np.maximum(start - 1, 0)], 0.0)
    upper = np.concatenate([[0.0], np.cumsum(trace.upper)])
    lam_after = np.where(end, trace.boundaries[b + 1], trace.boundaries[b] + eta * (total - before))
    clipped_up = np.where(end, upper[b + 1], upper[b])
    mean = np.cumsum(trace.cost) / (idx + 1)
    return mean, tau + (lam_after - trace.boundaries[0] + clipped_up) / (eta * (idx + 1))


def worst_window(cost: np.ndarray, window: int) -> float:
    """The largest mean cost over W consecutive visits (the whole stream's mean when it is shorter than W)."""
    if len(cost) <= window:
        return float(np.mean(cost))
    c = np.concatenate([[0.0], np.cumsum(cost)])
    return float(np.max(c[window:] - c[:-window]) / window)


def summarise(trace: Trace, tau: float, eta: float, window: int) -> dict:
    length = len(trace.cost)
    # the certificate, a bound on the mean cost of every window of W visits made of whole batches (lambda over the
    # batch boundaries): tau + (max lambda - min lambda + U) / (eta W)
    cert = float(tau + (trace.boundaries.max() - trace.boundaries.min() + trace.upper.sum()) / (eta * window))
    return {"visits": length, "mean_cost": float(trace.cost.mean()), "mean_reward": float(trace.reward.mean()),
            "lambda_start": float(trace.boundaries[0]), "lambda_end": float(trace.boundaries[-1]),
            "lambda_min": float(trace.boundaries.min()), "lambda_max": float(trace.boundaries.max()),
            "lower_clips": float(trace.lower.sum()), "upper_clips": float(trace.upper.sum()),
            "window": window, "worst_window_cost": worst_window(trace.cost, window), "certificate": cert,
            # the bound on the whole stream's mean: tau + (lambda_end - lambda_1 + U) / (eta T)
            "mean_certificate": float(tau + (trace.boundaries[-1] - trace.boundaries[0] + trace.upper.sum())
                                      / (eta * length)),
            "identity_residual": float(identity_residual(trace, tau, eta))}


def statement(summary: dict, *, n: int, eta: float, batch_size: int, cap: float | None, tau: float) -> str:
    """The online arm's guarantee, in one sentence, with its numbers."""
    capped = "no cap" if cap is None else f"cap {cap:g}"
    return (f"Best-of-{n} with the online lambda (eta = {eta:g}, {batch_size} visit(s) per update, {capped}, from "
            f"lambda = {summary['lambda_start']:.6g}) over {summary['visits']:,} visits: the mean cost is "
            f"{summary['mean_cost']:.4g} = tau + (lambda_end - lambda_start - lower clips + upper clips) / (eta T) "
            f"exactly, and every window of {summary['window']:,} visits (whole updates) has mean cost <= tau + "
            f"(max lambda - min lambda + upper clips) / (eta W) = {summary['certificate']:.4g} (tau = {tau:g}), "
            "for any sequence of prompts; the bound is informative while lambda stays bounded (lambda ranged "
            f"[{summary['lambda_min']:.4g}, {summary['lambda_max']:.4g}])")


# ---------------------------------------------------------------------------------------------------------------
# several constraints (calibration.constraints): one online lambda per constraint, one decoder for all of them


def summarise_vector(trace: Trace, names, tau, eta: float, window: int) -> dict:
    """The scalar summary of every constraint's coordinate (its own identity and certificate), and what the
    constraints share: the visits, the mean reward, whether every constraint's mean and window bound met its tau."""
    per = {name: summarise(trace.coordinate(j), float(tau[j]), eta, window) for j, name in enumerate(names)}
    return {"visits": len(trace.reward), "mean_reward": float(trace.reward.mean()), "window": window,
            "names": list(names), "tau": [float(t) for t in tau], "constraints": per,
            "certificate": [per[n]["certificate"] for n in names],
            "mean_cost": [per[n]["mean_cost"] for n in names],
            "identity_residual": max(per[n]["identity_residual"] for n in names)}


def statement_vector(summary: dict, *, n: int, eta: float, batch_size: int, cap: float | None) -> str:
    """The vector online arm's guarantee in one sentence: the scalar certificate, per constraint."""
    capped = "no cap" if cap is None else f"cap {cap:g} on each coordinate"
    parts = [f"{name}: mean {p['mean_cost']:.4g}, every window <= {p['certificate']:.4g} (tau {tau:g}; lambda "
             f"ranged [{p['lambda_min']:.4g}, {p['lambda_max']:.4g}])"
             for (name, p), tau in zip(summary["constraints"].items(), summary["tau"], strict=True)]
    return (f"Best-of-{n} with one online lambda per constraint (eta = {eta:g}, {batch_size} visit(s) per update, "
            f"{capped}) over {summary['visits']:,} visits: for each constraint j the mean cost is tau_j + "
            "(lambda_j,end - lambda_j,start - lower clips_j + upper clips_j) / (eta T) exactly, and every window of "
            f"{summary['window']:,} visits (whole updates) has mean cost_j <= tau_j + (max lambda_j - min lambda_j + "
            "upper clips_j) / (eta W), for any sequence of prompts; " + "; ".join(parts))


def constraints_of(args, s: DeploymentSettings):
    """The constraints of the vector mode (``--constraints``), None in the scalar mode; the flag and
    deployment.follows must agree (the rules hand both)."""
    from lara.constraints.spec import from_arg

    given = getattr(args, "constraints", None)
    if s.follows == "constraints" and not given:
        raise ConfigError("deployment.follows: constraints, but no --constraints was given (the JSON list of "
                          "calibration.constraints the vector lambda record was calibrated for)")
    if given and s.follows != "constraints":
        raise ConfigError(f"deployment.follows: {s.follows}, but --constraints was given: set deployment.follows: "
                          "constraints to follow the vector lambda")
    return from_arg(given) if given else None


def budgets(constraints, s: DeploymentSettings) -> tuple:
    """(names, tau): None and deployment.tau for the one cost, else the constraints' names and taus."""
    return (None, s.tau) if constraints is None else ([c.name for c in constraints],
                                                      [float(c.tau) for c in constraints])


def check_vector_record(path, constraints, s: DeploymentSettings, n: int) -> dict:
    """The vector record (lara calibrate-vector) for these constraints (names, taus, scorers), this N, with a
    lambda* inside the cap."""
    from lara.constraints.decode import read_vector

    record = read_vector(path, constraints)
    made_for = (record.get("decoder") or {}).get("n")
    if made_for is not None and int(made_for) != n:
        raise DataError(f"--lambda-json {path}: calibrated for Best-of-{made_for}, but the stream offers N = {n} "
                        "candidates per visit (decode.bon_n)")
    star = record.get("lambda_star")
    if not isinstance(star, list) or len(star) != len(constraints) or not all(
            isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in star):
        raise DataError(f"--lambda-json {path}: lambda_star {star!r} is not {len(constraints)} finite numbers >= 0 "
                        "(the calibration found none?)")
    if s.lambda_cap is not None and max(star) > s.lambda_cap:
        raise ConfigError(f"deployment.lambda_cap: {s.lambda_cap:g} is below lambda* = {star} of {path}, where the "
                          "online lambdas start; raise the cap (or leave it null)")
    if record.get("feasible") is False:
        log.warning("%s found no feasible lambda: its lambda* is only the online lambdas' start", path)
    return record


def add_arguments(parser) -> None:
    add_settings_arguments(parser, DeploymentSettings)
    parser.add_argument("--candidates", required=True,
                        help="the stream: t (visit, 0..T-1), prompt_id, sample_id, reward, cost; N rows per visit")
    parser.add_argument("--lambda-json", required=True, help="the calibration record; its lambda_star is lambda_1")
    parser.add_argument("--out", required=True, help="output parquet: one row per visit")
    parser.add_argument("--record", required=True, help="output JSON: the summary, the certificate and its statement")
    parser.add_argument("--constraints", default=None,
                        help="vector mode (deployment.follows: constraints): the JSON list of calibration.constraints; "
                             "--lambda-json is then the vector record and the stream has a cost_<name> per constraint")


def check_stream_settings(s: DeploymentSettings, path, visits: int, n: int) -> None:
    """The settings that describe the stream are the stream's own (its identity states T and N): a report for
    another T or N than the stream has would be about another stream."""
    made = identity.read_identity(path)
    for key, want, got in (("deployment.stream_length", s.stream_length, made.get("visits", visits)),
                           ("decode.bon_n", s.bon_n, made.get("n", n))):
        if got != want:
            raise ConfigError(f"{key}: {want}, but --candidates {path} is a stream of {got} "
                              f"({'visits' if 'stream' in key else 'candidates per visit'}); settings and stream agree")
    for key in ("window", "batch_size"):  # what an imported stream states of itself (lara import-table --state)
        if key in made and made[key] != getattr(s, key):
            raise ConfigError(f"deployment.{key}: {getattr(s, key)}, but --candidates {path} states {key} "
                              f"{made[key]}; settings and stream agree")
    # a statement over windows of W visits needs a stream of at least W visits: a shorter one has no such window,
    # and a "certificate" for it would be about something that does not exist
    if s.window > visits:
        raise ConfigError(f"deployment.window: {s.window} visits, but --candidates {path} has {visits:,}: no window "
                          f"of {s.window} visits exists to state a certificate for (a window of at most the stream's "
                          "length, or a longer stream)")


def check_record(record, s: DeploymentSettings, n: int, path) -> None:
    """The start must be a lambda calibrated for this tau and this N (lara.calibrate.record.check_budget), and
    inside the cap (a cap below lambda* would silently start the online lambda elsewhere than the record says)."""
    from lara.calibrate.record import check_budget

    check_budget(record, s.tau, n)
    if s.lambda_cap is not None and record.lambda_star > s.lambda_cap:
        raise ConfigError(f"deployment.lambda_cap: {s.lambda_cap:g} is below lambda* = {record.lambda_star:.6g} of "
                          f"{path}, where the online lambda starts; raise the cap (or leave it null)")


def per_visit(stream: Stream, trace: Trace, names, tau, eta: float) -> pd.DataFrame:
    """The output table, one row per visit: the lambda used, the returned candidate's cost and reward, the running
    mean cost and its certificate (:func:`running`); with constraints ``names``, each one's as lambda_<name>,
    cost_<name>, mean_cost_<name> and certificate_<name>."""
    rows = np.arange(len(trace.reward))
    out = pd.DataFrame({"t": rows, "prompt_id": stream.prompt_id, "sample_id": stream.sample_id[rows, trace.choice],
                        "reward": trace.reward})
    for j, name in enumerate(names or [None]):
        part, sfx = (trace, "") if names is None else (trace.coordinate(j), f"_{name}")
        mean, bound = running(part, tau if names is None else tau[j], eta)
        out[f"lambda{sfx}"], out[f"cost{sfx}"], out[f"mean_cost{sfx}"], out[f"certificate{sfx}"] = (
            part.lam, part.cost, mean, bound)
    if names is None:  # the one cost's table keeps its columns' order: lambda first
        out.insert(2, "lambda", out.pop("lambda"))
    return out


def read_inputs(args, s: DeploymentSettings, constraints) -> tuple[Stream, object]:
    """--candidates and --lambda-json, checked (``lara online`` and ``lara deploy-arms``): the stream, which the
    settings describe, and the record lambda* is read from: one cost, lara.calibrate.record's, for this tau and N
    (:func:`check_record`); with constraints the vector record's dict (:func:`check_vector_record`). Argmax
    Best-of-N is decoded at the record's lambda (deploy-arms' fixed arms, and the online lambda from its first
    visit on), so the record must be of that very decoder (select-bon's check)."""
    from lara.calibrate.record import read_lambda

    stream = read_stream(args.candidates, constraints)
    record = read_lambda(args.lambda_json) if constraints is None else None
    visits, n = stream.reward.shape
    check_stream_settings(s, args.candidates, visits, n)
    if constraints is not None:
        return stream, check_vector_record(args.lambda_json, constraints, s, n)
    from lara.decode.bon import check_calibrated_for

    check_calibrated_for(n, "star", args.lambda_json, weighted=True)  # its scenario and stream: checked below
    check_record(record, s, n, args.lambda_json)
    # a weighted lambda is calibrated for one scenario's stream (its shift check's weights): never another's
    made, ran = record.get("identity") or {}, identity.read_identity(args.candidates)
    if made.get("kind") == "lambda_weighted" and (made.get("scenario"), made.get("stream")) != (
            ran.get("scenario"), identity.file_digest(args.candidates)):
        raise DataError(f"--lambda-json {args.lambda_json}: weighted for scenario {made.get('scenario')!r} (stream "
                        f"{made.get('stream')}), but --candidates {args.candidates} is the stream of scenario "
                        f"{ran.get('scenario')!r}; another scenario's weighted lambda")
    return stream, record


def run(args) -> None:
    from lara.io import write_json
    from lara.provenance import code_version
    from lara.read.files import write_table

    s = read_settings(args, DeploymentSettings)
    constraints = constraints_of(args, s)  # None: the one cost and the scalar record
    stream, record = read_inputs(args, s, constraints)
    visits, n = stream.reward.shape
    names, tau = budgets(constraints, s)
    start = record.lambda_star if constraints is None else [float(x) for x in record["lambda_star"]]
    log.info("online Best-of-%d on %d visits%s from lambda* = %s (eta %g, batch %d)", n, visits,
             f", {len(names)} constraints {names}" if names else "", start if names else f"{start:.6g}",
             s.step_size, s.batch_size)
    t0 = time.perf_counter()
    trace = run_online(stream.reward, stream.cost, start, tau, s.step_size, s.batch_size, s.lambda_cap)
    seconds = time.perf_counter() - t0
    out = per_visit(stream, trace, names, tau, s.step_size)
    summary = summarise(trace, tau, s.step_size, s.window) if names is None else summarise_vector(
        trace, names, tau, s.step_size, s.window)
    told = {"n": n, "eta": s.step_size, "batch_size": s.batch_size, "cap": s.lambda_cap}
    text = statement(summary, **told, tau=tau) if names is None else statement_vector(summary, **told)
    made = identity.stamp("online", args.out, **identity.inherit(identity.read_identity(args.candidates), "scenario",
                                                                 "role"),
                          method="bon", setting="online", n=n, **({} if names is None else {"constraints": names}),
                          tau=tau, step_size=s.step_size, batch_size=s.batch_size, window=s.window,
                          lambda_cap=s.lambda_cap, lambda_start=start,
                          lambda_record=identity.file_digest(args.lambda_json),
                          made_from={"--candidates": args.candidates, "--lambda-json": args.lambda_json})
    write_table(out, args.out, {"settings": asdict(s), "code": code_version(), "summary": summary, identity.KEY: made})
    # the vector summary states its taus itself: "tau" keeps its place there
    write_json(args.record, {identity.KEY: made | {"kind": "online_record"}, **summary, "tau": tau,
                             "step_size": s.step_size, "batch_size": s.batch_size, "lambda_cap": s.lambda_cap,
                             "statement": text, "seconds": seconds, "settings": asdict(s), "code": code_version()})
    log.info("%s", text)
    log.info("%d visits in %.2f s (%.1f us per visit); identity residual %.2e", visits, seconds,
             1e6 * seconds / max(1, visits), summary["identity_residual"])
