"""Candidates as matrices: a scored table (prompt_id, sample_id, reward, cost) as (P, N) arrays, and a table of
samples with their prefix scores (``lara score-prefixes``) as the arrays pruned Best-of-N reads. Every score a finite
real number, every (prompt_id, sample_id) once, every prompt with the same number of candidates."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from lara.data.errors import DataError


def score_matrix(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(prompt ids, reward, cost, row index) as (P,), (P, N), (P, N), (P, N) arrays; every
    prompt must have the same number of candidates."""
    if df.empty:
        raise ValueError("the table has no rows: no candidates to choose from")
    df = df.sort_values(["prompt_id", "sample_id"], kind="stable")
    for col in ("reward", "cost"):
        bad = np.flatnonzero(~np.isfinite(df[col].to_numpy(float)))
        if len(bad):
            raise ValueError(f"column {col!r} holds a non-finite value ({df[col].iloc[bad[0]]}) for prompt "
                             f"{str(df['prompt_id'].iloc[bad[0]])!r}, sample {df['sample_id'].iloc[bad[0]]}"
                             + (f" and {len(bad) - 1} more rows" if len(bad) > 1 else ""))
    dup = df.duplicated(["prompt_id", "sample_id"], keep=False)
    if dup.any():
        first = df[dup].iloc[0]
        raise ValueError(f"{int(dup.sum())} rows repeat a (prompt_id, sample_id), e.g. ({str(first['prompt_id'])!r}, "
                         f"{first['sample_id']})")
    sizes = df.groupby("prompt_id", sort=False).size()
    if sizes.nunique() != 1:
        raise ValueError(f"prompts have different numbers of candidates ({sizes.min()}..{sizes.max()})")
    n = int(sizes.iloc[0])
    ids = sizes.index.to_numpy()
    shape = (len(ids), n)
    return (ids, df["reward"].to_numpy(float).reshape(shape), df["cost"].to_numpy(float).reshape(shape),
            df.index.to_numpy().reshape(shape))


def prefix_columns(checkpoints) -> list[tuple[int, str, str]]:
    """(checkpoint, reward column, cost column) of a prefix-scores table, one per checkpoint."""
    return [(int(t), f"prefix_reward_{int(t)}", f"prefix_cost_{int(t)}") for t in checkpoints]


def check_lengths(df, max_new_tokens: int, where: str) -> None:
    """Generated lengths a response can have: whole numbers in [1, max_new_tokens] (the checkpoints count them)."""
    n_tok = df["n_tokens"].to_numpy(float)
    bad = ~np.isfinite(n_tok) | (n_tok < 1) | (n_tok != np.round(n_tok)) | (n_tok > max_new_tokens)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"{where}: column 'n_tokens' holds {str(df['n_tokens'].iloc[i])} (row {i}, prompt "
                        f"{str(df['prompt_id'].iloc[i])!r}), not a whole number in [1, generation.max_new_tokens = "
                        f"{max_new_tokens}]")


def check_scores(df, columns, where: str) -> None:
    """Score columns of real numbers (not booleans, not text), every one finite and within range."""
    from lara.read.files import require_finite, require_in_range

    for col in columns:
        dtype = df[col].dtype
        if pd.api.types.is_bool_dtype(dtype) or not pd.api.types.is_numeric_dtype(dtype):
            raise DataError(f"{where}: column {col!r} holds {dtype} values, not scores (real numbers)")
    require_finite(df, columns, where)
    require_in_range(df, columns, where)


def read_prefix_scores(path, checkpoints, where: str, max_new_tokens: int | None = None):
    """(ids, (reward, cost, length, prefix reward, prefix cost), row index (P, K), the table) of a ``lara
    score-prefixes`` table scored at ``checkpoints`` (at least: the table may hold others), every score a finite
    real number, every length a whole number in [1, max_new_tokens]; arrays (P, K) and (P, K, J)."""
    from lara.read.files import read_table

    cols = prefix_columns(checkpoints)
    needed = ("prompt_id", "sample_id", "reward", "cost", "n_tokens", *[c for _, r, k in cols for c in (r, k)])
    df = read_table(path, required=needed)
    have = sorted(int(m.group(1)) for c in df.columns for m in [re.fullmatch(r"prefix_reward_(\d+)", str(c))] if m)
    missing = [t for t, _, _ in cols if t not in have]
    if missing:
        raise DataError(f"{where} {path}: prefix scores at {have} tokens, but the decoder stops candidates at "
                        f"{[t for t, _, _ in cols]} tokens ({missing} unscored): rescore the prefixes (lara "
                        "score-prefixes)")
    check_scores(df, [c for c in needed[2:] if c != "n_tokens"], f"{where} {path}")
    check_lengths(df, max_new_tokens or int(np.nanmax(df["n_tokens"].to_numpy(float)) or 1), f"{where} {path}")
    try:
        ids, reward, cost, index = score_matrix(df)
    except ValueError as exc:
        raise DataError(f"{where} {path}: {exc}") from None
    flat = index.ravel()
    length = df.loc[flat, "n_tokens"].to_numpy(np.int64).reshape(index.shape)
    pr, pc = (np.stack([df.loc[flat, c[i]].to_numpy(float).reshape(index.shape) for c in cols], axis=-1) if cols
              else np.empty((*index.shape, 0)) for i in (1, 2))
    return ids, (reward, cost, length, pr, pc), index, df
