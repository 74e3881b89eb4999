"""Cluster LoRA adapters (CARD §1.2): one LoRA per cluster, warm-started from the K = 1 adapter.

All adapters live in one peft model and are switched with `set_adapter`, never
reloaded from disk per request. Training is plain SFT with the prompt tokens
masked; on a CPU it is budgeted in steps because it costs ~7-15 ms per token.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from contextlib import contextmanager, nullcontext
from typing import Callable, ContextManager, Sequence

import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    # peft imports bitsandbytes eagerly, which costs ~1.3 s of every start here; 4-bit loading is CUDA-only
    # (models.load_model refuses it on the CPU), so without CUDA peft is told bitsandbytes is absent.
    sys.modules.setdefault("bitsandbytes", None)

from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file
from transformers import get_cosine_schedule_with_warmup

from personalize.lm.onednn import onednn_linears
from personalize.lm.prefix import forward_rows
from personalize.methods.card.config import LoraSettings
from personalize.lm.tokens import TokenBudget, left_pad, prompt_ids, target_ids

BASE_ADAPTER = "k1c0"  # the K = 1 adapter: the task-adapted model ("TAM"/"MT-LoRA")


def adapter_name(k: int, cluster: int) -> str:
    return f"k{k}c{cluster}"


def cluster_adapter(k: int, cluster: int) -> str:
    """The LoRA a person of cluster `cluster` at K = k decodes with (K = 1's is the build's base adapter)."""
    return adapter_name(k, cluster) if k > 1 else BASE_ADAPTER


def peft_config(s: LoraSettings) -> LoraConfig:
    return LoraConfig(r=s.r, lora_alpha=s.alpha, lora_dropout=s.dropout, target_modules=list(s.targets),
                      task_type="CAUSAL_LM")


def answer_loss(model, ids, mask, labels, reduction: str = "mean", inputs_embeds=None) -> torch.Tensor:
    """Cross-entropy on the answer tokens, with the LM head run only over the answer columns
    (left padding puts every answer at the right edge; the prompt's logits are never needed). `inputs_embeds`
    instead of `ids`: states to start from (own.py's upper blocks run on their lower blocks' states)."""
    width = labels.shape[1]
    answer_cols = int((labels != -100).any(0).nonzero().min()) if (labels != -100).any() else width - 1
    keep = width - answer_cols + 1
    logits = model(input_ids=ids, inputs_embeds=inputs_embeds, attention_mask=mask, logits_to_keep=keep,
                   use_cache=False).logits[:, :-1].float()
    target = labels[:, width - keep + 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100,
                           reduction=reduction)


def rows_answer_loss(model, tok, examples: Sequence[tuple[str, str]], budget: TokenBudget,
                     reduction: str = "mean") -> torch.Tensor:
    """answer_loss of (prompt, text) pairs, their prompts' shared opening read once (lm/prefix.py; in training the
    gradient reaches the adapter through that one pass too): the same loss for ~1/3 less of the work on prompts
    that open alike (a chat template's system turn, a task's first words)."""
    prompts = [prompt_ids(tok, x, budget) for x, _ in examples]
    targets = [target_ids(tok, y, budget) for _, y in examples]
    keep = max(len(t) for t in targets) + 1  # left padding: every answer in the last columns, predicted from one before
    out, ids, _ = forward_rows(model, [p + t for p, t in zip(prompts, targets)], tok.pad_token_id,
                               limit=min(len(p) for p in prompts) - 1, logits_to_keep=keep)
    logits = out.logits[:, :-1].float()
    labels = torch.tensor([[-100] * (keep - 1 - len(t)) + t for t in targets], device=ids.device)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                           reduction=reduction)


def sft_batch(tok, examples: Sequence[tuple[str, str]], budget: TokenBudget, device):
    """Left-padded (prompt + answer) rows with labels only on the answer tokens."""
    seqs, n_prompt = [], []
    for x, y in examples:
        p = prompt_ids(tok, x, budget)
        seqs.append(p + target_ids(tok, y, budget))
        n_prompt.append(len(p))
    ids, mask = left_pad(seqs, tok.pad_token_id, device)
    labels = torch.full_like(ids, -100)
    for i, s in enumerate(seqs):
        start = ids.shape[1] - len(s) + n_prompt[i]
        labels[i, start:] = ids[i, start:]
    return ids, mask, labels


@torch.no_grad()
def sft_loss(model, tok, examples, budget: TokenBudget, batch_size: int = 16) -> float:
    """Mean answer-token cross-entropy (the held-out curve); the linear layers through oneDNN on the CPU."""
    was_training = model.training
    model.eval()
    total, n = 0.0, 0
    with onednn_linears(model):
        for i in range(0, len(examples), batch_size):
            chunk = examples[i: i + batch_size]
            total += rows_answer_loss(model, tok, chunk, budget, reduction="sum").item()
            n += sum(len(target_ids(tok, y, budget)) for _, y in chunk)
    model.train(was_training)
    return total / max(n, 1)


def train_adapter(
    model: PeftModel, tok, name: str, examples: Sequence[tuple[str, str]], steps: int,
    settings: LoraSettings, budget: TokenBudget, held_out: Sequence[tuple[str, str]] = (),
    progress: Callable[[int, int, float], None] | None = None,
    step_context: Callable[[], ContextManager] | None = None,
    layers_from: int = 0, batch_loss: Callable[[list], tuple[Callable[[], torch.Tensor], int]] | None = None,
) -> dict:
    """SFT of one adapter; returns its report (tokens trained, seconds, loss curves). `step_context`: entered
    around each step (the studio's model lock, so decodes run between the steps of a background training);
    the step puts the model in training mode and back, so a decode between steps sees it in eval mode.
    `layers_from`: only the adapter's blocks from this one on are trained; `batch_loss(batch)`: (the batch's loss
    when called, its tokens) where the examples are not (prompt, text) pairs (own.py's states)."""
    model.set_adapter(name)
    params = [p for n, p in model.named_parameters() if f".{name}." in n and "lora_" in n
              and (not layers_from or int(n.split(".layers.")[1].split(".")[0]) >= layers_from)]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    # warm-up over a tenth of the steps, none below ten: a warm-up step 0 has lr 0 and trains nothing, which is a
    # whole step of a short budget (the demo's cluster adapters)
    sched = get_cosine_schedule_with_warmup(opt, steps // 10, max(steps, 1))
    rng = random.Random(settings.seed)
    order: list[int] = []
    curve, losses, tokens, t0 = [], [], 0, time.perf_counter()
    held = list(held_out)[:32]
    if held:
        curve.append((0, sft_loss(model, tok, held, budget)))
    for step in range(1, steps + 1):
        if len(order) < settings.batch_size:
            more = list(range(len(examples)))
            rng.shuffle(more)
            order += more
        batch = [examples[order.pop()] for _ in range(min(settings.batch_size, len(examples)))]
        if batch_loss is None:
            run = lambda: rows_answer_loss(model, tok, batch, budget)  # noqa: E731 (run inside the step's context)
            n_tokens = sum(len(prompt_ids(tok, x, budget)) + len(target_ids(tok, y, budget)) for x, y in batch)
        else:
            run, n_tokens = batch_loss(batch)
        with step_context() if step_context else nullcontext():
            for p in params:  # a switch of adapters between steps (inference mode) froze them
                p.requires_grad_(True)
            model.train()
            loss = run()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step(), sched.step(), opt.zero_grad(set_to_none=True)
            model.eval()
        tokens += n_tokens
        losses.append(loss.item())
        if progress:
            progress(step, steps, loss.item())
        if held and (step % settings.eval_every == 0 or step == steps):
            with step_context() if step_context else nullcontext():
                curve.append((step, sft_loss(model, tok, held, budget)))
    model.eval()
    for p in params:
        p.requires_grad_(False)
    return {"adapter": name, "steps": steps, "examples": len(examples), "tokens": tokens,
            "seconds": round(time.perf_counter() - t0, 2), "held_out_loss": curve, "loss": losses}


# ---------------------------------------------------------------- upper blocks over lower states

class _Reached(Exception):
    """Raised by lower_states' hook once the states entering its block are in hand: the blocks above never run."""


def blocks(model) -> torch.nn.ModuleList:
    """The decoder blocks of a peft-wrapped causal LM (Llama-like: `.model.layers`)."""
    return model.get_base_model().model.layers


def lower_states(model, tok, examples: Sequence[tuple[str, str]], budget: TokenBudget, first: int,
                 batch_size: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each (prompt, text)'s states entering block `first` under the active adapter, unpadded, with its labels
    (the answer's tokens; -100 on the prompt): the frozen lower blocks' work, done once for every step. Only the
    blocks below `first` run (a hook stops the pass there)."""
    got: list[torch.Tensor] = []

    def reach(_module, args, kwargs):
        got.append(args[0] if args else kwargs["hidden_states"])
        raise _Reached

    out = []
    handle = blocks(model)[first].register_forward_pre_hook(reach, with_kwargs=True)
    try:
        with torch.no_grad():
            for j in range(0, len(examples), batch_size):
                ids, mask, labels = sft_batch(tok, examples[j: j + batch_size], budget, model.device)
                got.clear()
                try:
                    model(input_ids=ids, attention_mask=mask, use_cache=False)
                except _Reached:
                    pass
                hidden = got[0]
                for i, n in enumerate(mask.sum(1).tolist()):  # a row's own n tokens: its last n columns
                    out.append((hidden[i, ids.shape[1] - n:].clone(), labels[i, ids.shape[1] - n:].cpu().clone()))
    finally:
        handle.remove()
    return out


def pad_states(rows, device):
    """Left-padded states, mask and labels of some `lower_states` rows (as sft_batch pads ids)."""
    n = max(len(l) for _, l in rows)
    width = rows[0][0].shape[-1]
    h = torch.zeros(len(rows), n, width, dtype=rows[0][0].dtype, device=device)
    mask = torch.zeros(len(rows), n, dtype=torch.long, device=device)
    labels = torch.full((len(rows), n), -100, dtype=torch.long, device=device)
    for i, (s, l) in enumerate(rows):
        h[i, n - len(l):], mask[i, n - len(l):], labels[i, n - len(l):] = s, 1, l
    return h, mask, labels


@contextmanager
def upper_only(model, first: int):
    """The model runs only its blocks from `first` on (inputs_embeds are the states entering block `first`)."""
    inner = model.get_base_model().model
    full = inner.layers
    inner.layers = torch.nn.ModuleList(list(full)[first:])
    try:
        yield
    finally:
        inner.layers = full


class LowerStates:
    """The lower blocks' states of (prompt, text) pairs, each computed once, alone (no padding: the same values
    whichever batch asks first, here or on a Ray worker) and kept. A cluster adapter starts as a copy of the K = 1
    adapter and, with `LoraSettings.cluster_layers`, trains only its upper blocks: its lower blocks stay the K = 1
    adapter's, so every cluster adapter reads the same lower states and the build computes each text's once."""

    def __init__(self, model, tok, budget: TokenBudget, first: int):
        self.model, self.tok, self.budget, self.first = model, tok, budget, first
        self._rows: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def for_settings(cls, model, tok, settings: LoraSettings, budget: TokenBudget) -> "LowerStates | None":
        """The cache where `settings.cluster_layers` leaves lower blocks frozen, else None (every block trains)."""
        first = len(blocks(model)) - settings.cluster_layers
        return cls(model, tok, budget, first) if settings.cluster_layers and first > 0 else None

    def __len__(self) -> int:
        return len(self._rows)

    def batch_loss(self, batch: Sequence[tuple[str, str]]) -> tuple[Callable[[], torch.Tensor], int]:
        """train_adapter's `batch_loss`: the batch's answer loss over the upper blocks, and its tokens."""
        for ex in batch:
            if ex not in self._rows:
                self._rows[ex] = lower_states(self.model, self.tok, [ex], self.budget, self.first, batch_size=1)[0]
        h, mask, labels = pad_states([self._rows[ex] for ex in batch], self.model.device)

        def run():  # the upper blocks for this step alone: the held-out curve reads the whole model
            with upper_only(self.model, self.first):
                return answer_loss(self.model, None, mask, labels, inputs_embeds=h)
        return run, int(mask.sum())

    def train(self, name: str, examples: Sequence[tuple[str, str]], steps: int, settings: LoraSettings,
              held_out: Sequence[tuple[str, str]] = (), progress=None) -> dict:
        """train_adapter on adapter `name`'s upper blocks over these states (the held-out curve on the whole model)."""
        report = train_adapter(self.model, self.tok, name, list(examples), steps, settings, self.budget, held_out,
                               progress=progress, layers_from=self.first, batch_loss=self.batch_loss)
        return report | {"layers_from": self.first}


def new_peft_model(base_model, settings: LoraSettings) -> PeftModel:
    model = get_peft_model(base_model, peft_config(settings), adapter_name=BASE_ADAPTER)
    model.eval()
    return model


def add_warm_adapter(model: PeftModel, name: str, settings: LoraSettings, source: str = BASE_ADAPTER) -> None:
    """A new adapter that starts from `source`'s weights (clusters start from the K = 1 adapter)."""
    put_adapter(model, name, settings, get_peft_model_state_dict(model, adapter_name=source))


def put_adapter(model: PeftModel, name: str, settings: LoraSettings, state: dict) -> None:
    """A new adapter `name` with the weights `state` (adapter_state's form), frozen, the model in eval mode."""
    model.add_adapter(name, peft_config(settings))
    set_peft_model_state_dict(model, state, adapter_name=name)
    for p in model.parameters():  # peft marks a new adapter trainable; train_adapter unfreezes its own
        p.requires_grad_(False)
    model.eval()  # a new adapter's dropout starts in training mode


def adapter_state(model: PeftModel, name: str) -> dict:
    """An adapter's weights, copied to the CPU: what travels between processes (put_adapter takes it back)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in get_peft_model_state_dict(model, adapter_name=name).items()}


@dataclass(frozen=True)
class ClusterJob:
    """One cluster adapter's training, whole: its name, its members' (prompt, text) pairs and its held-out ones.
    Nothing in it depends on another cluster's, so jobs run in any order, or in other processes."""

    name: str
    examples: tuple[tuple[str, str], ...]
    held_out: tuple[tuple[str, str], ...] = ()


def train_cluster_adapter(model: PeftModel, tok, job: ClusterJob, settings: LoraSettings, budget: TokenBudget,
                          progress: Callable[[int, int, float], None] | None = None,
                          states: LowerStates | None = None) -> dict:
    """job.name, warm-started from the K = 1 adapter and trained for settings.cluster_steps, under a random stream
    of its own (dropout; seeded by settings.seed and the name, the caller's stream left as it was): the adapter comes
    out the same after others, alone, or in another process (build on Ray). With `settings.cluster_layers`, its upper
    blocks over `states` (the build's, shared by every cluster adapter; a new cache where none is given)."""
    add_warm_adapter(model, job.name, settings)
    if states is None:  # (an empty cache is falsy: `or` would drop the build's)
        states = LowerStates.for_settings(model, tok, settings, budget)
    with torch.random.fork_rng():
        torch.manual_seed(settings.seed * 1_000_003 + zlib.crc32(job.name.encode()))
        if states is not None:
            return states.train(job.name, job.examples, settings.cluster_steps, settings, job.held_out, progress)
        return train_adapter(model, tok, job.name, job.examples, settings.cluster_steps, settings, budget,
                             job.held_out, progress=progress)


def load_adapters(base_model, folder: Path, names: Sequence[str]) -> PeftModel:
    """Every adapter loaded once into one peft model; switching is then in memory. The first through peft,
    the others by add_adapters."""
    model = PeftModel.from_pretrained(base_model, str(_adapter_path(folder, names[0])), adapter_name=names[0])
    add_adapters(model, folder, names[1:])
    return model


def add_adapters(model: PeftModel, folder: Path, names: Sequence[str]) -> None:
    """Adapters added to a loaded peft model. Those with its first adapter's structure (targets, rank,
    alpha: a build's cluster adapters do) in one pass: their LoRA modules added to the existing LoRA layers
    and all their weights read by one load_state_dict (peft's load_adapter walks the whole model per
    adapter: ~0.7 s each here)."""
    folder = Path(folder)
    first_name = next(iter(model.peft_config))
    first = model.peft_config[first_name]
    layers = [(key, m) for key, m in model.named_modules() if isinstance(m, LoraLayer) and first_name in m.lora_A]
    state = {}
    for n in names:
        cfg = LoraConfig.from_pretrained(str(_adapter_path(folder, n)))
        if _structure(cfg) != _structure(first):
            model.load_adapter(str(_adapter_path(folder, n)), adapter_name=n)  # another shape: peft's own way
            continue
        cfg.inference_mode = True
        model.peft_config[n] = cfg
        fresh = dataclasses.replace(cfg, init_lora_weights=False)  # the weights are read below
        for key, m in layers:
            m.update_layer(n, cfg.r, lora_alpha=cfg.lora_alpha, target_name=key, config=fresh)
        for k, v in load_file(str(_adapter_path(folder, n) / "adapter_model.safetensors")).items():
            state[k.replace(".lora_A.weight", f".lora_A.{n}.weight").replace(".lora_B.weight", f".lora_B.{n}.weight")] = v
    if state:
        missing, unexpected = model.load_state_dict(state, strict=False)
        ours = [k for k in missing if any(f".{n}." in k for n in names)]
        if ours or unexpected:
            raise ValueError(f"adapters in {folder} do not fit the model: missing {ours[:3]}, unexpected "
                             f"{list(unexpected)[:3]}")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)


def _adapter_path(folder: Path, name: str) -> Path:
    """peft saves the default-named adapter at the root and the others in subfolders."""
    folder = Path(folder)
    return folder / name if (folder / name / "adapter_config.json").exists() else folder


def _structure(cfg: LoraConfig) -> tuple:
    return (sorted(cfg.target_modules or []), cfg.r, cfg.lora_alpha, cfg.lora_dropout, cfg.use_rslora,
            cfg.use_dora, dict(cfg.rank_pattern or {}), dict(cfg.alpha_pattern or {}), cfg.bias)


def lora_bytes(model: PeftModel, name: str) -> int:
    return sum(t.numel() * t.element_size() for t in get_peft_model_state_dict(model, adapter_name=name).values())

