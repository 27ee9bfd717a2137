"""A character-level Hugging Face tokenizer for the tiny world, built by the pipeline.

Every character is its own token (WordLevel model over a one-character pre-tokenizer), except
``\\boxed{`` which is a single added token. Ids are deterministic: the special tokens
``<pad>, <bos>, <eos>, <unk>`` come first (0-3), then the sorted set of characters seen in the
build texts, then ``\\boxed{``. The post-processor prepends ``<bos>`` on every encode; EOS is left
to the caller (the SFT target is prompt + response + EOS). Decoding concatenates tokens, so
``decode(encode(text), skip_special_tokens=True) == text`` for any text over the vocabulary,
spaces and newlines included. Characters outside the vocabulary encode to ``<unk>``.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from creditlab.data.schema import render_record_prompt

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
BOXED_TOKEN = "\\boxed{"


def collect_characters(texts: Iterable[str]) -> list[str]:
    """Sorted set of characters in ``texts``, ignoring those only inside ``\\boxed{`` tokens."""
    chars: set[str] = set()
    for text in texts:
        chars.update(text.replace(BOXED_TOKEN, ""))
    return sorted(chars)


def _build_backend(chars: list[str]) -> Tokenizer:
    """The raw ``tokenizers`` object: WordLevel vocab, per-character split, BOS post-processor."""
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *chars, BOXED_TOKEN])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    backend.add_tokens([AddedToken(BOXED_TOKEN, normalized=False, special=False)])
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A $B",
        special_tokens=[(BOS, vocab[BOS])],
    )
    return backend


def build_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer whose vocabulary covers every character of ``texts``.

    The result pads on the left (for batched generation) and never rewrites spaces on decode.
    Save it with ``save_pretrained(dir)``; ``AutoTokenizer.from_pretrained(dir)`` gives the same ids.
    """
    backend = _build_backend(collect_characters(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def sft_examples(
    records: list[dict], tokenizer, template: str, *, gold: bool = False
) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids with BOS, response ids ending in EOS) per record; the response is " " + solution, or
    " " + ``meta.sft_solution`` where a record has one (rule arithmetic: the warm-up's copy with the rule letters
    resolved at random, :mod:`creditlab.data.rule_arith`) unless ``gold``."""
    prompts, responses = [], []
    for r in records:
        prompts.append(tokenizer(render_record_prompt(r, template))["input_ids"])
        text = r["solution"] if gold else ((r.get("meta") or {}).get("sft_solution") or r["solution"])
        resp = tokenizer(" " + text, add_special_tokens=False)["input_ids"]
        responses.append(resp + [tokenizer.eos_token_id])
    return prompts, responses
