"""Both architecture families of the tiny world (creditlab.models.tiny) run on the local engine unchanged.

Each family is built at micro size from its config (configs/model/micro-s.yaml: qwen3,
configs/model/micro-olmo.yaml: olmo) and checked where the engine touches the model: the KV-cache
sampler's greedy output equals HF ``generate``, ``response_forward`` equals a plain forward, and the
saved model reloads through the CLI's loader to the same class and outputs.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

import creditlab.models.tiny as tiny  # noqa: E402
from creditlab.jobs.common import load_model  # noqa: E402
from creditlab.lm.batch import pack, response_forward  # noqa: E402
from creditlab.lm.sampler import SamplingParams, generate, left_pad  # noqa: E402
from creditlab.models.tiny import build_model, n_params  # noqa: E402
from creditlab.plan import CONFIG_DIR  # noqa: E402

VOCAB, PAD, BOS, EOS = 40, 0, 1, 2
NO_EOS = -1  # an id that is never generated
torch.set_num_threads(1)

BACKBONES = {"micro-s": "Qwen3ForCausalLM", "micro-olmo": "Olmo3ForCausalLM"}


def _arch(backbone: str) -> dict:
    return yaml.safe_load((CONFIG_DIR / "model" / f"{backbone}.yaml").read_text())["arch"]


@pytest.fixture(scope="module", params=sorted(BACKBONES))
def backbone(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model(backbone):
    return build_model(_arch(backbone), VOCAB, PAD, BOS, EOS, seed=0).eval()


def _prompts(n: int, lo: int = 3, hi: int = 14, seed: int = 0) -> list[list[int]]:
    """n prompts of random lengths in [lo, hi], BOS then ids in [3, VOCAB)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [[BOS] + torch.randint(3, VOCAB, (k - 1,), generator=g).tolist() for k in lengths]


def _truncate_at(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def _assert_greedy_matches_hf(model, n_prompts: int = 10, max_new: int = 20) -> None:
    """Greedy sampler output == HF generate, with an EOS that ends some rows but not all."""
    prompts = _prompts(n_prompts)
    free = generate(model, prompts, SamplingParams(max_new_tokens=max_new, eos_id=NO_EOS, greedy=True)).response_ids
    rows_with = {t: sum(t in r for r in free) for t in range(3, VOCAB)}
    eos = max((t for t in rows_with if 0 < rows_with[t] < len(prompts)), key=lambda t: rows_with[t])
    ours = generate(model, prompts, SamplingParams(max_new_tokens=max_new, eos_id=eos, greedy=True))
    ids, mask = left_pad(prompts, PAD)
    with torch.no_grad():
        hf = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=PAD,
        )
    hf_rows = [_truncate_at(row, eos) for row in hf[:, ids.shape[1] :].tolist()]  # HF pads after EOS
    assert ours.response_ids == hf_rows
    assert ours.finished == [eos in r for r in hf_rows]
    assert any(ours.finished) and not all(ours.finished)


# -------------------------------------------------------------------------------------------- build
def test_builds_the_configured_family(backbone, model):
    arch = _arch(backbone)
    assert type(model).__name__ == BACKBONES[backbone]
    assert arch.get("family", tiny.DEFAULT_FAMILY) in tiny.FAMILIES
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied == arch["tie_word_embeddings"] == model.config.tie_word_embeddings
    assert model.config.num_hidden_layers == arch["num_hidden_layers"]
    assert (model.config.pad_token_id, model.config.bos_token_id, model.config.eos_token_id) == (PAD, BOS, EOS)
    assert set(getattr(model.config, "layer_types", None) or ["full_attention"]) == {"full_attention"}
    assert 50_000 < n_params(model) < 120_000
    again = build_model(arch, VOCAB, PAD, BOS, EOS, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_family_defaults_to_qwen3():
    arch = {k: v for k, v in _arch("micro-s").items() if k != "family"}
    assert type(build_model(arch, VOCAB, PAD, BOS, EOS)).__name__ == "Qwen3ForCausalLM"


def test_unknown_family_names_the_choices():
    with pytest.raises(ValueError, match=r"unknown model family 'llama'.*\['olmo', 'qwen3'\]"):
        build_model(_arch("micro-s") | {"family": "llama"}, VOCAB, PAD, BOS, EOS)


def test_bad_arch_is_rejected():
    with pytest.raises(ValueError, match="unknown arch keys"):
        build_model(_arch("micro-s") | {"num_layers": 2}, VOCAB, PAD, BOS, EOS)
    with pytest.raises(ValueError, match="head_dim must be"):
        build_model(_arch("micro-olmo") | {"head_dim": 32}, VOCAB, PAD, BOS, EOS)


# -------------------------------------------------------------------------------------------- engine
def test_greedy_sampler_matches_hf_generate(model):
    _assert_greedy_matches_hf(model)


def test_response_forward_matches_plain_forward(model):
    prompts = _prompts(6, seed=1)
    responses = _prompts(6, lo=1, hi=9, seed=2)
    batch = pack(prompts, responses, PAD)
    with torch.no_grad():
        out = response_forward(model, batch, with_entropy=True, with_hidden=True)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            logits = model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : -1].float()  # unpadded
            logprobs = torch.log_softmax(logits, -1)
            want = logprobs.gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
            torch.testing.assert_close(out.logp[i, : len(r)], want, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(
                out.entropy[i, : len(r)], -(logprobs.exp() * logprobs).sum(-1), atol=1e-5, rtol=1e-5
            )
    assert out.hidden.shape == (6, batch.response_len, model.config.hidden_size)


def test_save_reload_round_trip(model, tmp_path):
    model.save_pretrained(tmp_path)
    loaded = load_model(tmp_path).eval()  # the loader of `train` / `evaluate`
    assert type(loaded) is type(model)
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == model.config.tie_word_embeddings
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    prompts = _prompts(4, seed=3)
    greedy = SamplingParams(max_new_tokens=8, eos_id=NO_EOS, greedy=True)
    a = generate(model, prompts, greedy)
    b = generate(loaded, prompts, greedy)
    assert a.response_ids == b.response_ids


def test_olmo2_fallback_runs_on_the_engine(monkeypatch):
    """On a transformers without OLMo 3 the olmo family is Olmo2ForCausalLM, same block without sliding."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    monkeypatch.setattr(tiny, "_olmo_classes", lambda: (Olmo2Config, Olmo2ForCausalLM, False))
    model = build_model(_arch("micro-olmo"), VOCAB, PAD, BOS, EOS, seed=0).eval()
    assert type(model).__name__ == "Olmo2ForCausalLM"
    _assert_greedy_matches_hf(model, n_prompts=6, max_new=12)
