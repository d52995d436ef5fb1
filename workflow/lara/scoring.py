"""One scorer interface for every later stage: ``score(prompts, responses) -> np.ndarray``.

Backends: a sequence model trained here (reward, cost, partial reward/cost: a
``*ForSequenceClassification`` directory with ``lara_scorer.json``), a CD-Q value model
(a causal LM whose head scores every next token), a safe-rlhf ``LlamaForScore`` checkpoint, and
scorers that packages register by name (``lara.scorers`` entry points; the toy world registers
its oracle there, so this module knows nothing of it). The score of a sequence is the head
applied at its true last token, found from the attention mask (never from the pad token id,
which may equal EOS), with position ids from the mask, so left- and right-padded batches give
the same scores.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

# the named scorers and what a spec may say, decided without loading a model (re-exported: callers import them here)
from lara.scorer_specs import SCORER_ENTRY_POINTS, WORKFLOW_SPECS, named_scorers, spec_problem  # noqa: F401
from lara.template import format_prompt

log = logging.getLogger(__name__)

SCORER_FILE = "lara_scorer.json"


class Scorer(Protocol):
    def score(self, prompts: Sequence[str], responses: Sequence[str]) -> np.ndarray: ...


def encode(tokenizer, prompt: str, response: str, append_eos: bool, max_length: int | None = None) -> list[int]:
    """Token ids of a templated prompt and its response (+ EOS for complete responses).
    Training and scoring both go through here, so they see identical sequences."""
    text = f"{format_prompt(prompt)} {str(response).strip()}".rstrip()
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    if append_eos:
        ids = ids + [tokenizer.eos_token_id]
    if max_length is not None and len(ids) > max_length:
        ids = ids[:max_length - 1] + [tokenizer.eos_token_id] if append_eos else ids[:max_length]
    return ids


def score_table(scorer: Scorer, prompts: Sequence[str], responses: Sequence[str], label: str) -> np.ndarray:
    """A whole table's scores (the score and evaluate steps), with a progress bar where the scorer
    draws one (a model: hours for the paper's 40,000 responses through a 7B scorer)."""
    import inspect

    takes_progress = "progress" in inspect.signature(scorer.score).parameters
    return scorer.score(prompts, responses, progress=label) if takes_progress else scorer.score(prompts, responses)


def pad_batch(seqs: list[list[int]], pad_id: int, side: str = "right"):
    """(input_ids, attention_mask) tensors, padded on ``side``."""
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        lo = 0 if side == "right" else width - len(s)
        ids[i, lo:lo + len(s)], mask[i, lo:lo + len(s)] = torch.tensor(s), 1
    return ids, mask


def last_token_index(attention_mask):
    """Index of the last real token per row, for left- or right-padded batches."""
    import torch

    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (positions * attention_mask).argmax(dim=-1)


def position_ids(attention_mask):
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def sequence_scores(model, input_ids, attention_mask):
    """Head of a ``*ForSequenceClassification`` model at each row's true last token."""
    import torch

    inputs = {"input_ids": input_ids, "attention_mask": attention_mask,
              "position_ids": position_ids(attention_mask), "use_cache": False}
    inner = getattr(model, "module", None)
    if inner is not None:
        # a DistributedDataParallel wrapper (multi-process training): gradients are averaged across processes
        # only for a forward through the wrapper, so run the whole model and take its last hidden states
        hidden, head = model(**inputs, output_hidden_states=True).hidden_states[-1], inner.score
    else:
        hidden, head = getattr(model, model.base_model_prefix)(**inputs).last_hidden_state, model.score
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    return head(hidden[rows, last_token_index(attention_mask)]).squeeze(-1)


class SequenceScorer:
    """A trained reward/cost (or partial) model, batched and device-aware."""

    def __init__(self, path: str | Path, device: str | None = None, batch_size: int = 32,
                 padding_side: str = "right", dtype: str = "float32"):
        import torch

        self.path = Path(path)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.meta, self.tokenizer, model = self._load(getattr(torch, dtype))
        self.model = model.to(self.device).eval()
        self.batch_size = batch_size
        self.padding_side = padding_side
        self.max_length = self.meta.get("max_length")

    def _load(self, dtype) -> tuple:
        """(meta, tokenizer, model) of the checkpoint: lara's scorer file (its absence: EOS appended), the tokenizer,
        the ``*ForSequenceClassification`` model in ``dtype``."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from lara.read.files import json_file

        meta_file = self.path / SCORER_FILE
        meta = json_file(meta_file, mapping=False) if meta_file.exists() else {"append_eos": True}
        return (meta, AutoTokenizer.from_pretrained(self.path),
                AutoModelForSequenceClassification.from_pretrained(self.path, dtype=dtype))

    def encode(self, prompts, responses, append_eos: bool | None = None) -> list[list[int]]:
        eos = self.meta.get("append_eos", True) if append_eos is None else append_eos
        return [encode(self.tokenizer, p, r, eos, self.max_length) for p, r in zip(prompts, responses, strict=True)]

    def score_ids(self, seqs: list[list[int]], progress: str | None = None) -> np.ndarray:
        """Scores of token sequences, in batches of similar lengths; ``progress``: the label of a
        progress bar (rows, rate, ETA; at most one line per 10 s) for a whole table's scoring."""
        import torch
        from tqdm import tqdm

        out = np.empty(len(seqs))
        order = np.argsort([len(s) for s in seqs], kind="stable")  # similar lengths batch together
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        bar = tqdm(total=len(seqs), desc=progress, unit="response", mininterval=10, disable=progress is None)
        with torch.inference_mode(), bar:
            for lo in range(0, len(seqs), self.batch_size):
                idx = order[lo:lo + self.batch_size]
                ids, mask = pad_batch([seqs[i] for i in idx], pad, self.padding_side)
                scores = sequence_scores(self.model, ids.to(self.device), mask.to(self.device))
                out[idx] = scores.float().cpu().numpy()
                bar.update(len(idx))
        return out - float(self.meta.get("offset", 0.0))  # a bt cost model's fitted zero (lara.train.preference)

    def score(self, prompts: Sequence[str], responses: Sequence[str], progress: str | None = None) -> np.ndarray:
        return self.score_ids(self.encode(prompts, responses), progress)


class ValueScorer(SequenceScorer):
    """A CD-Q value model: its LM head gives Q(prefix, z) for every next token z (batched, left-padded)."""

    def _load(self, dtype) -> tuple:
        """(meta, tokenizer, model): lara's scorer file (required), the tokenizer, the causal LM in ``dtype``."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from lara.read.files import json_file

        return (json_file(self.path / SCORER_FILE, mapping=False), AutoTokenizer.from_pretrained(self.path),
                AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype))

    def _forward(self, seqs: list[list[int]]):
        """Logits at each row's last real token (left padding, positions from the mask)."""
        import torch

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        ids, mask = pad_batch(seqs, pad, side="left")
        ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask),
                                use_cache=False).logits
        return logits[:, -1].float()

    def prefix_values(self, prompts, responses, fraction: float) -> np.ndarray:
        """The value after the first ceil(fraction * |y|) tokens of each response (EOS included at 1):
        Q(prompt + y_<t, y_t), what CD-Q predicts the finished response will score from that prefix."""
        import math

        ctx, nxt = [], []
        for p, r in zip(prompts, responses, strict=True):
            head, full = encode(self.tokenizer, p, "", False), encode(self.tokenizer, p, r, True)
            t = max(1, math.ceil(fraction * (len(full) - len(head))))
            ctx.append(full[:len(head) + t - 1])
            nxt.append(full[len(head) + t - 1])
        out = np.empty(len(ctx))
        for lo in range(0, len(ctx), self.batch_size):
            q = self._forward(ctx[lo:lo + self.batch_size])
            out[lo:lo + len(q)] = q[range(len(q)), nxt[lo:lo + self.batch_size]].cpu().numpy()
        return out

    def score(self, prompts, responses) -> np.ndarray:
        """Q of the final token (EOS) of each complete response: its predicted score (the value at fraction 1)."""
        return self.prefix_values(prompts, responses, 1.0)


SAFE_RLHF_NORMALIZE = ("affine", "scale", "translate", "identity")


class LlamaForScoreScorer(SequenceScorer):
    """A safe-rlhf ``LlamaForScore`` checkpoint (e.g. PKU-Alignment/beaver-7b-unified-reward and
    -cost) without the safe-rlhf package: a Llama backbone plus ``score_head`` = Linear(hidden,
    score_dim), with a bias when the config's ``bias`` is true, the score read at the last
    non-padding token of prompt + response + EOS. When the config's ``do_normalize`` is true, the
    score goes through the checkpoint's stored normaliser (``normalizer.mean``/``normalizer.var``,
    ``normalize_function`` affine | scale | translate | identity), as safe-rlhf scores it."""

    def __init__(self, path: str, device: str | None = None, batch_size: int = 16, padding_side: str = "right",
                 dtype: str = "float32"):
        self.spec = path
        super().__init__(path, device, batch_size, padding_side, dtype)

    def _load(self, dtype) -> tuple:
        from transformers import AutoTokenizer, LlamaModel

        config = score_config(self.spec)
        tokenizer = AutoTokenizer.from_pretrained(self.spec)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        backbone = LlamaModel.from_pretrained(self.spec, dtype=dtype)
        head = load_score_head(self.spec, backbone.config.hidden_size, config).to(dtype)
        return {"append_eos": True}, tokenizer, _BackboneWithHead(backbone, head)


def score_config(path: str) -> dict:
    """The score-head keys of a LlamaForScore config.json, checked: score_dim 1, a known
    normalize_function; defaults as safe-rlhf's (no bias, no normalisation)."""
    from transformers import AutoConfig

    from lara.settings import ConfigError

    cfg = AutoConfig.from_pretrained(path).to_dict()
    out = {"score_dim": cfg.get("score_dim", 1), "bias": bool(cfg.get("bias", False)),
           "do_normalize": bool(cfg.get("do_normalize", False)),
           "normalize_function": cfg.get("normalize_function", "affine")}
    if out["score_dim"] != 1:
        raise ConfigError(f"{path}: score_dim = {out['score_dim']}; a reward or cost scorer has one score per sequence")
    if out["do_normalize"] and out["normalize_function"] not in SAFE_RLHF_NORMALIZE:
        raise ConfigError(f"{path}: normalize_function {out['normalize_function']!r} is not one of "
                          f"{', '.join(SAFE_RLHF_NORMALIZE)}")
    return out


def _BackboneWithHead(backbone, head):
    """Module with ``base_model_prefix``/``score`` as :func:`sequence_scores` expects."""
    import torch

    class BackboneWithHead(torch.nn.Module):
        base_model_prefix = "model"

        def __init__(self):
            super().__init__()
            self.model, self.score = backbone, head

    return BackboneWithHead()


def load_score_head(path: str, hidden_size: int, config: dict | None = None):
    """``score_head.weight`` (and ``score_head.bias`` when the config's ``bias`` says so) from a
    checkpoint's safetensors or .bin shards (local directory or hub id), as a Linear(hidden_size, 1);
    with ``do_normalize``, followed by the stored normaliser."""
    import torch

    config = config or {"bias": True, "do_normalize": False}
    wanted = {"score_head.weight"} | ({"score_head.bias"} if config["bias"] else set())
    if config.get("do_normalize"):
        wanted |= {"normalizer.mean", "normalizer.var"}
    files = _checkpoint_files(path)
    state = {}
    for f in files:
        if f.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(f, framework="pt") as fh:
                state |= {k: fh.get_tensor(k) for k in fh.keys() if k in wanted}  # noqa: SIM118
        else:
            shard = torch.load(f, map_location="cpu", weights_only=True)
            state |= {k: v for k, v in shard.items() if k in wanted}
        if wanted <= set(state):
            break
    missing = wanted - set(state)
    if missing:
        raise ValueError(f"{path}: no {', '.join(sorted(missing))} in the checkpoint; is it a LlamaForScore model "
                         f"(config: bias={config['bias']}, do_normalize={config.get('do_normalize', False)})?")
    head = torch.nn.Linear(hidden_size, state["score_head.weight"].shape[0], bias=config["bias"])
    head.load_state_dict({"weight": state["score_head.weight"]} | ({"bias": state["score_head.bias"]}
                                                                   if config["bias"] else {}))
    if not config.get("do_normalize"):
        return head
    return _Normalised(head, state["normalizer.mean"], state["normalizer.var"], config["normalize_function"])


def _Normalised(head, mean, var, function: str):
    """``head`` followed by safe-rlhf's score normalisation with the stored running statistics."""
    import torch

    class Normalised(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = head
            self.register_buffer("mean", mean.float().reshape(-1))
            self.register_buffer("std", var.float().reshape(-1).sqrt())

        def forward(self, hidden):
            x = self.head(hidden)
            if function in ("affine", "translate"):
                x = x - self.mean.to(x.dtype)
            if function in ("affine", "scale"):
                x = x / (self.std.to(x.dtype) + 1e-8)
            return x

    return Normalised()


def _checkpoint_files(path: str) -> list[str]:
    """Weight files of a checkpoint; the shard holding the head first when an index says which."""
    local = Path(path)
    if local.is_dir():
        names, get = sorted(p.name for p in local.iterdir()), lambda name: str(local / name)
    else:
        from huggingface_hub import hf_hub_download, list_repo_files

        names, get = sorted(list_repo_files(path)), lambda name: hf_hub_download(path, name)
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if index in names:
            from lara.read.files import json_file

            weight_map = json_file(Path(get(index)))["weight_map"]
            return [get(weight_map["score_head.weight"])] if "score_head.weight" in weight_map else []
    weights = [n for n in names if n.endswith(".safetensors")] or [n for n in names if n.endswith(".bin")]
    return [get(n) for n in weights]


def architectures(spec: str) -> list[str]:
    """The ``architectures`` a checkpoint's config names (empty when none can be read)."""
    from transformers import AutoConfig

    try:
        return list(AutoConfig.from_pretrained(spec).architectures or [])
    except (OSError, ValueError):
        return []


def check_score_architecture(spec: str, role: str) -> str:
    """Which loader a checkpoint without lara's scorer file needs: ``llama_for_score`` (safe-rlhf's
    LlamaForScore) or ``sequence`` (``*ForSequenceClassification``); anything else is refused, naming
    the architecture, rather than loaded with a freshly initialised score head."""
    from lara.settings import ConfigError

    archs = architectures(spec)
    if "LlamaForScore" in archs:
        return "llama_for_score"
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return "sequence"
    other_score = [a for a in archs if a.endswith("ForScore")]
    if other_score:
        raise ConfigError(f"{role} scorer {spec}: architecture {other_score[0]} is a safe-rlhf score model this loader "
                          "does not know (known: LlamaForScore)")
    raise ConfigError(f"{role} scorer {spec}: architecture {', '.join(archs) or 'unknown (no config.json)'} is not a "
                      "score model (known: LlamaForScore, *ForSequenceClassification, or a lara model with "
                      f"{SCORER_FILE}); loading it would attach an untrained score head")


def load_scorer(spec: str, role: str = "reward", **kwargs) -> Scorer:
    """A scorer by kind: a named scorer (:func:`named_scorers`), a safe-rlhf ``LlamaForScore``
    checkpoint (beaver-7b-unified-*), or a model directory / hub id: a CD-Q value model if its
    ``lara_scorer.json`` says so, else a sequence model. ``role`` (reward or cost) tells a named
    scorer which score to give. ``name:argument``, where ``name`` is a named scorer, calls its factory with
    ``argument=argument`` (refused for a factory without an ``argument`` parameter, which would ignore it)."""
    from lara.config.refs import require_model
    from lara.scorer_specs import argument_problem
    from lara.settings import ConfigError

    size = kwargs.get("batch_size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"--batch-size {size}: at least one response per forward pass")
    named = named_scorers()
    if spec in named:
        return named[spec].load()(role=role, **kwargs)

    name, colon, argument = spec.partition(":")
    if colon and name in named:
        factory = named[name].load()
        problem = argument_problem(factory, name, argument)
        if problem:
            raise ConfigError(f"{role} scorer {spec!r}: {problem}")
        return factory(role=role, argument=argument, **kwargs)

    require_model(spec, f"{role} scorer")
    path = Path(spec)
    if not path.exists() and "/" not in spec:
        raise ConfigError(f"{role} scorer {spec!r}: not a model directory, not a hub id (owner/name), and not a named "
                         f"scorer (named: {', '.join(sorted(named)) or 'none installed'})")
    meta_file = path / SCORER_FILE
    if meta_file.is_file():
        from lara.read.files import json_file
        if json_file(meta_file, mapping=False).get("kind", "").startswith("value_"):
            return ValueScorer(spec, **kwargs)  # (it pads on the left whatever padding_side says)
        return SequenceScorer(spec, **kwargs)
    if check_score_architecture(spec, role) == "llama_for_score":
        return LlamaForScoreScorer(spec, **kwargs)
    return SequenceScorer(spec, **kwargs)
