"""Hugging Face hub references: what an experiment downloads, and how its jobs find it offline.

An experiment names hub ids in five places: ``base_model.name_or_path``, ``data.{sft,preferences,prompts}.source``
and ``evaluation.{reward_model,cost_model}``, each with a ``revision`` (a commit, tag or branch; null = the
default branch) and, for data, the dataset configuration ``name`` and ``data_dir``. :func:`references` lists
them; ``lara fetch`` (the workflow's ``fetch_hub`` step, a local rule that runs where the network is, or a
person before a run) downloads each into the hub cache (``HF_HOME``, on a filesystem the compute nodes share)
and checks that it loads: a mistyped id or revision fails there, with the hub's message, before any GPU job.
The compute jobs then run with ``HF_HUB_OFFLINE=1`` and :func:`snapshot` reads only the cache, so a job reads
exactly the commit that was fetched (recorded in ``results/{exp}/hub.json`` and in every output's provenance).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from lara.settings import setting

log = logging.getLogger(__name__)

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

# weights a snapshot never needs: other frameworks' formats and the consolidated originals (Llama's original/)
IGNORE_ALWAYS = ["original/*", "*.pth", "*.gguf", "*.onnx", "*.onnx_data", "*.msgpack", "*.h5", "*.ot", "*.tflite",
                 "*.mlmodel", "coreml/*", "onnx/*", "openvino/*"]


def revision_setting(what: str) -> str | None:
    """The hub revision of a model or data set, as a settings field."""
    return setting(None, f"Hub revision of {what} to pin (a commit, tag or branch; null = the default branch); "
                         "ignored for a local source.")


class HubError(RuntimeError):
    """A hub reference that cannot be downloaded, found in the cache, or loaded."""


@dataclass(frozen=True)
class HubRef:
    """One hub repository an experiment reads, and the config key that names it."""

    key: str
    repo_id: str
    repo_type: str = "model"  # model | dataset
    revision: str | None = None
    name: str | None = None  # a dataset's configuration
    data_dir: str | None = None
    split: str | None = None  # checked when fetched

    @property
    def label(self) -> str:
        return f"{self.repo_id}@{self.revision or 'main'}"

    @classmethod
    def from_dict(cls, d: dict) -> HubRef:
        return cls(**{k: d.get(k) for k in ("key", "repo_id", "repo_type", "revision", "name", "data_dir", "split")})


def is_hub_id(value: str, base: Path = Path(".")) -> bool:
    """``owner/name`` that names no local file or folder."""
    from lara.config import looks_local

    return bool(HUB_ID.match(value)) and not looks_local(value, base) and not (base / value).exists()


def references(config: dict, base: Path = Path("."), scorers: tuple[str, ...] = ()) -> list[HubRef]:
    """The hub repositories a validated config reads (``scorers``: named scorers, never on the hub)."""
    from lara import config as lara_config

    refs = []
    for key, value, kind, revision in lara_config.references(config):
        if value == "toy" or value in scorers or not is_hub_id(value, base):
            continue
        parent, _, field = (revision or "").rpartition(".")
        d = lara_config.section(config, parent) if revision else {}  # (a constraint's scorer: no revision key)
        refs.append(HubRef(key, value, "dataset", d.get(field), d.get("name"), d.get("data_dir"), d.get("split"))
                    if kind == "data" else HubRef(key, value, "model", d.get(field)))
    return refs


def refs_json(refs: list[HubRef]) -> str:
    """The references as ``lara fetch --refs`` reads them (sorted keys: a rule param that changes exactly when
    a reference does)."""
    return json.dumps([asdict(r) for r in refs], sort_keys=True)


def _cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _patterns(ref: HubRef, files: list[str]) -> dict:
    """allow/ignore patterns of a snapshot: a dataset's data_dir and its card (which names configurations; a
    ``*.json`` pattern would also match every JSON data file of the other folders: fnmatch's * crosses "/"); a
    model's files, without other frameworks' weights, and without .bin weights when safetensors are there."""
    if ref.repo_type == "dataset":
        return {"allow_patterns": [f"{ref.data_dir.strip('/')}/*", "README.md"]} if ref.data_dir else {}
    ignore = list(IGNORE_ALWAYS)
    if any(f.endswith(".safetensors") for f in files):
        ignore += ["*.bin", "*.pt"]
    return {"ignore_patterns": ignore}


def snapshot(ref: HubRef) -> Path:
    """The local snapshot folder of ``ref`` from the hub cache only (what a compute job reads); a clear error,
    naming the key, the id and the cache, when it was never fetched."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(ref.repo_id, repo_type=ref.repo_type, revision=ref.revision,
                                      local_files_only=True))
    except Exception as exc:  # LocalEntryNotFoundError, or a revision the cache has no ref for
        raise HubError(f"{ref.key}: {ref.label} ({ref.repo_type}) is not in the Hugging Face cache "
                       f"{_cache_dir()}: run the workflow's fetch_hub step or `lara fetch CONFIG` where the hub "
                       f"is reachable, with the same HF_HOME ({_first_line(exc)})") from None


def download(ref: HubRef) -> tuple[Path, str]:
    """Download ``ref`` into the cache; where the hub cannot be reached, fall back to the cache. Returns the
    snapshot folder and how it was obtained (``downloaded`` or ``cached``)."""
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if constants.HF_HUB_OFFLINE:
        log.info("%s: HF_HUB_OFFLINE is set: looking in the cache only", ref.label)
        return snapshot(ref), "cached"
    try:
        files = HfApi().list_repo_files(ref.repo_id, repo_type=ref.repo_type, revision=ref.revision)
    except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError) as exc:
        raise HubError(f"{ref.key}: {ref.label} ({ref.repo_type}): {_first_line(exc)}") from None
    except Exception as exc:  # no network: a connection error or timeout (httpx's own types), a 5xx
        if not isinstance(exc, (HfHubHTTPError, OSError)) and not re.search("connect|timeout|network",
                                                                             type(exc).__name__, re.I):
            raise
        log.warning("%s: the hub cannot be reached (%s); looking in the cache", ref.label, _first_line(exc))
        return snapshot(ref), "cached"
    try:
        path = snapshot_download(ref.repo_id, repo_type=ref.repo_type, revision=ref.revision,
                                 **_patterns(ref, files))
    except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError, HfHubHTTPError) as exc:
        raise HubError(f"{ref.key}: {ref.label} ({ref.repo_type}): {_first_line(exc)}") from None
    return Path(path), "downloaded"


def check(ref: HubRef, path: Path) -> dict:
    """Load what a job will load from the snapshot: a dataset's split (rows), a model's config.json."""
    if ref.repo_type == "dataset":
        return {"rows": len(load_dataset_snapshot(ref, path))}
    cfg = path / "config.json"
    if not cfg.is_file():
        raise HubError(f"{ref.key}: {ref.label} has no config.json: not a transformers model")
    try:
        from lara.read.files import json_file
        archs = json_file(cfg, mapping=False).get("architectures") or []
    except ValueError as exc:
        raise HubError(f"{ref.key}: {ref.label}: config.json does not parse ({exc})") from None
    return {"architectures": archs}


def load_dataset_snapshot(ref: HubRef, path: Path):
    """One split of a fetched dataset: its snapshot folder through ``datasets`` (the card's configurations,
    ``name`` and ``data_dir`` as configured); no network."""
    from datasets import load_dataset

    try:
        return load_dataset(str(path), name=ref.name, data_dir=ref.data_dir, split=ref.split)
    except Exception as exc:  # datasets raises many types (ValueError for an unknown config or split, ...)
        raise HubError(f"{ref.key}: {ref.label} (name={ref.name}, data_dir={ref.data_dir}): could not load split "
                       f"{ref.split!r}: {_first_line(exc)}") from None


def commit_of(path: Path) -> str:
    """The commit of a snapshot folder (the hub cache names each snapshot by its commit)."""
    return Path(path).name


def fetch(refs: list[HubRef]) -> dict:
    """Download and check every reference; the manifest (what was fetched, at which commit)."""
    entries = []
    for i, ref in enumerate(refs, 1):
        log.info("[%d/%d] %s: %s (%s)", i, len(refs), ref.key, ref.label, ref.repo_type)
        path, how = download(ref)
        entry = asdict(ref) | {"commit": commit_of(path), "obtained": how} | check(ref, path)
        n = sum(1 for p in path.rglob("*") if p.is_file())
        log.info("    %s at commit %s: %d files (%s)%s", how, entry["commit"], n, path,
                 f", split {ref.split!r}: {entry['rows']} rows" if "rows" in entry else "")
        entries.append(entry | {"files": n})
    return {"hf_hub_cache": _cache_dir(), "refs": entries}


# ---------------------------------------------------------------------------------------------
# CLI: lara fetch

HELP = "download every Hugging Face model and dataset an experiment names into the hub cache (run where the network is)"


def add_arguments(parser) -> None:
    parser.add_argument("configs", nargs="*", help="experiment config files (layered as for validate-config)")
    parser.add_argument("--refs", default=None,
                        help="instead of config files: the references as the Snakefile lists them (JSON)")
    parser.add_argument("--out", default=None, help="write the manifest (JSON: each id, revision, commit) here")


def run(args) -> None:
    from lara.config import ConfigError, load, named_scorer_names

    if args.refs is not None:
        try:
            refs = [HubRef.from_dict(d) for d in json.loads(args.refs)]
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"--refs: expected a JSON list of references ({exc})") from None
    elif args.configs:
        refs = references(load(*args.configs), scorers=named_scorer_names())
    else:
        raise ConfigError("fetch: give config files, or --refs")
    if not refs:
        log.info("nothing to fetch: the configuration names no hub model or dataset")
    manifest = fetch(refs)
    if args.out:
        from lara.io import atomic_output

        with atomic_output(args.out) as tmp:
            Path(tmp).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    for e in manifest["refs"]:
        print(f"{e['key']}\t{e['repo_id']}\t{e['revision'] or 'main'}\t{e['commit']}\t{e['obtained']}")
