"""What the two figures of several constraints (kinds ``constraints`` and ``constraints_sweep``) share: what each
draws of the vector record (:class:`RayView`), the points along the ray, the search's range, the vector record and
the scores drawn with it, read and checked, and a vector's text."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RAY_POINTS = 401  # points of s along the ray (any other number of constraints), plus every procedure's own s


@dataclass(frozen=True)
class RayView:
    """What both figures draw of the vector record: its constraints (names, taus), Best-of-n, the prompts drawn on,
    the direction searched and the deployed procedure."""

    names: list[str]
    tau: np.ndarray
    n: int
    n_prompts: int
    direction: np.ndarray
    deployed: str | None

    @staticmethod
    def fields(record: dict, n_prompts: int) -> dict:
        """The fields of a vector record drawn on ``n_prompts`` prompts."""
        return {"names": list(record["names"]), "tau": np.asarray(record["tau"], dtype=float),
                "n": int(record["decoder"]["n"]), "n_prompts": n_prompts,
                "direction": np.asarray(record["direction"], dtype=float),
                "deployed": (record.get("guarantee") or {}).get("procedure")}

    def shows(self) -> dict:
        """What both figures show of the record, for the provenance sidecar."""
        return {"constraints": [{"name": n, "tau": float(t)} for n, t in zip(self.names, self.tau, strict=True)],
                "n": self.n, "direction": r4(self.direction), "deployed": self.deployed}


def on_ray(lam: np.ndarray, s: float, d: np.ndarray) -> bool:
    """Whether lambda is s d (to rounding)."""
    return bool(np.linalg.norm(lam - s * d) <= 1e-9 * max(1.0, float(np.abs(lam).max())))


def search_max(record: dict, lams) -> float:
    """The upper end of the calibration's search for lambda: calibration.lambda_search_max as the record's settings
    name it, else the largest of 1 and every component of ``lams``."""
    return float((record.get("settings") or {}).get("lambda_search_max") or max([1.0, *(max(v) for v in lams)]))


def plot_end(cap: float, found: list[float]) -> float:
    """The plotted range: twice the largest of ``found`` (at least 0.05), at most ``cap``; ``cap`` when none."""
    return min(cap, max(0.05, 2.0 * max(found))) if found else cap


def vec(v) -> str:
    """A vector as text, ``(0.1, 2.5)``."""
    return "(" + ", ".join(f"{x:.3g}" for x in np.atleast_1d(v)) + ")"


def r4(v) -> list[float]:
    """A vector's numbers to 4 decimals, for what a figure shows."""
    return [round(float(x), 4) for x in np.atleast_1d(v)]


def check_vectors(record: dict, m: int, lambda_json: str) -> None:
    """The record's direction and every procedure's lambda are m finite numbers >= 0, the direction not zero."""
    from lara.read.files import DataError

    direction = record.get("direction")
    vectors = {"direction": direction} | {f"procedures.{k}.lambda": p.get("lambda")
                                          for k, p in (record.get("procedures") or {}).items()
                                          if p.get("lambda") is not None}
    for key, v in vectors.items():
        ok = isinstance(v, list) and len(v) == m and all(isinstance(x, int | float) and np.isfinite(x) and x >= 0
                                                         for x in v)
        if not ok:
            raise DataError(f"--lambda-json {lambda_json}: {key} {v!r} is not {m} finite numbers >= 0")
    if max(direction) <= 0:
        raise DataError(f"--lambda-json {lambda_json}: direction {direction} is zero")


def read_vector_inputs(lambda_json: str, scores_path: str, constraints_json: str, held_out: bool = False):
    """The vector record (``lara calibrate-vector``) for ``--constraints``, every procedure's lambda m finite numbers
    >= 0 (:func:`check_vectors`), and the scores to draw it on. The constraints figure: the calibration scores it was
    calibrated on (its identity's digest of them), with at least its N samples per prompt. ``held_out`` (the
    constraints_sweep figure): the held-out test prompts' scored Best-of-N candidates (``lara score-constraints`` on
    the bon pool, what ``lara decode-vector --method bon`` decodes from), checked where the identities allow: the
    candidates are the test pool (role test; not the file the record was calibrated on), none of their prompts is a
    calibration prompt of the record, and every prompt has exactly the record's N candidates."""
    from lara import identity
    from lara.constraints.calibrate import load_vector_scores
    from lara.constraints.decode import read_vector
    from lara.constraints.spec import from_arg
    from lara.read.files import DataError

    cons = from_arg(constraints_json)
    record = read_vector(lambda_json, cons)
    made = record.get("identity") or {}
    calibrated_on = (made.get("made_from") or {}).get("--scores")
    if held_out:
        identity.expect_role(scores_path, "--scores", "test", "the figure draws the decoder on the held-out test "
                             "prompts' candidates, constraints/bon_scores.parquet")
        if calibrated_on == identity.file_digest(scores_path):
            raise DataError(f"--scores {scores_path}: the scores --lambda-json {lambda_json} was calibrated on, not "
                            "the held-out test prompts' candidates")
    else:
        got = identity.file_digest(scores_path)
        if calibrated_on is not None and calibrated_on != got:
            raise DataError(f"--scores {scores_path}: not the scores --lambda-json {lambda_json} was calibrated on "
                            f"(digest {got}, the record's {calibrated_on})")
    scores = load_vector_scores(scores_path, cons)
    counts = scores.mask.sum(axis=1)
    n = (record.get("decoder") or {}).get("n")
    if held_out:
        if counts.min() != counts.max() or not isinstance(n, int) or int(counts[0]) != n:
            raise DataError(f"--scores {scores_path}: prompts have {counts.min()}..{counts.max()} candidates, but "
                            f"--lambda-json {lambda_json} was calibrated for Best-of-{n!r} (the decoder picks from "
                            "exactly N candidates per prompt)")
        overlap = identity.disjoint(made.get("prompts"), scores.prompts, f"--scores {scores_path}")
        if overlap:
            raise DataError(f"--scores {scores_path}: {overlap} of its prompts are calibration prompts of "
                            f"--lambda-json {lambda_json}: the figure would be in-sample")
    elif not isinstance(n, int) or not 1 <= n <= int(counts.min()):
        raise DataError(f"--lambda-json {lambda_json}: decoder n {n!r}, but --scores {scores_path} has K = "
                        f"{int(counts.min())} samples per prompt (Best-of-N needs 1 <= N <= K)")
    check_vectors(record, len(cons), lambda_json)
    return record, scores
