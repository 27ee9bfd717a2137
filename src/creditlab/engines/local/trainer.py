"""The local GRPO/DAPO trainer: one file, read top to bottom.

One RL step:
  1. pick prompts (a pure function of seed and step, so a resumed run sees the same prompts);
  2. sample G rollouts per prompt with the KV-cache sampler; score them (reward workers);
     dynamic sampling (optional) keeps groups whose rewards differ and samples more prompts
     until the batch is full; overlong shaping penalises responses near the length budget;
     reward-balanced batching (optional, Paper C) parks the groups in a buffer and trains on a batch
     with enough positive and negative rollouts, generating more rounds of prompts until one exists
     (``algos.batching.rb_draw``, as the verl engine does: every step updates);
  3. advantages (registered function, e.g. GRPO);
  4. ONE no-grad forward gives old log-probs, entropy and final hidden states h_t; with LoRA
     (``trainer.lora.enable``) and a credit function that takes ``ref_logp`` or ``base_hidden``, ONE
     more no-grad forward with the adapter disabled (the reference pass) gives both;
  5. credit functions (registered; they may use p, h_t, entropy, the reference pass) multiply the
     advantage per token; token filters (registered) restrict which tokens enter the loss (and its
     token-mean normaliser); the weights' Gini and EffN/T are logged (Paper D);
  6. PPO epochs over mini-batches (a registered batching: shuffled, query-preserved, ...) with the
     registered policy loss; AdamW, schedule, grad clip;
  7. log metrics; every ``checkpoint_every`` steps save model + optimizer + scheduler + RNG state.

LoRA (Paper D, ``engines/local/lora.py``): the model is wrapped with a peft adapter in place, only the
adapter trains (the optimizer sees only it), rollouts are decoded with the adapter merged into the
weights (``merge_for_sampling``), and :meth:`Trainer.export_model` gives the merged plain model that
``creditlab train`` saves for evaluation.

All randomness is derived from (seed, step), and checkpoints hold the full optimizer state, so a run
killed at any point and restarted produces the same final model as an uninterrupted one.
The trainer knows nothing about MLflow: it calls ``log_fn(metrics, step)``.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import json
import math
import os
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from creditlab.algos import registry
from creditlab.algos.batching import (
    RewardBalancedBuffer,
    call_batching,
    groups_split_frac,
    rb_draw,
    rb_sign_values,
    sign_counts,
)
from creditlab.algos.cancellation import cancellation_residual
from creditlab.algos.compat import check_method
from creditlab.algos.credit.arca import adapter_residual_norm, gini, weight_diagnostics
from creditlab.algos.credit.base import (
    REF_INPUTS,
    CreditInputs,
    TokenCredit,
    compose_credit,
    credit_inputs_of,
    method_entries,
)
from creditlab.algos.shaping import overlong_penalty
from creditlab.data.schema import render_record_prompt
from creditlab.engines.local import lora
from creditlab.lm.batch import chunked_response_forward, pack
from creditlab.lm.sampler import SamplingParams, generate
from creditlab.progress import progress
from creditlab.seeds import step_seed

LogFn = Callable[[dict[str, float], int], None]


@dataclass
class Rollouts:
    """A scored rollout batch: ``prompts[i]``/``responses[i]`` token ids, reward, group id."""

    prompts: list[list[int]]
    responses: list[list[int]]
    finished: list[bool]
    scores: list[float]  # raw reward function output (correctness)
    rewards: list[float]  # after overlong shaping: what the advantage sees
    group_ids: list[int]
    golds: list[str] = field(default_factory=list)  # gold answer of each rollout's prompt


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def lr_lambda(step: int, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the peak learning rate: linear warm-up, then constant or cosine to 10%."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    raise ValueError(f"unknown lr_schedule {schedule!r}; valid choices: ['constant', 'cosine']")


class Trainer:
    """GRPO/DAPO RL of a causal LM on verifiable prompts (tiny scale, CPU or one GPU).

    With ``trainer.lora.enable`` the ``model`` passed in is modified in place (peft injects its LoRA
    layers); ``self.model`` stays that plain causal LM and ``self.peft`` is the PeftModel around it.
    """

    def __init__(
        self,
        cfg: dict[str, Any],
        model,
        tokenizer,
        train_records: list[dict],
        scorer,
        ckpt_dir: Path,
        log_fn: LogFn | None = None,
        progress: bool = True,
        prompt_ids: list[list[int]] | None = None,
        stop_ids: int | list[int] | None = None,
    ):
        """prompt_ids: the token ids of ``train_records``' prompts (None: rendered with the data template, the
        tokenizer adding BOS, as the tiny models are trained); stop_ids: where a rollout ends (None: the tokenizer's
        EOS). The post-hoc analyses of hub-model runs pass both (creditlab.models.sources: chat-template prompts and
        the checkpoint's stop tokens, as verl rolled out)."""
        self.cfg, self.tcfg, self.mcfg = cfg, cfg["trainer"], cfg["method"]
        self.device = _device(cfg.get("device", "auto"))
        self.lcfg = self.tcfg.get("lora") or {"enable": False}
        # LoRA: adapter init seeded by the run's seed alone (a resumed run rebuilds the same module)
        self.peft = lora.wrap_lora(model, self.lcfg, step_seed(cfg["seed"], 0, 30_000)) if self.lcfg["enable"] else None
        self.model = model.to(self.device)
        self.model.train()
        self.tok = tokenizer
        self.records = train_records
        self.scorer = scorer
        self.ckpt_dir = Path(ckpt_dir)
        self.log_fn = log_fn or (lambda m, s: None)
        self.progress = progress
        template = cfg["data"].get("template", "tiny")
        self.prompt_ids = (
            prompt_ids
            if prompt_ids is not None
            else [tokenizer(render_record_prompt(r, template))["input_ids"] for r in train_records]
        )
        if len(self.prompt_ids) != len(train_records):
            raise ValueError(f"{len(self.prompt_ids)} prompts for {len(train_records)} records")
        self.stop_ids = tokenizer.eos_token_id if stop_ids is None else stop_ids
        t = self.tcfg
        self.params = lora.trainable_parameters(self.model)  # all of them without LoRA; the adapter's with it
        self.opt = torch.optim.AdamW(self.params, lr=t["lr"], betas=tuple(t["betas"]), weight_decay=t["weight_decay"])
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: lr_lambda(s, t["lr_warmup_steps"], t["steps"], t["lr_schedule"])
        )
        self.advantage_fn = registry.get("advantage", self.mcfg["advantage"])
        self.loss_fn = registry.get("policy_loss", self.mcfg["policy_loss"])
        self.batching_fn = registry.get("batching", t["batching"])
        self.loss_takes_groups = "group_ids" in inspect.signature(self.loss_fn).parameters
        self.loss_takes_tokens = "responses" in inspect.signature(self.loss_fn).parameters  # GRPO-fix: token ids
        self.credit_fns = method_entries("credit", self.mcfg.get("credit"))
        self.token_filters = method_entries("token_filter", self.mcfg.get("token_filter"))
        check_method(self.mcfg, t)  # the methods compose (IllDefinedComposition, a ValueError, with the reason)
        self.chunk_tokens = int(t.get("forward_chunk_tokens", 0))  # padded positions per length-sorted forward chunk
        self.random_control = bool(self.lcfg.get("random_control")) and self.peft is not None
        # credit/filter settings that name `topk` get the top-K next-token distributions of the old forward
        self.topk = max([int(kw.get("topk") or 0) for _, kw in self.credit_fns + self.token_filters] + [0])
        vocab = self.model.get_output_embeddings().weight.shape[0]
        # mean credit weight per token id over every valid generated token (DelTA's token clouds)
        self.token_credit = TokenCredit(vocab)
        rb = t.get("reward_balance") or {}
        # reward-balanced batching (Paper C): groups wait in a buffer until a sign-balanced batch exists
        self.rb_buffer = (
            RewardBalancedBuffer(t["prompts_per_step"], rb["rho"], rb["max_age"]) if rb.get("enable") else None
        )
        self.rb_round = 0  # generation rounds so far (RB ages count rounds)
        self.step = 0
        self._t_reward = 0.0
        self.history: list[dict[str, float]] = []

    # ----------------------------------------------------------------------------- checkpoints
    @property
    def _ckpt_path(self) -> Path:
        return self.ckpt_dir / "state.pt"

    def save_checkpoint(self) -> None:
        """Atomically write model, optimizer, scheduler, RNG states, step and metric history."""
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "history": self.history,
            "token_credit": self.token_credit.sums,
            "rb_buffer": None if self.rb_buffer is None else self.rb_buffer.state_dict(),
            "rb_round": self.rb_round,
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        }
        tmp = self._ckpt_path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self._ckpt_path)

    def maybe_resume(self) -> bool:
        """Restore the latest checkpoint if there is one; returns whether it did."""
        if not self._ckpt_path.exists():
            return False
        state = torch.load(self._ckpt_path, map_location=self.device, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.step, self.history = state["step"], state["history"]
        self.token_credit.sums = state.get("token_credit", self.token_credit.sums)
        if self.rb_buffer is not None and state.get("rb_buffer") is not None:
            self.rb_buffer.load_state_dict(state["rb_buffer"])
        self.rb_round = int(state.get("rb_round", 0))
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])
        return True

    # ----------------------------------------------------------------------------- export
    def export_model(self):
        """The trained model as a plain ``transformers`` model: ``self.model`` itself without LoRA, else a
        merged copy (W + scale * B A; the trainer's model is left as it is). What ``creditlab train``
        saves as ``final/``, so evaluation reads every run the same way."""
        return self.model if self.peft is None else lora.merged_copy(self.peft)

    def save_adapter(self, out_dir: Path) -> bool:
        """With LoRA, save the adapter alone (peft ``save_pretrained``) under ``out_dir``; returns whether it did."""
        if self.peft is None:
            return False
        lora.save_adapter(self.peft, out_dir)
        return True

    # ----------------------------------------------------------------------------- rollouts
    def _sample_prompts(self, step: int, gen_idx: int) -> list[int]:
        rng = np.random.default_rng([self.cfg["seed"], step, gen_idx])
        return rng.choice(len(self.records), size=self.tcfg["prompts_per_step"], replace=False).tolist()

    def _rollout_once(self, step: int, gen_idx: int) -> Rollouts:
        t, G = self.tcfg, self.tcfg["group_size"]
        idx = self._sample_prompts(step, gen_idx)
        prompts = [self.prompt_ids[i] for i in idx for _ in range(G)]
        self.model.eval()
        merge = self.peft is not None and self.lcfg.get("merge_for_sampling", False)
        with torch.no_grad(), _autocast(self.device), lora.merged_for_sampling(self.peft) if merge else nullcontext():
            params = SamplingParams(
                max_new_tokens=t["max_new_tokens"],
                eos_id=self.stop_ids,
                temperature=t["temperature"],
                top_p=t["top_p"],
                seed=step_seed(self.cfg["seed"], step, gen_idx),
            )
            gen = generate(self.model, prompts, params)
        self.model.train()
        texts = self.tok.batch_decode(gen.response_ids, skip_special_tokens=True)
        golds = [self.records[i]["answer"] for i in idx for _ in range(G)]
        t0 = time.perf_counter()
        scores = self.scorer.score(texts, golds)
        self._t_reward += time.perf_counter() - t0
        rewards = list(scores)
        ol = t["overlong"]
        if ol["enable"]:
            rewards = [
                r + overlong_penalty(len(resp), t["max_new_tokens"], ol["buffer"], ol["penalty"])
                for r, resp in zip(rewards, gen.response_ids)
            ]
        group_ids = [gen_idx * len(self.records) + i for i in idx for _ in range(G)]
        return Rollouts(prompts, gen.response_ids, gen.finished, scores, rewards, group_ids, golds)

    def collect(self, step: int) -> tuple[Rollouts, dict[str, float]]:
        """Rollouts of one step; with dynamic sampling, only groups whose scores differ, topped up.

        ``train_reward_mean`` is the mean score of every rollout generated this step (before any
        filtering): the honest training-reward curve.
        """
        t, G = self.tcfg, self.tcfg["group_size"]
        batch = self._rollout_once(step, 0)
        all_scores = list(batch.scores)
        info = {"groups_informative_frac": _informative_frac(batch.scores, G)}
        if not t["dynamic_sampling"]:
            return batch, info | {"n_gen_batches": 1.0, "train_reward_mean": float(np.mean(all_scores))}
        kept, gen_idx = _Filtered(), 0
        while True:
            kept.add_informative(batch, G)
            gen_idx += 1
            if kept.n_groups(G) >= t["prompts_per_step"] or gen_idx >= t["max_gen_batches"]:
                break
            batch = self._rollout_once(step, gen_idx)
            all_scores += batch.scores
        out = kept.take(t["prompts_per_step"] * G)
        return out, info | {
            "n_gen_batches": float(gen_idx),
            "ds_groups_kept": len(out.rewards) / G,
            "train_reward_mean": float(np.mean(all_scores)),
        }

    # ----------------------------------------------------------------------------- one step
    def train_step(self, step: int) -> dict[str, float]:
        t0, self._t_reward = time.perf_counter(), 0.0
        ro, info = self.collect(step)
        t_gen = time.perf_counter() - t0 - self._t_reward
        metrics: dict[str, float] = {"step": step}
        metrics.update({k: v for k, v in info.items() if k != "train_reward_mean"})
        lens = [len(r) for r in ro.responses]
        metrics.update(
            reward_mean=info["train_reward_mean"],
            reward_batch_mean=float(np.mean(ro.scores)) if ro.scores else float("nan"),
            reward_shaped_mean=float(np.mean(ro.rewards)) if ro.rewards else float("nan"),
            response_len_mean=float(np.mean(lens)) if lens else float("nan"),
            truncated_frac=float(np.mean([not f for f in ro.finished])) if ro.finished else float("nan"),
        )
        if self.rb_buffer is not None:  # reward-balanced batching: train on a balanced batch of the buffer
            ro, rb_stats = self._reward_balance(step, ro)
            metrics.update(rb_stats)
        if ro is None or not ro.responses:  # nothing to train on (dynamic sampling kept no group): no update
            return metrics | {"t_step": time.perf_counter() - t0, "skipped": 1.0}
        metrics.update(self.learn(step, ro))
        metrics.update(t_gen=t_gen, t_reward=self._t_reward, t_step=time.perf_counter() - t0)
        return metrics

    def learn(
        self, step: int, ro: Rollouts, adv_transform: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> dict[str, float]:
        """Steps 3-6 on a scored rollout batch: advantages, the old forward, credit, the PPO update.

        ``adv_transform`` (Tensor[B] -> Tensor[B]) rewrites the sequence advantages before anything uses
        them: the polarity probes of Paper C (positive-only, negative-only, shuffled) train through it.
        """
        t, m = self.tcfg, self.mcfg
        metrics: dict[str, float] = {}
        batch = pack(ro.prompts, ro.responses, self.tok.pad_token_id)
        rewards = torch.tensor(ro.rewards, dtype=torch.float32)
        group_ids = torch.tensor(ro.group_ids, dtype=torch.long)
        adv = self.advantage_fn(rewards, group_ids, **(m.get("advantage_kwargs") or {}))
        if adv_transform is not None:
            adv = adv_transform(adv)

        t1 = time.perf_counter()
        wanted = {n for fn, _ in self.credit_fns + self.token_filters for n in credit_inputs_of(fn)}
        # the reference pass (adapter disabled) runs when a credit function takes its outputs, the random-
        # adapter control needs h^base, or trainer.lora.reference_pass=always; ONE forward gives ref log-probs
        # AND h^base
        need_ref = (
            bool(wanted & REF_INPUTS)
            or self.random_control
            or (self.peft is not None and self.lcfg.get("reference_pass", "when_needed") == "always")
        )
        need_hidden = "hidden" in wanted or need_ref  # h^adapted: ARCA's residual is taken against it
        self.model.eval()  # the no-grad forwards are deterministic (no LoRA dropout)
        with torch.no_grad(), _autocast(self.device):
            old = chunked_response_forward(
                self.model, batch, self.chunk_tokens, with_entropy=True, with_hidden=need_hidden, topk=self.topk
            )
        mask = batch.response_mask.to(self.device)
        t_fwd = time.perf_counter() - t1
        ref, t_ref = None, 0.0
        if need_ref:
            t_r = time.perf_counter()
            with torch.no_grad(), _autocast(self.device), self.peft.disable_adapter():
                ref = chunked_response_forward(self.model, batch, self.chunk_tokens, with_hidden=True)
            t_ref = time.perf_counter() - t_r
        rand_hidden = None
        if self.random_control:  # [ours] h_t under a random adapter of the trained one's per-module norm
            t_r = time.perf_counter()
            g = torch.Generator().manual_seed(step_seed(self.cfg["seed"], step, 30_001))
            with torch.no_grad(), _autocast(self.device), lora.random_adapter(self.peft, g):
                rand_hidden = lora.hidden_of(self.model, batch)
            metrics["t_random_control"] = time.perf_counter() - t_r
        self.model.train()

        t_c = time.perf_counter()
        inputs = CreditInputs(
            responses=batch.responses.to(self.device),
            mask=mask,
            old_logp=old.logp,
            advantages=adv.to(self.device),
            group_ids=group_ids.to(self.device),
            hidden=old.hidden,
            entropy=old.entropy,
            topk_logp=old.topk_logp,
            topk_ids=old.topk_ids,
            lm_head=self.model.get_output_embeddings().weight.detach(),
            rng=torch.Generator().manual_seed(step_seed(self.cfg["seed"], step, 20_000)),
            ref_logp=None if ref is None else ref.logp,
            base_hidden=None if ref is None else ref.hidden,
        )
        weights = compose_credit(self.credit_fns, inputs)
        adv_tok = (adv.to(self.device)[:, None] * weights).detach()
        loss_mask = mask * compose_credit(self.token_filters, inputs)
        t_credit = time.perf_counter() - t_c
        self.token_credit.add(batch.responses, mask, weights)
        # Paper D's concentration diagnostics of the per-token weights (before the advantage; Gini and EffN/T
        # are per-row scale free, so mean-1 and sum-1 weights read the same); with a reference pass, the
        # adapter residual ||h_t - h_t^base|| (ARCA's salience): mean / max, and its Gini against the random
        # adapter's (the control)
        t_d = time.perf_counter()
        residual = None if ref is None else adapter_residual_norm(old.hidden, ref.hidden)  # [B, T]
        metrics.update(weight_diagnostics(weights.detach(), mask, residual))
        if ref is not None:  # drift from the base model: k1 estimate of KL(pi || pi_ref) on the sampled tokens
            metrics["ref_kl"] = ((old.logp - ref.logp) * mask).sum().item() / max(1.0, mask.sum().item())
        if rand_hidden is not None:
            metrics["arca_residual_gini"] = _mean_row_gini(residual, mask)
            metrics["random_residual_gini"] = _mean_row_gini(adapter_residual_norm(rand_hidden, ref.hidden), mask)
        t_diag = time.perf_counter() - t_d

        t2 = time.perf_counter()
        gen = torch.Generator().manual_seed(step_seed(self.cfg["seed"], step, 10_000))
        stats: list[dict[str, float]] = []
        loss_kwargs = dict(m.get("loss_kwargs") or {})
        lengths, n_ranks = mask.sum(-1).long().cpu(), int(t.get("dp_ranks", 1))
        seq_lengths = lengths + torch.tensor([len(p) for p in ro.prompts], dtype=torch.long)
        split: list[float] = []
        for _ in range(t["ppo_epochs"]):
            minibatches = call_batching(
                self.batching_fn,
                group_ids,
                t["mini_batches"],
                gen,
                lengths=lengths,
                seq_lengths=seq_lengths,
                advantages=adv,
                n_ranks=n_ranks,
            )
            split.append(groups_split_frac(minibatches, group_ids))
            for idx in minibatches:
                mb = batch.select(idx)
                T = mb.response_len
                if self.loss_takes_groups:  # group-coupled losses (GRPO-fix, DFPO) see whole groups only
                    _check_whole_groups(group_ids[idx], group_ids, self.mcfg["policy_loss"], t["batching"])
                    loss_kwargs["group_ids"] = group_ids[idx].to(self.device)
                if self.loss_takes_tokens:
                    loss_kwargs["responses"] = mb.responses.to(self.device)
                with _autocast(self.device):
                    new = chunked_response_forward(self.model, mb, self.chunk_tokens)
                args = (old.logp[idx, :T], adv_tok[idx, :T], loss_mask[idx, :T])
                loss, st = self.loss_fn(new.logp, *args, **loss_kwargs)
                new.logp.retain_grad()  # d loss / d logp_{i,t}, read off the one backward below
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                # cancellation diagnostic (Paper E): do the per-token gradients of tokens shared within a group cancel?
                res = cancellation_residual(
                    new.logp.grad, mb.responses.to(self.device), args[2], group_ids[idx].to(self.device)
                )
                st = st | {"cancel_rel_residual": res["rel_residual"], "cancel_group_coef_rel": res["group_coef_rel"]}
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, t["grad_clip"])
                self.opt.step()
                stats.append(st | {"loss": loss.item(), "grad_norm": float(grad_norm)})
        self.sched.step()
        t_update = time.perf_counter() - t2

        tok_mask = mask.bool()
        metrics.update({k: _nanmean([s[k] for s in stats]) for k in stats[0]})
        correct = torch.tensor([sc > 0 for sc in ro.scores], device=self.device)
        if correct.any():  # solution-probability drift: mean log-prob per token of the correct rollouts
            per_seq = (old.logp * mask).sum(-1) / mask.sum(-1).clamp(min=1)
            metrics["solution_logp_mean"] = per_seq[correct].mean().item()
        metrics.update(
            entropy_mean=old.entropy[tok_mask].mean().item(),
            adv_abs_mean=adv.abs().mean().item(),
            credit_weight_mean=weights[tok_mask].mean().item(),
            credit_weight_std=weights[tok_mask].std().item() if tok_mask.sum() > 1 else 0.0,
            loss_token_frac=(loss_mask.sum() / mask.sum().clamp(min=1)).item(),
            groups_split_frac=float(np.mean(split)),
            lr=self.sched.get_last_lr()[0],
            t_old_forward=t_fwd,
            t_ref_forward=t_ref,
            t_credit=t_credit,
            t_diagnostics=t_diag,
            t_update=t_update,
        )
        return metrics

    def snapshot(self) -> dict[str, Any]:
        """A deep copy of everything an update changes (model, optimizer, scheduler): restore() it to
        run several updates from the same state (Paper C's probes)."""
        return copy.deepcopy(
            {"model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict()}
        )

    def restore(self, snap: dict[str, Any]) -> None:
        self.model.load_state_dict(snap["model"])
        self.opt.load_state_dict(snap["optimizer"])
        self.sched.load_state_dict(snap["scheduler"])

    def _reward_balance(self, step: int, ro: Rollouts) -> tuple[Rollouts, dict[str, float]]:
        """The step's update batch under RB (``rb_draw``): this step's groups join the buffer; while no balanced
        batch can be selected, one more round of prompts is generated (same policy) and joins it. Returns the
        batch (groups renumbered 0..n-1) and the buffer's statistics."""
        rb = self.tcfg["reward_balance"]
        kwargs = self.mcfg.get("advantage_kwargs") or {}
        pending = [ro]

        def admit(rnd: int) -> None:
            new = pending.pop()
            gids = torch.tensor(new.group_ids, dtype=torch.long)
            values, thr = rb_sign_values(
                rb["sign"],
                torch.tensor(new.rewards, dtype=torch.float32),
                torch.tensor(new.scores, dtype=torch.float32),
                gids,
                lambda r, g: self.advantage_fn(r, g, **kwargs),
                rb["reward_threshold"],
            )
            for g, (n_pos, n_neg, size) in sign_counts(values, gids, thr).items():
                rows = [i for i, x in enumerate(new.group_ids) if x == g]
                self.rb_buffer.add(_subset(new, rows), n_pos, n_neg, size, rnd)

        rounds = itertools.count(int(self.tcfg["max_gen_batches"]))  # generation indices past collect()'s

        def refill() -> None:  # one more round of prompts, same policy
            pending.append(self._rollout_once(step, next(rounds)))

        chosen, stats, self.rb_round = rb_draw(
            self.rb_buffer,
            self.rb_round,
            admit=admit,
            refill=refill,
            max_rounds=int(rb.get("max_rounds", 4)),
            on_exhausted=rb.get("on_exhausted", "train_unbalanced"),
        )
        for k, part in enumerate(chosen):  # groups of different steps may share a prompt: renumber
            part.group_ids = [k] * len(part.group_ids)
        fields = Rollouts.__dataclass_fields__
        return Rollouts(**{f: [x for p in chosen for x in getattr(p, f)] for f in fields}), stats

    def token_credit_table(self, decode: Callable[[int], str]) -> dict[str, Any]:
        """Mean credit weight per generated token (token_credit.json): DelTA's token clouds (Figure 4)."""
        return self.token_credit.table(decode, self.step)

    # ----------------------------------------------------------------------------- loop
    def fit(self, until: int | None = None) -> list[dict[str, float]]:
        """Run (or resume) until ``trainer.steps``, or until step ``until`` (an analysis replaying a run to a
        mid-training state: `creditlab.jobs.analyze.mid_training_state`); returns the per-step metric history."""
        t = self.tcfg
        end = t["steps"] if until is None else min(int(until), t["steps"])
        bar = progress(end, "rl steps", initial=self.step, enabled=self.progress)
        while self.step < end:
            metrics = self.train_step(self.step)
            self.history.append(metrics)
            self.log_fn(metrics, self.step)
            self.step += 1
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", len=f"{metrics['response_len_mean']:.1f}")
            if self.step % t["checkpoint_every"] == 0 or self.step == t["steps"]:
                self.save_checkpoint()
        bar.close()
        return self.history


def _check_whole_groups(mb_groups: torch.Tensor, all_groups: torch.Tensor, loss: str, batching: str) -> None:
    """A group-coupled loss needs every group of its mini-batch whole (e.g. trainer.batching=sequential)."""
    ids, counts = torch.unique(mb_groups, return_counts=True)
    full = torch.stack([(all_groups == g).sum() for g in ids])
    if not torch.equal(counts.cpu(), full.cpu()):
        raise ValueError(
            f"policy loss {loss!r} couples the rollouts of a group, but batching {batching!r} split a "
            "group across mini-batches; use trainer.batching=query_preserved (or sequential with rollouts per "
            "mini-batch a multiple of the group size)"
        )


def _nanmean(values: list[float]) -> float:
    """Mean of the non-NaN values; NaN (no warning) when there are none (e.g. a diagnostic with no gradient)."""
    v = [x for x in values if x == x]
    return float(np.mean(v)) if v else float("nan")


def _mean_row_gini(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Gini of each row's valid values, averaged over the rows that have a valid token (NaN if none)."""
    rows = (mask > 0).any(-1)
    return gini(x, mask)[rows].mean().item() if rows.any() else float("nan")


def _informative_frac(rewards: list[float], G: int) -> float:
    groups = [rewards[i : i + G] for i in range(0, len(rewards), G)]
    return float(np.mean([max(g) > min(g) for g in groups])) if groups else 0.0


def _subset(ro: Rollouts, rows: list[int]) -> Rollouts:
    # a field left empty (golds of a batch built without them) stays empty
    return Rollouts(
        *[[getattr(ro, f)[j] for j in rows] if getattr(ro, f) else [] for f in Rollouts.__dataclass_fields__]
    )


class _Filtered:
    """Accumulates the informative groups (score std > 0) of several rollout batches."""

    def __init__(self) -> None:
        self.parts: list[Rollouts] = []

    def add_informative(self, ro: Rollouts, G: int) -> None:
        s = ro.scores  # DAPO filters on accuracy (the raw score), not on the shaped reward
        keep = [i for i in range(0, len(s), G) if max(s[i : i + G]) > min(s[i : i + G])]
        self.parts.append(_subset(ro, [j for i in keep for j in range(i, i + G)]))

    def n_groups(self, G: int) -> int:
        return sum(len(p.rewards) for p in self.parts) // G

    def take(self, n: int) -> Rollouts:
        fields = Rollouts.__dataclass_fields__
        merged = {f: [x for p in self.parts for x in getattr(p, f)][:n] for f in fields}
        return Rollouts(**merged)


def write_history(history: list[dict[str, float]], path: Path) -> None:
    """metrics.jsonl: one JSON object per step (rewritten whole, so a resumed run never duplicates)."""
    tmp = Path(path).with_suffix(".tmp")
    with open(tmp, "w") as f:
        for h in history:
            f.write(json.dumps(h) + "\n")
    os.replace(tmp, path)
