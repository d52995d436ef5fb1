"""What the two figures of several constraints (kinds ``constraints`` and ``constraints_sweep``) share: the
feasibility test, the points along the ray, the search's range, the vector record's checks and a vector's text."""

from __future__ import annotations

import numpy as np

RAY_POINTS = 401  # points of s along the ray (any other number of constraints), plus every procedure's own s


def meets(cost, tau) -> np.ndarray:
    """Whether mean cost vectors (..., m) meet every tau, with the calibration's rounding slack
    (:func:`lara.calibrate.vector.first_feasible`)."""
    tau = np.asarray(tau, dtype=float)
    return np.all(np.asarray(cost, dtype=float) <= tau + 1e-12 * np.maximum(1.0, np.abs(tau)), axis=-1)


def search_max(record: dict, lams) -> float:
    """The upper end of the calibration's search for lambda: calibration.lambda_search_max as the record's settings
    name it, else the largest of 1 and every component of ``lams``."""
    return float((record.get("settings") or {}).get("lambda_search_max") or max([1.0, *(max(v) for v in lams)]))


def vec(v) -> str:
    """A vector as text, ``(0.1, 2.5)``."""
    return "(" + ", ".join(f"{x:.3g}" for x in np.atleast_1d(v)) + ")"


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
