"""Code hashes from the import graph: what reruns when a module of the package is edited."""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from lara.codehash import closure, imports_of, step_code
from lara.steps import COMMANDS

from ..conftest import REPO

PKG = REPO / "workflow" / "lara"


def hashes_of(pkg_root: Path, cache: Path | None = None) -> dict[str, str]:
    """Every command's code hash, computed by a fresh interpreter on the package copy at pkg_root (with the parse
    cache in ``cache``; default a new, empty one)."""
    script = "import json; from lara.steps import COMMANDS; from lara.codehash import step_code; " \
             "print(json.dumps({c: step_code(c) for c in COMMANDS}))"
    cache = cache or Path(tempfile.mkdtemp(dir=pkg_root))
    out = subprocess.run([sys.executable, "-c", script], env={"PYTHONPATH": str(pkg_root),
                                                              "XDG_CACHE_HOME": str(cache)}, cwd=pkg_root,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


@pytest.fixture()
def package_copy(tmp_path):
    shutil.copytree(PKG, tmp_path / "lara", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path}: {old!r} not found (the test's anchor moved)"
    path.write_text(text.replace(old, new, 1))


def importers_by_text(module: str) -> set[str]:
    """Commands whose module reaches ``module`` by import lines, found with a regex (not the AST
    walker under test): `import lara.x`, `from lara.x import y` (y a module or a name)."""
    pattern = re.compile(r"^\s*(?:from\s+(lara(?:\.\w+)*)\s+import\s+([\w, ()]+)|import\s+(lara(?:\.\w+)*))", re.M)

    def direct(name):
        path = PKG.joinpath(*name.split(".")[1:])
        path = path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"
        found = set()
        for frm, names, imp in pattern.findall(path.read_text()):
            if imp:
                found.add(imp)
                continue
            found.add(frm)
            for n in re.split(r"[,\s()]+", names):
                if n and (PKG.joinpath(*frm.split(".")[1:], n).with_suffix(".py").exists()):
                    found.add(f"{frm}.{n}")
        return found

    reaches = {}
    for command, name in COMMANDS.items():
        seen, todo = set(), [name]
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo += direct(m)
        reaches[command] = seen
    return {c for c, mods in reaches.items() if module in mods}


def test_comment_docstring_and_formatting_edits_change_no_hash(package_copy):
    before = hashes_of(package_copy)
    for rel in ("decode/rgtg.py", "decode/bon.py", "calibrate/dual.py", "template.py"):
        path = package_copy / "lara" / rel
        text = path.read_text()
        # a new comment line, a reworded module docstring, and blank lines between statements
        text = text.replace('"""', '"""Reworded. ', 1) + "\n\n# an added comment\n"
        path.write_text(text.replace("\n\n\n", "\n\n\n\n", 3))
    assert hashes_of(package_copy) == before


@pytest.mark.parametrize("module, rel, old, new", [
    ("lara.template", "template.py", "def ", "SHARED_EDIT = 1\n\n\ndef "),
    ("lara.read.files", "read/files.py", "def ", "SHARED_EDIT = 1\n\n\ndef "),
])
def test_a_code_edit_to_a_shared_module_changes_exactly_its_importers(package_copy, module, rel, old, new):
    before = hashes_of(package_copy)
    edit(package_copy / "lara" / rel, old, new)
    after = hashes_of(package_copy)
    changed = {c for c in before if before[c] != after[c]}
    assert changed == importers_by_text(module)
    assert changed and changed != set(COMMANDS)  # the edit matters to some steps, not to all


def test_lazy_imports_inside_functions_are_part_of_the_closure():
    # `lara score` imports the scorer inside run(); the scorer's code is the step's code
    assert "lara.scoring" in closure(COMMANDS["score"])
    assert "lara.scoring" in imports_of("lara.score")


def test_packages_on_the_way_are_part_of_the_closure():
    assert {"lara", "lara.calibrate"} <= set(closure(COMMANDS["calibrate"]))


@pytest.mark.parametrize("command", ["rgtg", "calibrate-decoder"])
def test_token_level_decoding_hashes_no_best_of_n_module(command):
    # an edit of Best-of-N's kernel or its sweep must not rerun every token-level decode
    found = set(closure(COMMANDS[command]))
    assert not found & {"lara.calibrate.bestofn", "lara.calibrate.procedures", "lara.decode.sweep", "lara.decode.bon"}


def test_an_unknown_command_is_refused():
    with pytest.raises(ValueError, match="unknown lara command 'calibrat'"):
        step_code("calibrat")


def test_every_rule_hashes_the_command_its_shell_runs():
    """No hand-written module lists: each rule's code param names the step its shell runs."""
    seen = 0
    for smk in sorted((REPO / "rules").glob("*.smk")):
        for block in re.split(r"(?m)^(?=rule )", smk.read_text())[1:]:
            rule = block.split(":")[0].removeprefix("rule ")
            if "refused=lambda w: refused_target(" in block:  # a target the config does not plan: refused, never run
                continue
            runs = re.findall(r'"(?:lara|\{params\.launch\}) ([a-z-]+) ', block)
            named = re.findall(r'code=step_code\("([a-z-]+)"', block)
            if "**figure_params()" in block:
                named = ["figure"]
            assert runs, f"{smk.name}: rule {rule} runs no lara command"
            assert named == runs[:1], f"{smk.name}: rule {rule} runs {runs[0]} but hashes {named}"
            seen += 1
    assert seen >= 25
    common = (REPO / "rules" / "common.smk").read_text()
    assert 'code=step_code("figure")' in common and "source_hash" not in common


PRE_QUOTED = {"params.options", "params.audit", "params.exclude", "params.launch"}  # built with shlex.join


def test_every_value_in_a_shell_command_is_quoted():
    checked = 0
    for smk in sorted((REPO / "rules").glob("*.smk")):
        for shell in re.findall(r"^    shell:\n((?:\s+\".*\"\n)+)", smk.read_text(), flags=re.M):
            for name, quoted in re.findall(r"\{([a-z_.]+)(:q)?\}", shell):
                assert quoted or name in PRE_QUOTED, f"{smk.name}: {{{name}}} is not quoted in {shell.strip()}"
                checked += 1
    assert checked > 100


def test_a_named_scorer_s_code_counts_for_the_steps_that_score_with_it():
    from lara.codehash import named_scorer_modules

    assert named_scorer_modules("oracle", "PKU-Alignment/beaver-7b-unified-cost") == ["lara.toy.score"]
    assert "lara.toy.world" not in closure(COMMANDS["evaluate"])  # the general scorer does not import the toy
    assert "lara.toy.world" in closure("lara.toy.score")
    assert step_code("evaluate", "lara.toy.score") != step_code("evaluate")
    rules = (REPO / "rules" / "evaluate.smk").read_text()
    assert 'code=step_code("evaluate", *EVAL_SCORER_MODULES)' in rules


def test_the_parse_cache_answers_what_a_parse_answers_and_never_for_an_edited_module(package_copy, tmp_path):
    """The cache (keyed by each file's bytes) gives every hash a fresh parse gives; an edit to a module it holds is
    parsed again (its importers' hashes change exactly as without the cache); a corrupt cache file is ignored."""
    cache = tmp_path / "cache"
    fresh = hashes_of(package_copy)
    assert hashes_of(package_copy, cache) == fresh and list((cache / "lara").glob("codehash-*.json"))
    assert hashes_of(package_copy, cache) == fresh  # read from the cache, not parsed
    edit(package_copy / "lara" / "template.py", "def ", "SHARED_EDIT = 1\n\n\ndef ")
    edited = hashes_of(package_copy, cache)
    assert edited == hashes_of(package_copy)  # the same as a fresh parse of the edited package
    assert {c for c in fresh if fresh[c] != edited[c]} == importers_by_text("lara.template")
    for f in (cache / "lara").glob("codehash-*.json"):
        f.write_text('{"imports": [1, 2')
    assert hashes_of(package_copy, cache) == edited
