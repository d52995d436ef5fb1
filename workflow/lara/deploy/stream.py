"""``lara make-stream``: one shift scenario's stream of visits, built from the scored deployment pool.

A scenario is a schedule over the pool's strata: at visit t (u = t / (T - 1) along the stream) the prompt is
from the ``held_out`` stratum with probability held_out_share(u), else harmful with probability
harmful_share(u), else benign; each share is a number or a [start, end] pair (a linear ramp: a drifting
stream); harmful_share null is the pool's own harmful share among its benign and harmful prompts (the control
draws the pool as the calibration prompts were drawn). The prompt is uniform within its stratum and the
visit's Best-of-N candidates are a uniformly random N-subset of that prompt's K scored samples, so a stream
of any length needs no new sampling: the stream is a table of T x N rows (t, prompt_id, sample_id, reward,
cost, and the prompt's text and stratum).
"""

from __future__ import annotations

import json
import logging
import zlib
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from lara.data.errors import DataError
from lara.deploy.settings import DeploymentSettings
from lara.settings import ConfigError, add_settings_arguments, read_settings

log = logging.getLogger(__name__)

HELP = "one shift scenario's stream of T visits (prompt drawn by the schedule, N of its K scored candidates)"
OUTPUTS = ("out",)


@dataclass(frozen=True)
class Schedule:
    """A scenario's shares, each (start, end) along the stream; harmful None: the pool's own share."""

    name: str
    harmful_share: tuple[float, float] | None
    held_out_share: tuple[float, float]

    @classmethod
    def from_mapping(cls, name: str, spec) -> Schedule:
        where = f"deployment.scenarios.{name}"
        if not name or name != name.strip():
            raise ConfigError(f"deployment.scenarios: scenario name {name!r}; a scenario is named (its folder, its "
                              "rows in the report)")
        if not isinstance(spec, dict):
            raise ConfigError(f"{where}: expected a mapping of harmful_share / held_out_share, got {spec!r}")
        unknown = sorted(set(spec) - {"harmful_share", "held_out_share"})
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (harmful_share, held_out_share)")
        harmful = spec.get("harmful_share")
        return cls(name, None if harmful is None else _share(harmful, f"{where}.harmful_share"),
                   _share(spec.get("held_out_share", 0.0), f"{where}.held_out_share"))

    def shares(self, u: np.ndarray, pool_harmful: float) -> tuple[np.ndarray, np.ndarray]:
        """(harmful share, held-out share) at the stream positions u in [0, 1]."""
        h = (pool_harmful, pool_harmful) if self.harmful_share is None else self.harmful_share
        return h[0] + (h[1] - h[0]) * u, self.held_out_share[0] + (self.held_out_share[1] - self.held_out_share[0]) * u


def _share(value, key: str) -> tuple[float, float]:
    values = value if isinstance(value, list) else [value]
    if not 1 <= len(values) <= 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"{key}: expected a number or [start, end], got {value!r}")
    if not all(0.0 <= v <= 1.0 for v in values):
        raise ConfigError(f"{key}: {value!r} is not a share in [0, 1]")
    return float(values[0]), float(values[-1])


@dataclass(frozen=True)
class Pool:
    """The scored pool as arrays: per prompt its id, text, stratum and (P, K) reward, cost, sample ids, mask."""

    prompt_id: np.ndarray
    prompt: np.ndarray
    stratum: np.ndarray
    reward: np.ndarray
    cost: np.ndarray
    sample_id: np.ndarray
    mask: np.ndarray
    cost_columns: tuple[str, ...] = ("cost",)  # one cost: (P, K) costs; several (cost_<name>): (P, K, m)


def read_pool(pool_path, scores_path, n: int, constraints=None, k: int | None = None) -> Pool:
    """The pool's prompts with their scored candidates; every prompt needs at least ``n`` of them, and exactly
    ``k`` (deployment.samples_per_prompt: lara sample draws that many per prompt) when given. With
    ``constraints`` the scores are lara score-constraints' (a cost_<name> column per constraint, scored for
    exactly these constraints) and the pool's costs are (P, K, m), each constraint's loss
    (:meth:`lara.constraints.spec.Constraint.loss`)."""
    from lara.calibrate.calibrate import load_scores
    from lara.constraints.calibrate import load_vector_scores
    from lara.read.files import read_table

    pool = read_table(pool_path, required=("prompt_id", "prompt", "stratum"))
    columns = ("cost",) if constraints is None else tuple(c.column for c in constraints)
    scores = read_table(scores_path, required=("prompt_id", "sample_id", "reward", *columns))
    if constraints is None:
        load_scores(scores_path)  # numeric, finite, in range, each (prompt, sample) once, each prompt once by text
    else:
        load_vector_scores(scores_path, constraints, "--scores")  # the same checks, and these constraints' scores
    missing = ~pool["prompt_id"].isin(set(scores["prompt_id"]))
    if missing.any():
        raise DataError(f"{scores_path}: no candidates for {int(missing.sum())} prompt(s) of {pool_path}, e.g. "
                        f"{pool['prompt_id'][missing].iloc[0]!r}")
    extra = ~scores["prompt_id"].isin(set(pool["prompt_id"]))
    if extra.any():
        raise DataError(f"{scores_path}: prompt {scores['prompt_id'][extra].iloc[0]!r} is not in {pool_path} (the "
                        "scores of another pool?)")
    order = {p: i for i, p in enumerate(pool["prompt_id"])}
    scores = scores.assign(_p=scores["prompt_id"].map(order)).sort_values(["_p", "sample_id"], kind="stable")
    counts = scores.groupby("_p").size().reindex(range(len(pool)), fill_value=0).to_numpy()
    if counts.min() < n:
        i = int(counts.argmin())
        raise DataError(f"{scores_path}: prompt {pool['prompt_id'].iloc[i]!r} has {counts[i]} candidates; every "
                        f"visit draws N = {n} (deployment.samples_per_prompt >= decode.bon_n)")
    if k is not None and (counts != k).any():
        i = int(np.flatnonzero(counts != k)[0])
        raise DataError(f"--scores {scores_path}: prompt {pool['prompt_id'].iloc[i]!r} has {counts[i]} candidates, "
                        f"but deployment.samples_per_prompt is {k} (K, sampled per deployment prompt): the stream "
                        "would draw from other candidates than the settings state; settings and scores agree")
    k = int(counts.max())
    col = np.concatenate([np.arange(c) for c in counts])
    row = scores["_p"].to_numpy()
    out = {name: np.zeros((len(pool), k, *m), dtype=dtype) for name, dtype, m in
           (("reward", float, ()), ("cost", float, () if constraints is None else (len(columns),)),
            ("sample_id", np.int64, ()), ("mask", bool, ()))}
    out["reward"][row, col] = scores["reward"].to_numpy(float)
    # with constraints each one's loss (a probability constraint's 1[c > threshold]): what the vector lambda was
    # calibrated on, so the stream, the online lambda and every arm see what the calibration saw
    out["cost"][row, col] = scores["cost"].to_numpy(float) if constraints is None else np.stack(
        [c.loss(scores[c.column]) for c in constraints], axis=1)
    out["sample_id"][row, col] = scores["sample_id"].to_numpy(np.int64)
    out["mask"][row, col] = True
    return Pool(pool["prompt_id"].to_numpy(object), pool["prompt"].to_numpy(object), pool["stratum"].to_numpy(object),
                **out, cost_columns=columns)


def draw(pool: Pool, schedule: Schedule, length: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(T,) pool row of each visit and (T, N) column of its candidates, by the schedule."""
    rng = np.random.default_rng([seed, 40, zlib.crc32(schedule.name.encode())])  # each scenario's own, stable
    rows = {s: np.flatnonzero(pool.stratum == s) for s in ("benign", "harmful", "held_out")}
    in_dist = len(rows["benign"]) + len(rows["harmful"])
    u = np.arange(length) / max(1, length - 1)
    harmful, held = schedule.shares(u, len(rows["harmful"]) / in_dist)
    first, second = rng.random(length), rng.random(length)
    stratum = np.where(first < held, "held_out", np.where(second < harmful, "harmful", "benign"))
    visit_row = np.empty(length, dtype=np.int64)
    for name, members in rows.items():
        at = np.flatnonzero(stratum == name)
        if len(at) and not len(members):
            raise DataError(f"deployment.scenarios.{schedule.name}: the schedule draws {name} prompts but the pool has "
                            "none")
        visit_row[at] = members[rng.integers(len(members), size=len(at))] if len(at) else visit_row[at]
    keys = rng.random((length, pool.mask.shape[1]))
    keys[~pool.mask[visit_row]] = np.inf
    columns = np.sort(np.argpartition(keys, n - 1, axis=1)[:, :n], axis=1)
    return visit_row, columns


def stream_table(pool: Pool, visit_row: np.ndarray, columns: np.ndarray) -> pd.DataFrame:
    length, n = columns.shape
    rows = np.repeat(visit_row, n)
    cols = columns.ravel()
    return pd.DataFrame({"t": np.repeat(np.arange(length, dtype=np.int64), n), "prompt_id": pool.prompt_id[rows],
                         "prompt": pool.prompt[rows], "stratum": pool.stratum[rows],
                         "sample_id": pool.sample_id[rows, cols], "reward": pool.reward[rows, cols],
                         **({"cost": pool.cost[rows, cols]} if pool.cost.ndim == 2 else
                            {name: pool.cost[rows, cols, j] for j, name in enumerate(pool.cost_columns)})})


def add_arguments(parser) -> None:
    add_settings_arguments(parser, DeploymentSettings)
    parser.add_argument("--pool", required=True, help="the deployment prompt pool (lara deployment-pool)")
    parser.add_argument("--scores", required=True, help="the pool's scored candidates (lara sample + lara score)")
    parser.add_argument("--scenario", required=True, help="the scenario's name")
    parser.add_argument("--schedule", required=True,
                        help='the scenario (JSON): {"harmful_share": x or [start, end] or null, "held_out_share": ...}')
    parser.add_argument("--out", required=True, help="output parquet: the stream, N rows per visit")
    parser.add_argument("--constraints", default=None,
                        help="vector mode (deployment.follows: constraints): the JSON list of calibration.constraints; "
                             "--scores is then lara score-constraints' output and the stream has a cost_<name> each")


def run(args) -> None:
    from lara import identity
    from lara.constraints.spec import losses
    from lara.deploy.online import budgets, constraints_of
    from lara.provenance import code_version
    from lara.read.files import write_table
    from lara.settings import strict_json

    s = read_settings(args, DeploymentSettings)
    constraints = constraints_of(args, s)
    schedule = Schedule.from_mapping(args.scenario, strict_json(args.schedule, "--schedule"))
    pool = read_pool(args.pool, args.scores, s.bon_n, constraints, s.samples_per_prompt)
    visit_row, columns = draw(pool, schedule, s.stream_length, s.bon_n, s.seed)
    stream = stream_table(pool, visit_row, columns)
    shares = {k: int(v) for k, v in pd.Series(pool.stratum[visit_row]).value_counts().items()}
    names, tau = budgets(constraints, s)
    vector = {} if constraints is None else {"constraints": names, "tau": tau, "losses": losses(constraints)}
    made = identity.stamp("stream", args.out, role="deployment", scenario=args.scenario,
                          **identity.inherit(identity.read_identity(args.scores), "reward_scorer", "cost_scorer",
                                             *(() if constraints is None else ("cost_scorers",))), **vector,
                          schedule=json.loads(args.schedule), visits=s.stream_length, n=s.bon_n,
                          k=int(pool.mask.sum(axis=1).min()), strata=shares,
                          made_from={"--pool": args.pool, "--scores": args.scores})
    write_table(stream, args.out, {"settings": asdict(s), "code": code_version(), identity.KEY: made})
    log.info("%s: %d visits of Best-of-%d (%s) from %d prompts", args.scenario, s.stream_length, s.bon_n,
             ", ".join(f"{k} {v}" for k, v in sorted(shares.items())), len(np.unique(visit_row)))
