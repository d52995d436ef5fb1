"""``lambda.json``: the calibration's record, with its one writer (``lara calibrate``) and its one
reader (every later step), and the named lambda settings that decoders are run at.

The record holds lambda-hat, the deployed lambda* (a bootstrap quantile), the decoder they
were calibrated for (``best_of_n`` with N, or ``gibbs_tilt`` with beta), that decoder's
calibration-set expected cost at both, the bootstrap summary and the diagnostic curves. No other
module parses the file: they call :func:`read_lambda` and use :class:`LambdaRecord`.

A covariate-shift weighted record (``lara calibrate --weights``: keys ``weights`` and ``certified``, identity
kind ``lambda_weighted``) whose weights' effective sample size is below deployment.shift.min_ess holds
``certified: false``: :func:`read_lambda` refuses it, naming the ESS and min_ess, so no decoder deploys it;
a report that shows its estimates reads it with ``allow_uncertified=True``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from lara.config import nonfinite
from lara.settings import CERTIFIED

# the keys every consumer relies on (the writer puts them there; the reader checks they are)
REQUIRED = ("lambda_hat", "lambda_star", "tau", "mode", "decoder", "feasible", "status", "bootstrap")
# hat, star and the certified crc and ltt read lambda.json; direct a direct_<method>.json
NAMED = ("zero", "hat", "star", "max", "direct", *CERTIFIED)


@dataclass(frozen=True)
class LambdaRecord:
    """A read ``lambda.json``: the typed fields, plus every key as written (``data``) for diagnostics."""

    path: str
    lambda_hat: float
    lambda_star: float
    tau: float
    mode: str
    decoder: dict
    feasible: bool
    status: str
    data: dict = field(repr=False)

    @property
    def decoder_n(self) -> int | None:
        """The Best-of-N size calibrated for (None in soft mode or with ragged K)."""
        n = self.decoder.get("n") if self.decoder.get("kind") == "best_of_n" else None
        return int(n) if n else None

    @property
    def bootstrap(self) -> dict:
        return self.data["bootstrap"]

    @property
    def weighted(self) -> bool:
        """A covariate-shift weighted calibration (``lara calibrate --weights``)."""
        return self.data.get("weights") is not None

    @property
    def certified(self) -> bool:
        """Deployable: an unweighted record, or a weighted one whose weights' ESS reached min_ess."""
        return not self.weighted or self.data.get("certified") is True

    def get(self, key: str, default=None):
        return self.data.get(key, default)

    def procedure_lambda(self, procedure: str) -> float:
        """The lambda a calibration procedure chose (bootstrap, crc, ltt), as recorded beside lambda*."""
        from lara.read.files import DataError

        entry = (self.data.get("procedures") or {}).get(procedure)
        if not isinstance(entry, dict) or not isinstance(entry.get("lambda"), (int, float)):
            raise DataError(f"{self.path}: no {procedure} lambda (procedures.{procedure}); the certified lambdas are "
                            "computed when calibration.cost_bounds is set, in bon mode")
        if entry.get("feasible") is False:
            raise DataError(f"{self.path}: the {procedure} procedure certified no lambda (procedures.{procedure}."
                            f"feasible: false; {entry['lambda']:g} is where its search ended): an output decoded "
                            f"there is not {procedure!r}; recalibrate (more prompts, tighter bounds, a larger tau)")
        return float(entry["lambda"])


def read_lambda(path: str | Path, allow_uncertified: bool = False) -> LambdaRecord:
    """Read and check a ``lambda.json``; a missing file, bad JSON or a missing key names the file and key. A
    weighted record that is not certified is refused unless ``allow_uncertified`` (a report, never a decoder)."""
    from lara.read.files import DataError, UnreadableJSON, json_file

    if not Path(path).is_file():
        raise DataError(f"{path}: no such lambda.json")
    try:
        data = json_file(Path(path), mapping=False)  # NaN, a key twice, an edited record: refused there, named
    except UnreadableJSON as exc:
        raise DataError(f"{path}: not a readable lambda.json ({exc})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: a lambda.json holds a JSON object")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise DataError(f"{path}: missing key(s) {', '.join(missing)} (written by `lara calibrate`)")
    try:
        lam_hat, lam_star, tau = (_number(data[k]) for k in ("lambda_hat", "lambda_star", "tau"))
    except (TypeError, ValueError):
        raise DataError(f"{path}: lambda_hat, lambda_star and tau must be numbers") from None
    bad = nonfinite(data)
    if bad:
        raise DataError(f"{path}: {', '.join(bad)}: not a finite number (NaN or infinite); rerun `lara calibrate`")
    if not (lam_hat >= 0 and lam_star >= 0):
        raise DataError(f"{path}: lambda_hat and lambda_star must be >= 0, got {lam_hat} and {lam_star}")
    if not isinstance(data["decoder"], dict):
        raise DataError(f"{path}: decoder must be an object (kind, n or beta)")
    _check_values(data, path)
    if data.get("weights") is not None and data.get("certified") is not True and not allow_uncertified:
        w = data["weights"] if isinstance(data["weights"], dict) else {}
        raise DataError(f"{path}: a covariate-shift weighted lambda that is not certified: its weights' effective "
                        f"sample size {_shown_number(w.get('ess'))} is below deployment.shift.min_ess = "
                        f"{_shown_number(w.get('min_ess'))} (too few calibration prompts resemble the deployment "
                        "prompts); no decoder deploys it (docs/shift.md)")
    return LambdaRecord(path=str(path), lambda_hat=lam_hat, lambda_star=lam_star, tau=tau, mode=str(data["mode"]),
                        decoder=data["decoder"], feasible=data["feasible"] is True, status=str(data["status"]),
                        data=data)


def _shown_number(value) -> str:
    return f"{value:.1f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(value)
    return float(value)


BOOLEANS = ("feasible", "certified", "exact", "monotone")  # wherever they stand in a record: true, false or null


def _booleans(value, where: str = "") -> list[str]:
    """The keys named in BOOLEANS, at any depth, whose value is neither a boolean nor null (the text "false" is no
    false: read as a truth value it would deploy what certified nothing)."""
    if isinstance(value, dict):
        bad = [f"{where}{k}" for k, v in value.items() if k in BOOLEANS and v is not None and not isinstance(v, bool)]
        return bad + [b for k, v in value.items() if k != "timing_s" for b in _booleans(v, f"{where}{k}.")]
    return []


def _check_values(data: dict, path) -> None:
    """What a writer guarantees and an edit can break: every flag a boolean, and the deployed lambda* is the lambda
    of the record's own deploying procedure: its bootstrap quantile (bootstrap.quantiles holds the deployed
    quantile's value) or its certified lambda (procedures.<crc|ltt|ltt_wsr>.lambda)."""
    from lara.read.files import DataError

    flags = _booleans(data)
    if flags:
        raise DataError(f"{path}: {', '.join(flags[:3])}: not true or false (a flag written as text or a number); "
                        "rerun the calibration (decoders deploy only what it computed)")

    procedure = (data.get("guarantee") or {}).get("procedure", "bootstrap")
    if procedure != "bootstrap":
        chosen = ((data.get("procedures") or {}).get(procedure) or {}).get("lambda")
        if not isinstance(chosen, (int, float)) or not math.isclose(float(data["lambda_star"]), chosen, rel_tol=1e-9,
                                                                    abs_tol=1e-12):
            raise DataError(f"{path}: lambda_star = {data['lambda_star']!r} is not the record's own {procedure} "
                            f"lambda ({chosen!r}, procedures.{procedure}.lambda); the file was edited after `lara "
                            "calibrate` wrote it: rerun the calibration (decoders deploy only what it computed)")
        return
    boot = data["bootstrap"] if isinstance(data["bootstrap"], dict) else {}
    q = boot.get("quantile")
    deployed = (boot.get("quantiles") or {}).get(str(q))
    if isinstance(deployed, (int, float)) and not math.isclose(float(data["lambda_star"]), deployed, rel_tol=1e-9,
                                                              abs_tol=1e-12):
        raise DataError(f"{path}: lambda_star = {data['lambda_star']!r} is not the record's own bootstrap quantile "
                        f"{q} = {deployed!r} (bootstrap.quantiles); the file was edited after `lara calibrate` "
                        "wrote it: rerun the calibration (decoders deploy only what it computed)")


def check_budget(record: LambdaRecord, tau: float | None, n: int | None = None, key: str = "calibration.tau") -> None:
    """Refuse to audit ``record`` against another budget or another Best-of-N size than it was
    calibrated for: a lambda* means something only for its own tau (and, in bon mode, its own N)."""
    from lara.read.files import DataError

    if tau is not None and float(tau) != record.tau:
        raise DataError(f"{record.path}: calibrated for tau = {record.tau:g}, but {key} is {float(tau):g}: rerun "
                        "the calibration for this tau, or audit against the record's own")
    if n is not None and record.decoder_n is not None and int(n) != record.decoder_n:
        raise DataError(f"{record.path}: calibrated for Best-of-N with N = {record.decoder_n}, but the decoder "
                        f"draws N = {int(n)} (decode.bon_n): rerun the calibration for this N")


def overpenalised_note(lambda_star: float, overpenalised: float | None) -> str | None:
    """What a reader must be told when lambda* is at or above the `max` setting's lambda: that
    setting then penalises cost no more than lambda* does, so it is no over-penalised reference."""
    if overpenalised is None or lambda_star < overpenalised:
        return None
    return (f"lambda* = {lambda_star:.4g} is at or above the `max` setting's lambda = {overpenalised:g} "
            "(decode.overpenalised_lambda): `max` does not over-penalise in this experiment; raise "
            "decode.overpenalised_lambda above lambda*")


def write_lambda(record: dict, path: str | Path) -> None:
    """Write a calibration result as ``lambda.json`` (atomically; checked like the reader checks it)."""
    from lara.io import write_json
    from lara.read.files import DataError

    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise DataError(f"{path}: refusing to write a lambda.json without {', '.join(missing)}")
    bad = nonfinite(record)
    if bad:
        raise DataError(f"{path}: refusing to write a lambda.json whose {', '.join(bad)} is not a finite number")
    _check_values(record, path)
    write_json(path, record)


def provenance(settings, scores, **more) -> dict:
    """What every calibration's and coverage study's record carries beside its content: its settings, its input
    table(s) with their sha256 (one entry for one path, a list for a list) and the code version that wrote it;
    ``more``: the record's further keys of the same kind (its identity, ...)."""
    from dataclasses import asdict

    from lara.io import sha256_file
    from lara.provenance import code_version

    def one(path):
        return {"path": str(path), "sha256": sha256_file(path)}

    files = [one(p) for p in scores] if isinstance(scores, (list, tuple)) else one(scores)
    return {"settings": asdict(settings), "scores": files, "code": code_version(), **more}


def literal_name(value: float) -> str:
    """A number as a file-name part, the way literal lambda settings are written (the inverse of
    :func:`parse_setting`): 0.1 -> "0p1", 10.0 -> "10", 1e-7 -> "0p0000001" (the shortest decimal
    that reads back as the same float)."""
    import numpy as np

    if not (np.isfinite(value) and value >= 0):
        raise ValueError(f"{value!r}: only a finite number >= 0 has a name")
    return np.format_float_positional(float(value), trim="-").replace(".", "p")


def tau_name(tau: float) -> str:
    """A tau as a file-name part: -1.0 -> "m1", 0.8 -> "0p8" (m for minus; the inverse of :func:`parse_tau_name`)."""
    return ("m" if tau < 0 else "") + literal_name(abs(float(tau)))


def parse_tau_name(name: str) -> float:
    if not re.fullmatch(r"m?[0-9]+(p[0-9]+)?", name):
        raise ValueError(f"{name!r} is not a tau's name (like m0p5 for -0.5)")
    value = float(name.lstrip("m").replace("p", "."))
    return -value if name.startswith("m") and value else value


STAR_AT_TAU = re.compile(r"star_tau_(m?[0-9]+(?:p[0-9]+)?)")  # lambda* of another calibration.tau: star_tau_m1


def setting_tau(name: str) -> float | None:
    """The tau a ``star_tau_<tau>`` setting was calibrated for (None for every other setting)."""
    m = STAR_AT_TAU.fullmatch(name)
    return parse_tau_name(m.group(1)) if m else None


def parse_setting(name: str) -> float | None:
    """A literal lambda setting ("2", "0p5" = 0.5), or None for a named one (zero, hat, star, max, and
    star_tau_<tau>: lambda* of another listed calibration.tau, read from that tau's lambda.json)."""
    if name in NAMED or STAR_AT_TAU.fullmatch(name):
        return None
    if not re.fullmatch(r"[0-9]+(p[0-9]+)?", name):
        from lara.config import ConfigError

        raise ConfigError(f"--setting {name!r}: a lambda setting is zero, hat, star, max, star_tau_<tau> (like "
                          "star_tau_m1 for tau = -1), direct (a token-level decoder's own calibration), crc or ltt "
                          "(Best-of-N's certified lambdas) or a literal like 0p5")
    return float(name.replace("p", "."))


def _overpenalised(text: str) -> float:
    """--overpenalised-lambda, checked as the config key it carries (finite, >= 0)."""
    import argparse

    from lara.config import ConfigError, check_value

    try:
        return check_value("decode.overpenalised_lambda", float(text))
    except (ValueError, ConfigError) as exc:
        raise argparse.ArgumentTypeError(str(exc) if isinstance(exc, ConfigError) else f"not a number: {text!r}") \
            from None


_overpenalised.__name__ = "number"


def add_lambda_arguments(parser) -> None:
    """The decoders' lambda setting, one definition for every decoder: the setting's name, the
    over-penalised lambda that ``max`` stands for (config key decode.overpenalised_lambda) and the
    calibration record that ``star`` reads."""
    parser.add_argument("--setting", required=True,
                        help="lambda setting: zero, hat (lambda-hat), star (lambda*), max, or a literal such as 0p5")
    parser.add_argument("--overpenalised-lambda", type=_overpenalised, required=True,
                        help="the lambda of the `max` setting (config key decode.overpenalised_lambda)")
    parser.add_argument("--lambda-json", default=None, help="lambda.json (needed by 'hat' and 'star')")


def resolve_lambda(name: str, overpenalised: float, lambda_json: str | Path | None = None) -> float:
    """The value of a named lambda setting: zero, max (decode.overpenalised_lambda), hat and star
    (lambda-hat and lambda* from lambda.json) or a literal."""
    literal = parse_setting(name)
    if literal is not None:
        return literal
    if name == "zero":
        return 0.0
    if name == "max":
        return float(overpenalised)
    if lambda_json is None:
        from lara.config import ConfigError

        raise ConfigError(f"--setting {name}: {'lambda-hat' if name == 'hat' else 'lambda*'} is read from "
                          f"{'direct_<method>.json' if name == 'direct' else 'lambda.json'}; pass --lambda-json")
    if name == "direct":  # a token-level decoder's own calibration (lara calibrate-decoder)
        return float(read_direct(lambda_json)["lambda_star"])
    record = read_lambda(lambda_json)
    if name in CERTIFIED:
        return record.procedure_lambda(name)
    tau = setting_tau(name)
    if tau is not None:  # star_tau_<tau>: that tau's lambda*, from the record calibrated for it
        check_budget(record, tau, key=f"--setting {name}")
        return record.lambda_star
    return record.lambda_star if name == "star" else record.lambda_hat


DIRECT_KIND = "token_level_direct"  # the record `lara calibrate-decoder` writes (lara.decode.direct)


def read_direct(path: str | Path) -> dict:
    """A ``direct_<method>.json`` (lara.decode.direct), checked: its kind, a finite lambda_star >= 0, a tau.
    Read here, not in lara.decode.direct, so a decoder's code closure stays the reader's alone."""
    from lara.read.files import DataError, json_file

    data = json_file(Path(path), f"{path} (a decoder calibration)", mapping=False)
    lam = data.get("lambda_star") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("kind") != DIRECT_KIND:
        raise DataError(f"{path}: not a `lara calibrate-decoder` record (kind {DIRECT_KIND!r})")
    if not isinstance(lam, int | float) or not math.isfinite(lam) or lam < 0:
        raise DataError(f"{path}: lambda_star {lam!r} is not a finite number >= 0; rerun `lara calibrate-decoder`")
    if not isinstance(data.get("tau"), int | float):
        raise DataError(f"{path}: no tau; rerun `lara calibrate-decoder`")
    return data
