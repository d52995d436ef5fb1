"""Token-level reward-guided decoding with the calibrated reward: ARGS, PARGS and CD-Q (docs/decoding.md).

At every step the policy pi_ref proposes its top-k next tokens z, each scored by

    log pi_ref(z | x, y) + w * (r(x, y z) - lambda * c(x, y z))

and the decoder takes the argmax (``temperature = 0``) or samples from softmax(score / T). The scorers differ by
method: ``args``, the full-sequence reward and cost models applied to the prefix plus z; ``pargs``, the PARGS partial
reward and cost models (trained on prefixes); ``cdq``, the CD-Q value models, whose head gives Q(prefix, z) for every
z in one pass.

Cached candidate scoring (sequence scorers): the scorer keeps a KV cache of the prefix; the k candidates go through
one forward as k single-token continuations that attend to the cached prefix and to themselves only (a tree-shaped
4D attention mask, all at the same position); the chosen candidate's keys and values are then kept and the rest
dropped. The naive reference re-runs k full sequences per token. Both give the same tokens for a seed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from lara.calibrate.record import add_lambda_arguments
from lara.scoring import encode, pad_batch, position_ids
from lara.settings import (
    Dtype,
    Settings,
    add_settings_arguments,
    dtype_setting,
    new_default,
    read_settings,
    seed_setting,
    setting,
)

log = logging.getLogger(__name__)

METHODS = ("args", "pargs", "cdq")


@dataclass(frozen=True)
class RGTGSettings(Settings):
    """decode.rgtg.METHOD: token-level reward-guided decoding; each method has its own section."""

    SECTION: ClassVar[str] = "decode.rgtg"

    top_k: int = setting(10, "Candidate tokens per step (paper k = 50).", minimum=1)
    weight: float = setting(2.0, "Weight w of r - lambda c in the token score.", minimum=0)
    temperature: float = setting(0.0, "Softmax temperature over token scores (0 = greedy).", minimum=0)
    max_new_tokens: int = setting(48, "Longest response in tokens.", minimum=1)
    batch_size: int = setting(16, "Prompts decoded together.", minimum=1, config=False)
    stop_at_eos: bool = setting(True, "False only for benchmarks that need a fixed number of steps.",
                                config=False)
    seed: int = seed_setting()
    dtype: Dtype = dtype_setting()


@dataclass(frozen=True)
class ARGSSettings(RGTGSettings):
    """decode.rgtg.args: ARGS with the full reward/cost models on every candidate; greedy, as in ARGS."""

    SECTION: ClassVar[str] = "decode.rgtg.args"


@dataclass(frozen=True)
class PARGSSettings(RGTGSettings):
    """decode.rgtg.pargs: PARGS with partial-sequence models; sampled at T = 1, as in PARGS's code."""

    SECTION: ClassVar[str] = "decode.rgtg.pargs"

    temperature: float = new_default(RGTGSettings, "temperature", 1.0)


@dataclass(frozen=True)
class CDQSettings(RGTGSettings):
    """decode.rgtg.cdq: CD-Q with value models (one forward scores every next token)."""

    SECTION: ClassVar[str] = "decode.rgtg.cdq"


METHOD_SETTINGS = {"args": ARGSSettings, "pargs": PARGSSettings, "cdq": CDQSettings}


def _cache_keyword(module) -> str:
    """The keyword a model's forward takes its KV cache by: ``cache`` in current transformers,
    ``past_key_values`` before the rename (passing the old name to a new model warns on every call)."""
    import inspect

    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def _buffer_cache():
    """A transformers ``DynamicCache`` whose layers keep keys/values in preallocated buffers
    (:func:`_buffer_layer_class`): appending a token writes in place instead of copying the prefix."""
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.layer_class_to_replicate = _buffer_layer_class()
    return cache


_BUFFER_LAYER = None


def _buffer_layer_class():
    """A ``DynamicLayer`` over a buffer that grows geometrically (amortised O(1) per appended token, not a
    concatenation of the whole prefix), with :meth:`keep` to retain one of k candidate slots in place."""
    global _BUFFER_LAYER
    if _BUFFER_LAYER is not None:
        return _BUFFER_LAYER
    import torch
    from transformers.cache_utils import DynamicLayer

    class BufferLayer(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self.length, self.bufs = 0, None
            new = (key_states, value_states)
            need = self.length + key_states.shape[-2]
            if self.bufs is None or need > self.bufs[0].shape[-2]:
                cap = max(need + 64, 2 * (0 if self.bufs is None else self.bufs[0].shape[-2]))
                grown = [torch.empty((*x.shape[:-2], cap, x.shape[-1]), dtype=x.dtype, device=x.device) for x in new]
                for buf, old in zip(grown, self.bufs or (), strict=False):
                    buf[..., :self.length, :] = old[..., :self.length, :]
                self.bufs = grown
            for buf, x in zip(self.bufs, new, strict=True):
                buf[..., self.length:need, :] = x
            self.length = need
            self.keys, self.values = (buf[..., :need, :] for buf in self.bufs)
            return self.keys, self.values

        def keep(self, past: int, rows, slots) -> None:
            """Keep the first ``past`` positions and, for each batch row, the candidate slot
            ``past + slots[row]`` moved to position ``past`` (in place)."""
            for buf in self.bufs:
                buf[:, :, past] = buf[rows, :, past + slots]
            self.length = past + 1
            self.keys, self.values = (buf[..., :past + 1, :] for buf in self.bufs)

    _BUFFER_LAYER = BufferLayer
    return BufferLayer


class _Stepper:
    """Incremental causal-LM state: KV cache, 2D mask, logits at the last real token (``net``: the module run on the
    tokens, ``model`` itself or a sequence scorer's backbone, which gives no logits)."""

    def __init__(self, model, net=None):
        self.model, self.net = model, model if net is None else net
        self.dev = next(model.parameters()).device
        self.cache_kw = _cache_keyword(self.net)

    def start(self, ids, mask):
        self.cache = _buffer_cache()
        self.mask = mask.to(self.dev)
        out = self.net(input_ids=ids.to(self.dev), attention_mask=self.mask, position_ids=position_ids(self.mask),
                       use_cache=True, **{self.cache_kw: self.cache})
        self.last = out.logits[:, -1].float() if self.net is self.model else None

    def commit(self, tokens, choice, alive):
        import torch

        pos = self.mask.sum(-1, keepdim=True)
        self.mask = torch.cat([self.mask, alive.to(self.mask.dtype).unsqueeze(1)], dim=1)
        out = self.model(input_ids=tokens.unsqueeze(1).to(self.dev), attention_mask=self.mask, position_ids=pos,
                         use_cache=True, **{self.cache_kw: self.cache})
        self.last = out.logits[:, -1].float()


class PolicyStepper(_Stepper):
    def logprobs(self):
        import torch

        return torch.log_softmax(self.last, dim=-1)


class CachedValueScorer(_Stepper):
    """CD-Q: every candidate's value is read off one forward pass (the last logits)."""

    def candidates(self, cand):
        return self.last.gather(1, cand.to(self.dev))


class _NaiveState:
    """Reference scorers keep the whole sequence and re-run it from scratch, one full forward per candidate."""

    def __init__(self, model):
        self.model = model
        self.backbone = getattr(model, model.base_model_prefix)
        self.dev = next(model.parameters()).device

    def start(self, ids, mask):
        self.ids, self.mask = ids.to(self.dev), mask.to(self.dev)

    def candidates(self, cand):
        import torch

        out = torch.empty(*cand.shape, device=self.dev)
        for j in range(cand.shape[1]):
            out[:, j] = self.one(cand[:, j:j + 1].to(self.dev))
        return out

    def commit(self, tokens, choice, alive):
        import torch

        self.ids = torch.cat([self.ids, tokens.unsqueeze(1).to(self.dev)], 1)
        self.mask = torch.cat([self.mask, alive.to(self.mask.dtype).unsqueeze(1)], 1)


class NaiveValueScorer(_NaiveState):
    """CD-Q reference: a full forward of the sequence per candidate."""

    def one(self, z):  # Q(prefix, z) read at the prefix's end
        logits = self.model(input_ids=self.ids, attention_mask=self.mask, position_ids=position_ids(self.mask)).logits
        return logits[:, -1].float().gather(1, z).squeeze(1)


class CachedSequenceScorer(_Stepper):
    """A reward/cost (or partial) model scoring k candidates per step against a cached prefix."""

    def __init__(self, model):
        super().__init__(model, getattr(model, model.base_model_prefix))

    def candidates(self, cand):
        import torch

        b, k = cand.shape
        past = self.mask.shape[1]
        eye = torch.arange(k, device=self.dev)
        # a boolean mask (True = attend), which SDPA takes as it is: each candidate sees the prefix and itself
        tree = torch.zeros((b, 1, k, past + k), dtype=torch.bool, device=self.dev)
        tree[..., :past] = self.mask[:, None, None, :].bool()
        tree[:, 0, eye, past + eye] = True
        if getattr(self.model.config, "_attn_implementation", None) != "sdpa":  # eager adds the mask to the scores
            dtype = next(self.model.parameters()).dtype
            tree = torch.where(tree, 0.0, torch.finfo(dtype).min).to(dtype)
        pos = self.mask.sum(-1, keepdim=True).expand(b, k)
        hidden = self.net(input_ids=cand.to(self.dev), attention_mask=tree, position_ids=pos,
                          use_cache=True, **{self.cache_kw: self.cache}).last_hidden_state
        self._past = past
        return self.model.score(hidden).squeeze(-1).float()

    def commit(self, tokens, choice, alive):
        import torch

        past, rows = self._past, torch.arange(choice.shape[0], device=self.dev)
        for layer in self.cache.layers:  # keep the prefix and the chosen candidate's keys/values, in place
            layer.keep(past, rows, choice.to(self.dev))
        self.mask = torch.cat([self.mask, alive.to(self.mask.dtype).unsqueeze(1)], dim=1)


class NaiveSequenceScorer(_NaiveState):
    """Reference: each candidate scored by a full forward of prefix + candidate (no cache)."""

    def one(self, z):
        import torch

        mask = torch.cat([self.mask, torch.ones_like(z, dtype=self.mask.dtype)], 1)
        hidden = self.backbone(input_ids=torch.cat([self.ids, z], 1), attention_mask=mask,
                               position_ids=position_ids(mask))
        return self.model.score(hidden.last_hidden_state[:, -1]).squeeze(-1).float()


def make_scorer(model, cached: bool = True):
    """The stepping scorer for a model directory's model: value (causal LM) or sequence."""
    is_value = not hasattr(model, "score")
    if is_value:
        return CachedValueScorer(model) if cached else NaiveValueScorer(model)
    return CachedSequenceScorer(model) if cached else NaiveSequenceScorer(model)


def decode_batch(policy, reward, cost, tokenizer, prompts, lam, s: RGTGSettings, generator=None):
    """Decode one batch of prompts; returns the generated token lists (EOS included if emitted). ``cost`` may be
    a list of stepping scorers with ``lam`` the list of their multipliers (several constraints: the score is
    log pi + w (r - sum_j lam_j c_j)); one scorer and one lam is the scalar decoder."""
    import torch

    costs, lams = (list(cost), [float(x) for x in lam]) if isinstance(cost, (list, tuple)) else ([cost], [lam])
    if len(costs) != len(lams):
        raise ValueError(f"{len(costs)} cost scorers but {len(lams)} multipliers")
    seqs = [encode(tokenizer, p, "", False) for p in prompts]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids, mask = pad_batch(seqs, pad, side="left")
    for m in (policy, reward, *costs):
        m.start(ids, mask)
    b = len(prompts)
    dev = policy.dev
    alive = torch.ones(b, dtype=torch.bool, device=dev)
    rows = torch.arange(b, device=dev)
    emitted, live = [], []  # per step, on the device: no host copy inside a step but the stop check
    for _ in range(s.max_new_tokens):
        top_lp, top_ids = policy.logprobs().topk(s.top_k, dim=-1)
        r = reward.candidates(top_ids).to(dev)
        penalty = lams[0] * costs[0].candidates(top_ids).to(dev)
        for lam_j, cost_j in zip(lams[1:], costs[1:], strict=True):
            penalty = penalty + lam_j * cost_j.candidates(top_ids).to(dev)
        score = top_lp + s.weight * (r - penalty)
        if s.temperature > 0:  # drawn on the host generator, so a seed means the same tokens on any device
            probs = torch.softmax(score / s.temperature, -1).cpu()
            choice = torch.multinomial(probs, 1, generator=generator).squeeze(1).to(dev)
        else:
            choice = score.argmax(-1)
        tokens = torch.where(alive, top_ids[rows, choice], torch.full_like(choice, pad))
        emitted.append(tokens)
        live.append(alive.clone())
        for m in (policy, reward, *costs):
            m.commit(tokens, choice, alive)
        if s.stop_at_eos:
            alive &= tokens != tokenizer.eos_token_id
        if not alive.any():
            break
    if not emitted:
        return [[] for _ in range(b)]
    tokens, live = torch.stack(emitted, 1).cpu(), torch.stack(live, 1).cpu()
    return [tokens[i][live[i]].tolist() for i in range(b)]


def decode(policy_model, reward_model, cost_model, tokenizer, prompts, lam, s: RGTGSettings,
           seed: int = 0, cached: bool = True, steppers=None):
    """Decode all prompts in batches; returns the generated token lists. ``cost_model`` may be a list (several
    constraints, ``lam`` the list of multipliers); ``steppers(prompts)`` may build the reward and cost
    stepping scorers itself (text scorers: :mod:`lara.decode.textstep`)."""
    import torch
    from tqdm import tqdm

    if policy_model.config.vocab_size != len(tokenizer):
        log.warning("policy vocabulary %d != tokenizer size %d", policy_model.config.vocab_size, len(tokenizer))
    if s.top_k > policy_model.config.vocab_size:
        from lara.config import ConfigError

        raise ConfigError(f"decode.rgtg.top_k: {s.top_k} candidate tokens per step exceed the policy's vocabulary "
                          f"of {policy_model.config.vocab_size}")
    gen = torch.Generator().manual_seed(seed)
    out = []
    with torch.inference_mode():
        for lo in tqdm(range(0, len(prompts), s.batch_size), desc="decoding", unit="batch", mininterval=10):
            batch = prompts[lo:lo + s.batch_size]
            if steppers is not None:
                reward, cost = steppers(batch)
            else:
                reward = make_scorer(reward_model, cached)
                cost = ([make_scorer(m, cached) for m in cost_model] if isinstance(cost_model, (list, tuple))
                        else make_scorer(cost_model, cached))
            out += decode_batch(PolicyStepper(policy_model), reward, cost, tokenizer, batch, lam, s, gen)
    return out


def load_models(method: str, policy: str, reward: str, cost, dtype: str = "float32", scorers: bool = True):
    """pi_ref's tokenizer and model, and the scorer models (value models for cdq), each of the policy's vocabulary:
    ``cost`` one model directory, or a list of them (several constraints); ``scorers`` false: none loaded (None)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    td = getattr(torch, dtype)
    scorer_cls = AutoModelForCausalLM if method == "cdq" else AutoModelForSequenceClassification
    tok = AutoTokenizer.from_pretrained(policy)
    pm = AutoModelForCausalLM.from_pretrained(policy, dtype=td).to(dev).eval()
    specs = [reward, *(cost if isinstance(cost, list) else [cost])]
    models = [scorer_cls.from_pretrained(p, dtype=td).to(dev).eval() if scorers else None for p in specs]
    for p, m in zip(specs, models, strict=True):
        if m is not None and m.config.vocab_size != pm.config.vocab_size:
            raise ValueError(f"{p}: scorer vocabulary ({m.config.vocab_size}) differs from the policy's "
                             f"({pm.config.vocab_size}): token-level decoding needs one tokenizer")
    return tok, pm, models[0], models[1:] if isinstance(cost, list) else models[1]


# ---------------------------------------------------------------------------------------------
# CLI: lara rgtg

HELP = "token-level decoding with log pi_ref + w (r - lambda c): ARGS, PARGS or CD-Q"


def add_decoder_arguments(parser) -> None:
    """The decoder a token-level step runs: its method, pi_ref and its own reward and cost scorers (also
    `lara calibrate-decoder`'s)."""
    parser.add_argument("--method", required=True, choices=METHODS)
    parser.add_argument("--policy", required=True, help="pi_ref (the SFT model)")
    parser.add_argument("--reward", required=True, help="the decoder's reward scorer (full, partial or value model)")
    parser.add_argument("--cost", required=True, help="the decoder's cost scorer (full, partial or value model)")


def add_arguments(parser) -> None:
    add_decoder_arguments(parser)
    parser.add_argument("--prompts", required=True, help="parquet with prompt_id, prompt")
    add_lambda_arguments(parser)
    add_settings_arguments(parser, RGTGSettings)
    parser.add_argument("--naive", action="store_true", help="use the uncached reference scorers")
    parser.add_argument("--out", required=True)


def run(args) -> None:
    import time

    import pandas as pd

    from lara import identity
    from lara.calibrate.record import resolve_lambda
    from lara.config import require_model
    from lara.read.files import read_table, write_table

    s = read_settings(args, METHOD_SETTINGS[args.method])
    lam = resolve_lambda(args.setting, args.overpenalised_lambda, args.lambda_json)
    df = read_table(args.prompts, required=("prompt_id", "prompt"))
    prompts = identity.prompt_set(df, f"--prompts {args.prompts}", per_prompt=1)  # each prompt once, before decoding
    for flag, spec in (("--policy", args.policy), ("--reward", args.reward), ("--cost", args.cost)):
        require_model(spec, flag)
    tok, pm, rm, cm = load_models(args.method, args.policy, args.reward, args.cost, s.dtype)
    log.info("%s decoding of %d prompts at lambda=%s (%.6g), %s", args.method, len(df), args.setting, lam, s)
    t0 = time.perf_counter()
    tokens = decode(pm, rm, cm, tok, df["prompt"].tolist(), lam, s, s.seed, cached=not args.naive)
    elapsed = time.perf_counter() - t0
    n_tok = sum(len(t) for t in tokens)
    log.info("%d tokens in %.1f s (%.1f tokens/s)", n_tok, elapsed, n_tok / max(elapsed, 1e-9))
    out = pd.DataFrame({"prompt_id": df["prompt_id"], "prompt": df["prompt"],
                        "response": [tok.decode(t, skip_special_tokens=True).strip() for t in tokens],
                        "n_tokens": [len(t) for t in tokens]})
    out["method"], out["setting"], out["lambda"] = args.method, args.setting, lam
    made = identity.decoded_identity("responses", args.out, args.method, args.setting, lam, args.lambda_json,
                                     role=identity.role_of(args.prompts), prompts=prompts.record(),
                                     made_from={"--prompts": args.prompts})
    write_table(out, args.out, {"method": args.method, "setting": args.setting, "lambda": lam,
                                "settings": s.__dict__, "seed": s.seed, identity.KEY: made})
