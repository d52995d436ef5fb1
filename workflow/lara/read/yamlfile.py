"""The YAML files of the one reader (:mod:`lara.read`): the config files and the schema, read strictly.

PyYAML's safe loader keeps the last of a key given twice without a word, takes YAML 1.1's merge key (whose
neighbours silently replace what it merges) and expands aliases of aliases without limit; here each of these is
refused, naming the line (:func:`strict_yaml`), and a config file's problems are one line naming the file
(:func:`yaml_file`)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import yaml

from lara.data.errors import DataError
from lara.settings import nesting_problem, shown


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser where PyYAML has it
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently)."""


def _no_duplicates(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            given = key in seen
        except TypeError:  # an unhashable key (``? [a, b]``): construct_mapping refuses it, naming its line
            continue
        if given:
            raise yaml.constructor.ConstructorError(
                None, None, f"the key {shown(key)!r} is given twice in one mapping (lines {seen[key].line + 1} and "
                f"{key_node.start_mark.line + 1}); the second would silently replace the first",
                key_node.start_mark)
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)

MERGE_TAG = "tag:yaml.org,2002:merge"


class YAMLRefused(yaml.YAMLError):
    """YAML that parses, but that a configuration does not take: a merge key, nesting or aliases beyond any
    configuration (lara.validation.MAX_DEPTH, MAX_VALUES), an alias inside its own anchor. ``line``: 1-based."""

    def __init__(self, problem: str, line: int | None):
        super().__init__(problem)
        self.problem, self.line = problem, line

    def __str__(self) -> str:
        return f"line {self.line}: {self.problem}" if self.line else self.problem


def _node_children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_nodes(root) -> None:
    """Refuse, before anything is built from it (:class:`YAMLRefused`, naming the line), a document that
    nests or expands beyond any configuration or contains itself (:func:`lara.validation.nesting_problem`), or
    that uses a merge key (``<<: *anchor``): YAML 1.1 only, and a key written beside it silently replaces
    the merged one, which is what a key given twice does."""
    merges = []  # the merge keys, in the order the walk enters their mappings

    def children(node) -> list:
        if isinstance(node, yaml.MappingNode):
            merges.extend(key for key, _ in node.value if key.tag == MERGE_TAG)
        return _node_children(node)

    found = nesting_problem(root, children)
    if found:
        problem, node = found
        raise YAMLRefused(problem, node.start_mark.line + 1)
    if merges:
        raise YAMLRefused("a YAML merge key (<<) is not read: it is YAML 1.1 only, and a key beside it silently "
                          "replaces the merged one; write the keys out (an alias *name for a whole value is fine), or "
                          "build on another config file with `extends:`", merges[0].start_mark.line + 1)


def strict_yaml(stream):
    """``yaml.safe_load``, refusing duplicate keys, merge keys, and nesting or aliases beyond any configuration
    (:func:`_check_nodes`)."""
    loader = _StrictLoader(stream)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YAMLRefused("nested too deeply to read (a configuration is a few levels deep)", None) from None
        if node is None:
            return None
        _check_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(path: str | Path):
    """A YAML file's document, read with :func:`strict_yaml` (PyYAML's and the file system's errors as they are:
    the schema files, which ship with the package)."""
    with open(path) as fh:
        return strict_yaml(fh)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: what is wrong, then where (PyYAML's own text spans several, with a snippet)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        what = "; ".join(str(p) for p in (exc.context, exc.problem) if p)
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return " ".join(f"{what}{where}".split())
    return " ".join(str(exc).split())


# what a file that cannot be read as text is said to be (missing, a folder, not UTF-8 at byte {}), by what it should be
CONFIG_FILE = ("config file not found", "is a folder, not a config file", "not UTF-8 text (byte {}): not a config file")
JSON_FILE = ("file not found", "is a folder, expected a JSON file", "not UTF-8 (byte {}); re-encode the file as UTF-8")


@contextmanager
def readable(where, refusals: tuple[str, str, str]):
    """Reading a text file: a missing file, a folder or bytes that are not UTF-8 is one
    :class:`~lara.data.errors.DataError` naming ``where``, said as ``refusals`` (:data:`CONFIG_FILE`,
    :data:`JSON_FILE`)."""
    missing, folder, encoding = refusals
    try:
        yield
    except FileNotFoundError:
        raise DataError(f"{where}: {missing}") from None
    except IsADirectoryError:
        raise DataError(f"{where}: {folder}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{where}: {encoding.format(exc.start)}") from None


def yaml_file(path: str | Path) -> dict:
    """A config file's mapping (an empty file is refused), or :class:`~lara.data.errors.DataError` naming the file
    (and the line) in one line."""
    try:
        with readable(path, CONFIG_FILE):
            data = read_yaml(path)
    except YAMLRefused as exc:
        raise DataError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise DataError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        raise DataError(f"{path}: empty (no keys); a config file is a mapping of keys (Snakemake refuses an empty "
                        "one too)")
    if not isinstance(data, dict):
        raise DataError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data
