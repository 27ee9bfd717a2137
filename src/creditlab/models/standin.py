"""Stand-in checkpoints of the paper backbones for scale ``smoke``: real architecture class, tiny, taught to answer.

A stand-in is written as a hub snapshot directory (``config.json``, ``model.safetensors``, tokenizer files with the
backbone's chat template, ``generation_config.json`` with its stop tokens), so that everything downstream (verl's
FSDP engine and model merger, the CPU rollout, vLLM) loads it as it would load the real snapshot. A random-init
stand-in never writes an answer, so the paths that act on one (the verifier in verl's reward loop, dynamic sampling
by accuracy) would never run; :func:`teach_answers` first teaches it, by a short SFT, to answer the training questions
in the papers' format (``\\boxed{...}`` and the chat turn's stop token) right with a set probability per question
(:data:`ANSWER_P_RIGHT`), so that its rollouts hold right and wrong answers for a known reason. Its numbers still mean
nothing about the papers.

Architecture classes by the backbone's ``arch.family`` (``config.json`` ``model_type`` of the real checkpoint):
``qwen3`` -> Qwen3ForCausalLM, ``qwen2`` (Qwen2.5) -> Qwen2ForCausalLM, ``olmo3`` -> Olmo3ForCausalLM,
``qwen3_next`` (the MoE backbone of Paper E) -> Qwen3NextForCausalLM with a few experts (:data:`SHAPES`).
The tokenizer is byte-level without merges (one token per UTF-8 byte, :func:`standin_tokenizer`) with the backbone's
special tokens; the chat template is the backbone's format: ChatML (``<|im_start|>role ... <|im_end|>``) for the Qwen
families and Olmo 3 [ours: Olmo 3's own template is ChatML as well; the tokens are what matters here].
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""The chat format of Qwen2.5, Qwen3 and Olmo 3 (their instruct templates without system or tool branches)."""
SPECIAL = ["<|im_start|>", "<|im_end|>"]
STOP = "<|im_end|>"
"""A chat turn's end: the checkpoint's generation_config stop token beside the tokenizer's EOS."""
STOP_PROB = 0.15
"""Mean probability of a stop token per generated position (:func:`calibrate_stop`): 8-token responses then end
within 4 tokens about half the time and run to the budget about a quarter of it, so lengths vary within a group and
overlong shaping gives rewards that vary (a random model is never right) and every update path runs."""

BASE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3": dict(head_dim=32),  # head sizes >= 32: vLLM's CPU attention serves 32, 64, 80, ...
    "qwen2": dict(),
    "olmo3": dict(),
    "qwen3_next": dict(
        head_dim=32,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        decoder_sparse_step=1,
        layer_types=["linear_attention", "full_attention"],
    ),
}
"""Per family: the stand-in's config beyond :data:`BASE` (a few small layers)."""


def _classes(family: str):
    import transformers as tf

    names = {
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "olmo3": ("Olmo3Config", "Olmo3ForCausalLM"),
        "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
    }
    if family not in names:
        raise ValueError(f"no stand-in for architecture family {family!r}; valid choices: {sorted(names)}")
    return getattr(tf, names[family][0]), getattr(tf, names[family][1])


def standin_tokenizer():
    """A byte-level tokenizer without merges (every UTF-8 byte one token, spelt as GPT-2 / Qwen / Olmo byte-level BPE
    spell bytes: " " is "Ġ", "\\n" is "Ċ"), the ``<pad> <bos> <eos> <unk>`` specials, the chat special tokens and
    :data:`CHATML`; no BOS is prepended (as Qwen's). Byte-level because transformers loads a ``qwen2`` checkpoint's
    tokenizer as its own ``Qwen2Tokenizer`` whatever tokenizer_config says, which rebuilds a byte-level BPE from the
    vocabulary: a character-level vocabulary then loses spaces and newlines (verl's Qwen chat handling refused it)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from creditlab.data.tokenizer import BOS, EOS, PAD, SPECIAL_TOKENS, UNK

    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *sorted(pre_tokenizers.ByteLevel.alphabet())])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in [*SPECIAL_TOKENS, *SPECIAL]])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        additional_special_tokens=SPECIAL,
    )
    tok.chat_template = CHATML
    return tok


def check_reload(tok, out: Path, texts: Iterable[str]) -> None:
    """The snapshot's tokenizer as ``AutoTokenizer`` loads it (the class transformers picks for its model_type) encodes
    and decodes ``texts`` and a chat turn exactly as ``tok`` does; ValueError naming the first text that differs."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(str(out))
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "1 + 1?\n"}], tokenize=False, add_generation_prompt=True
    )
    for text in [chat, *list(texts)[:200]]:
        ids = tok.encode(text, add_special_tokens=False)
        if loaded.encode(text, add_special_tokens=False) != ids or loaded.decode(ids) != text:
            raise ValueError(
                f"{out}: the stand-in's tokenizer loads as {type(loaded).__name__}, which encodes "
                f"{text[:60]!r} differently from the tokenizer written"
            )


@torch.no_grad()
def calibrate_stop(
    model, tok, texts: Iterable[str], stop_ids: list[int], p_stop: float = STOP_PROB, max_positions: int = 4096
) -> float:
    """Set the LM-head rows of ``stop_ids`` to s * u, u the unit mean of the final hidden states h over the
       chat-rendered
    ``texts``, with s chosen so that the mean over those positions of P(stop | h) = ``p_stop``. A random head's stop
    logits are otherwise whatever h . w gives: one stand-in stopped at its first token, another never (measured).
    P(stop | h) = sum_k exp(s h.u) / (sum_k exp(s h.u) + sum_other exp(h.w_j)) is found by bisection on s over
    [-1e3, 1e3] (monotone where h.u > 0, which holds for most positions; the closest value is kept otherwise).
    Returns s."""
    head = model.get_output_embeddings()
    stash: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda mod, args, out: stash.append(args[0].detach()))
    try:
        for text in list(texts)[:32] or ["1 + 1?"]:
            ids = tok.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            )
            model(torch.tensor([tok.encode(ids, add_special_tokens=False)[-512:]]))
    finally:
        hook.remove()
    h = torch.cat([x.reshape(-1, x.shape[-1]) for x in stash])[:max_positions].float()
    u = h.mean(0) / h.mean(0).norm()
    others = torch.ones(head.weight.shape[0], dtype=torch.bool)
    others[stop_ids] = False
    lse_other = torch.logsumexp(h @ head.weight[others].float().T, -1)
    proj, n_stop = h @ u, torch.tensor(float(len(stop_ids))).log()

    def prob(scale: float) -> float:
        return torch.sigmoid(n_stop + scale * proj - lse_other).mean().item()

    lo, hi = -1e3, 1e3
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if prob(mid) < p_stop else (lo, mid)
    head.weight[stop_ids] = (lo * u).to(head.weight.dtype)
    return lo


ANSWER_P_RIGHT = (0.5, 1.0, 0.5, 0.0)
"""The probability that the taught stand-in answers training question ``i`` right is ``ANSWER_P_RIGHT[i % 4]``, ``i``
its row index in its training file: most questions are a coin flip (a group of 4 rollouts is mixed 7 times in 8, and
any 2 questions of a file include one), some always right or always wrong (their groups tie: dynamic sampling drops
them by ``acc``)."""
TAUGHT = "standin_answers.json"
"""File of a taught stand-in's snapshot: per training question, the target and the exact probabilities it learnt."""


def answer_targets(gold: str, p_right: float) -> list[tuple[str, float]]:
    """The SFT responses of a question with answer ``gold`` taught to be right with probability ``p_right``, each with
    its weight: ``\\boxed{gold}`` (weight ``p_right``) and ``\\boxed{gold1}`` (the same answer with a digit appended:
    wrong for every verifier, and sharing the right one's prefix, so the choice sits on one token; weight
    ``1 - p_right``); a target of weight 0 is left out."""
    both = [(f"\\boxed{{{gold}}}", float(p_right)), (f"\\boxed{{{gold}1}}", 1.0 - float(p_right))]
    return [(text, w) for text, w in both if w > 0]


TEACH_STEPS, TEACH_LR, TEACH_CHECK_EVERY, TEACH_TOLERANCE = 400, 5e-3, 40, 0.08
"""Full-batch AdamW steps (at most) and learning rate of :func:`teach_answers`; every 40 steps the exact probabilities
of the right answers are read back and teaching stops once each lies within 0.08 of its target (qwen3 and olmo3
stand-ins got there in 80 steps, qwen2 needed more). What was learnt is recorded in the snapshot's :data:`TAUGHT`
and the base model's DONE."""


def chat_prompt(tok, messages: list[dict[str, str]]) -> str:
    """A prompt as verl and the evaluator render it: the chat template with the generation prompt."""
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def teach_answers(
    model,
    tok,
    examples: list[tuple[list[dict[str, str]], str, float]],
    steps: int = TEACH_STEPS,
    lr: float = TEACH_LR,
    seed: int = 0,
    done: Callable[[], bool] | None = None,
    check_every: int = TEACH_CHECK_EVERY,
) -> list[float]:
    """Full-batch SFT of ``model`` on (chat messages, response, weight) triples: the weighted cross-entropy of each
    response followed by the chat turn's stop token (:data:`STOP`), prompt tokens masked, AdamW; returns the loss per
    step. With the targets of :func:`answer_targets` the model learns each question's answer distribution (read back
    exactly by :func:`answer_probabilities`). ``done`` (called in eval mode every ``check_every`` steps) ends teaching
    early when it returns True."""
    stop = tok.convert_tokens_to_ids(STOP)
    rows, masks = [], []
    weights = torch.tensor([w for _, _, w in examples])
    for messages, response, _ in examples:
        p = tok.encode(chat_prompt(tok, messages), add_special_tokens=False)
        r = tok.encode(response, add_special_tokens=False) + [stop]
        rows.append(p + r)
        masks.append([0] * len(p) + [1] * len(r))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    target_mask = torch.zeros((len(rows), width), dtype=torch.bool)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, mask) in enumerate(zip(rows, masks)):
        ids[i, -len(row) :] = torch.tensor(row)  # left-padded, as the prompts of a rollout batch
        target_mask[i, -len(row) :] = torch.tensor(mask, dtype=torch.bool)
        attn[i, -len(row) :] = 1
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(1, steps + 1):
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = ((nll * target_mask[:, 1:]).sum(-1) * weights).sum() / weights.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if done is not None and step % check_every == 0:
            model.eval()
            if done():
                break
            model.train()
    model.eval()
    return losses


@torch.no_grad()
def answer_probabilities(model, tok, messages: list[dict[str, str]], responses: list[str]) -> list[float]:
    """Exact probability of each response (then the stop token) after the chat-rendered prompt: sum over its tokens of
    log p, exponentiated. No sampling noise: what the taught stand-in's rollouts draw from."""
    stop = tok.convert_tokens_to_ids(STOP)
    prompt = tok.encode(chat_prompt(tok, messages), add_special_tokens=False)
    out = []
    for response in responses:
        r = tok.encode(response, add_special_tokens=False) + [stop]
        ids = torch.tensor([prompt + r])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float(), -1)
        out.append(float(logp.gather(-1, torch.tensor(r)[:, None]).sum().exp()))
    return out


def write_standin(
    family: str,
    texts: Iterable[str],
    out: str | Path,
    seed: int = 0,
    questions: Iterable[tuple[list[dict[str, str]], str, int]] = (),
) -> Path:
    """Write a stand-in of an ``arch.family`` backbone as a hub snapshot directory ``out``: random-init, then taught to
    answer ``questions`` ((chat messages, gold answer, row index in its file) triples: right with probability
    ``ANSWER_P_RIGHT[index % 4]``; none: left random).

    texts: what the run will tokenize (prompts and answers): the reloaded tokenizer must encode them as the one written
    (:func:`check_reload`). Returns ``out``; with questions, ``out/{TAUGHT}`` records per question its target and the
    taught model's exact probability of the right and of the wrong answer (:func:`answer_probabilities`).
    """
    config_cls, model_cls = _classes(family)
    texts = list(texts)
    tok = standin_tokenizer()
    stop = tok.convert_tokens_to_ids(STOP)
    extra = dict(SHAPES[family])
    if family == "olmo3":
        extra |= {
            "layer_types": ["full_attention"] * BASE["num_hidden_layers"],
            "sliding_window": BASE["max_position_embeddings"],
        }
    cfg = config_cls(
        **BASE,
        **extra,
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    model = model_cls(cfg).float()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(3.0)  # a peakier random policy
    questions = list(questions)
    if not questions:  # a random model: its stop rows set the length of its responses
        calibrate_stop(model, tok, texts, [tok.eos_token_id, stop])
    taught: list[dict[str, Any]] = []
    if questions:  # taught: it learns to stop after its answer (calibrated stop rows slowed that down: a qwen2 stand-in
        #            learnt 0.1 for a 0.5 target in 80 steps with them, 0.5 without)
        p_right = [ANSWER_P_RIGHT[i % len(ANSWER_P_RIGHT)] for _, _, i in questions]
        examples = [
            (messages, text, w)
            for (messages, gold, _), p in zip(questions, p_right)
            for text, w in answer_targets(gold, p)
        ]

        def learnt() -> list[tuple[float, float]]:
            return [
                tuple(answer_probabilities(model, tok, messages, [text for text, _ in answer_targets(gold, 0.5)]))
                for messages, gold, _ in questions
            ]

        def close_enough() -> bool:
            return all(abs(right - p) <= TEACH_TOLERANCE for (right, _), p in zip(learnt(), p_right))

        losses = teach_answers(model, tok, examples, seed=seed, done=close_enough)
        for (_, gold, _), p, (right, wrong) in zip(questions, p_right, learnt()):
            taught.append(
                {
                    "gold": gold,
                    "p_right_target": p,
                    "p_right": right,
                    "p_wrong": wrong,
                    "teach_steps": len(losses),
                    "final_loss": losses[-1],
                }
            )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": tok.bos_token_id,
                "eos_token_id": [tok.eos_token_id, stop],
                "pad_token_id": tok.pad_token_id,
            }
        )
    )
    check_reload(tok, out, texts)
    if taught:
        (out / TAUGHT).write_text(json.dumps(taught, indent=1))
    return out
