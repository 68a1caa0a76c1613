"""Sampling: seeded per-request generators, top-k/top-p masks, greedy, penalties, validation."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from edgefire.contract.errors import InvalidInputError
from edgefire.runtime.engine.sampler import (
    Sampler,
    apply_penalties,
    greedy_tokens,
    sample,
    sample_rows,
    sampling_kernel,
    top_k_top_p_mask,
)
from edgefire.runtime.engine.sampling_params import (
    MAX_SEED,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    SamplingParams,
)
from edgefire.runtime.engine.sequence import Sequence

VOCAB = 50
_ids = itertools.count()


def make_seq(params: SamplingParams, prompt: list[int] | None = None,
             output: list[int] = ()) -> Sequence:
    prompt = [1, 2, 3] if prompt is None else prompt
    generator = torch.Generator()
    generator.manual_seed(params.seed if params.seed is not None else 0)
    return Sequence(f"s{next(_ids)}", prompt + list(output), len(prompt), params, generator)


def random_logits(seed: int, rows: int = 1, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=g) * scale


def draw(sampler: Sampler, rows: list[tuple[Sequence, torch.Tensor]], steps: int) -> list[list]:
    """Sample `steps` tokens per row, batching the rows in the given order each step."""
    out: list[list[int]] = [[] for _ in rows]
    for _ in range(steps):
        logits = torch.stack([row for _, row in rows])  # a fresh copy each step
        for i, token in enumerate(sampler(logits, [seq for seq, _ in rows])):
            out[i].append(token)
    return out


# --------------------------------------------------------------------------- seeding


def test_seeded_sampling_is_independent_of_batch_composition_and_order() -> None:
    sampler = Sampler()
    logits = random_logits(0, rows=4, scale=1.0)  # flat enough that draws vary
    params = [SamplingParams(temperature=1.0, seed=s) for s in (11, 22, 33)]

    alone = draw(sampler, [(make_seq(params[0]), logits[0])], 30)[0]
    trio = draw(sampler, [(make_seq(p), logits[i]) for i, p in enumerate(params)], 30)
    assert trio[0] == alone
    reversed_rows = [(make_seq(p), logits[i]) for i, p in enumerate(params)][::-1]
    greedy_row = (make_seq(SamplingParams(temperature=0)), logits[3])
    mixed = draw(sampler, [greedy_row, *reversed_rows], 30)
    assert mixed[1:] == trio[::-1]
    assert len(set(alone)) > 3  # the draws really are random


def test_same_seed_same_tokens_different_seed_differs() -> None:
    sampler = Sampler()
    logits = random_logits(1, scale=1.0)[0]
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=1234)
    a = draw(sampler, [(make_seq(params), logits)], 40)[0]
    b = draw(sampler, [(make_seq(params), logits)], 40)[0]
    other = SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=1235)
    c = draw(sampler, [(make_seq(other), logits)], 40)[0]
    assert a == b
    assert a != c


def test_sampling_follows_the_distribution() -> None:
    sampler = Sampler()
    logits = torch.full((VOCAB,), -30.0)
    logits[:2] = torch.tensor([math.log(0.75), math.log(0.25)])
    tokens = draw(sampler, [(make_seq(SamplingParams(temperature=1.0, seed=5)), logits)],
                  2000)[0]
    assert set(tokens) <= {0, 1}
    assert 0.70 < tokens.count(0) / len(tokens) < 0.80


def test_sampling_never_leaves_the_top_k_top_p_set() -> None:
    sampler = Sampler()
    logits = random_logits(2, scale=0.5)[0]
    top3 = set(torch.topk(logits, 3).indices.tolist())
    for seed in range(40):
        seq = make_seq(SamplingParams(temperature=2.0, top_k=3, seed=seed))
        assert set(draw(sampler, [(seq, logits)], 5)[0]) <= top3
    probs = logits.softmax(-1)
    nucleus = set(_minimal_nucleus(probs, 0.3))
    for seed in range(40):
        seq = make_seq(SamplingParams(temperature=1.0, top_p=0.3, seed=seed))
        assert set(draw(sampler, [(seq, logits)], 5)[0]) <= nucleus


# --------------------------------------------------------------------------- masks


def _minimal_nucleus(probs: torch.Tensor, top_p: float) -> list[int]:
    order = torch.argsort(probs, descending=True).tolist()
    kept, mass = [], 0.0
    for token in order:
        kept.append(token)
        mass += probs[token].item()
        if mass >= top_p:
            break
    return kept


@pytest.mark.parametrize("k", [1, 2, 7, 49, 50])
def test_top_k_keeps_exactly_k(k: int) -> None:
    logits = random_logits(k)[0]
    masked = top_k_top_p_mask(logits, k, 1.0)
    kept = torch.isfinite(masked)
    assert int(kept.sum()) == k
    assert set(kept.nonzero().flatten().tolist()) == set(torch.topk(logits, k).indices.tolist())
    assert torch.equal(masked[kept], logits[kept])
    assert torch.isinf(logits).sum() == 0  # the input is not modified


def test_top_k_zero_and_top_p_one_keep_everything() -> None:
    logits = random_logits(3)[0]
    assert torch.equal(top_k_top_p_mask(logits, 0, 1.0), logits)


@pytest.mark.parametrize("top_p", [1e-6, 0.1, 0.5, 0.8, 0.9, 0.99])
@pytest.mark.parametrize("seed", [4, 5, 6])
def test_top_p_keeps_the_minimal_nucleus(top_p: float, seed: int) -> None:
    logits = random_logits(seed)[0]
    original = logits.clone()
    masked = top_k_top_p_mask(logits, 0, top_p)
    kept = set(torch.isfinite(masked).nonzero().flatten().tolist())
    assert kept == set(_minimal_nucleus(logits.softmax(-1), top_p))
    assert int(logits.argmax()) in kept  # the top token always survives
    assert torch.equal(logits, original)


@pytest.mark.parametrize(("scale", "top_p"), [(0.05, 0.9), (0.05, 0.2), (4.0, 0.95)])
def test_top_p_nucleus_within_or_beyond_the_candidates(scale: float, top_p: float) -> None:
    # A vocabulary of 49k: nearly flat logits put the nucleus far past the first candidates
    # (the full sort), peaked ones well inside them; both keep exactly the minimal nucleus.
    g = torch.Generator().manual_seed(9)
    logits = torch.randn(49152, generator=g) * scale
    kept = torch.isfinite(top_k_top_p_mask(logits, 0, top_p)).nonzero().flatten().tolist()
    assert sorted(kept) == sorted(_minimal_nucleus(logits.softmax(-1), top_p))


def test_top_p_after_top_k_renormalizes_within_top_k() -> None:
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1] + [1e-9] * (VOCAB - 4)))
    # Within the top 2, token 0 holds 0.4 / 0.7 = 57% of the mass: top_p 0.5 keeps it alone.
    masked = top_k_top_p_mask(logits, 2, 0.5)
    assert torch.isfinite(masked).nonzero().flatten().tolist() == [0]
    masked = top_k_top_p_mask(logits, 3, 0.6)  # 0.4/0.9 < 0.6 <= 0.7/0.9
    assert torch.isfinite(masked).nonzero().flatten().tolist() == [0, 1]


# --------------------------------------------------------------------------- greedy


def test_greedy_is_argmax() -> None:
    sampler = Sampler()
    logits = random_logits(7, rows=6)
    expected = logits.argmax(-1).tolist()
    seqs = [make_seq(SamplingParams(temperature=0)) for _ in range(3)]
    seqs += [make_seq(SamplingParams(temperature=1.5, top_k=1, seed=i)) for i in range(3)]
    assert sampler(logits.clone(), seqs) == expected


def test_greedy_takes_the_first_of_tied_maxima() -> None:
    # BF16 logits tie often; argmax's rule (the lowest index) keeps greedy output reproducible
    # against the references the parity tests compare with.
    logits = torch.zeros(2, 49152)
    logits[0, [7, 3, 40000]] = 2.0
    logits[1, [45000, 20000]] = 1.0
    seqs = [make_seq(SamplingParams(temperature=0)) for _ in range(2)]
    assert Sampler()(logits, seqs) == [3, 20000]


def test_greedy_tokens_are_torch_max_indices_on_every_kind_of_row() -> None:
    # The native kernel (sampling.cpp) where it built, torch's max otherwise: the same index for
    # ties, masked (-inf) rows, signed zeros, NaN (the first NaN, as torch takes NaN for the
    # largest), infinities, and vocabularies that leave a tail past the vector width.
    vocab = 49152 + 13
    logits = torch.randn(12, vocab, generator=torch.Generator().manual_seed(3))
    logits[0] = float("-inf")
    logits[1, 5:] = float("-inf")
    logits[2] = 0.0
    logits[2, 900] = -0.0
    logits[3, [vocab - 1, 17, 70]] = float("nan")
    logits[4, vocab - 2] = float("nan")
    logits[5, [100, 30000]] = float("inf")
    logits[6, vocab - 1] = 50.0
    logits[7, [vocab - 3, vocab - 1]] = 50.0
    logits[8, 1] = float("nan")
    logits[8, 0] = float("inf")
    logits[9, :16] = 8.0
    expected = logits.max(dim=-1).indices.tolist()
    assert expected[:10] == [0, 0, 0, 17, vocab - 2, 100, vocab - 1, vocab - 3, 1, 0]
    assert greedy_tokens(logits) == expected
    kernel = _kernel()
    for rows in (logits, logits[:, :7].contiguous(), logits[:, :16].contiguous(), logits[5:6]):
        assert kernel.row_argmax(rows).tolist() == rows.max(dim=-1).indices.tolist()


def _kernel():
    kernel = sampling_kernel()
    if kernel is None:
        pytest.skip("no native kernels in this process (EDGEFIRE_NATIVE_KERNELS=0 or no "
                    "compiler): the sampler runs its torch path, which the other tests cover")
    return kernel


def _torch_probs(row: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch path's probabilities for a row, and the float64 cumulative sum it inverts."""
    probs = top_k_top_p_mask(row / params.temperature, params.top_k, params.top_p).softmax(-1)
    return probs, probs.cumsum(-1, dtype=torch.float64)


@pytest.mark.parametrize("kwargs", [
    {"temperature": 0.7}, {"temperature": 1.3, "top_p": 0.9}, {"temperature": 0.7, "top_k": 50},
    {"temperature": 1.0, "top_k": 300, "top_p": 0.5}, {"temperature": 0.2, "top_p": 0.999},
    {"temperature": 4.0, "top_p": 0.95}, {"temperature": 1.0, "top_k": 7, "top_p": 0.3}])
def test_native_draws_are_the_torch_paths_draws(kwargs: dict) -> None:
    # The same token for the same uniform number, on a real vocabulary's width, a grammar's
    # -inf mask, and tied logits at the top-k boundary; u within float rounding of a boundary
    # between two tokens' cumulative sums may fall either side, and is not asked.
    kernel = _kernel()
    params = SamplingParams(**kwargs)
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 49152 + 5, generator=gen) * 3
    logits[1, ::3] = float("-inf")
    logits[2, :40] = 9.0
    for row in range(3):
        probs, cdf = _torch_probs(logits[row], params)
        draws = [u for u in torch.rand(300, generator=gen, dtype=torch.float64).tolist()
                 if (cdf - u * float(cdf[-1])).abs().min() >= 1e-6 * float(cdf[-1])]
        assert len(draws) > 250
        tokens = kernel.sample_rows(logits, [row] * len(draws), [params.temperature] * len(draws),
                                    [params.top_k] * len(draws), [params.top_p] * len(draws),
                                    draws)
        assert tokens == [sample(probs, u) for u in draws], row


def test_native_draws_never_take_a_masked_token_and_check_their_inputs() -> None:
    kernel = _kernel()
    logits = torch.full((2, 1000), float("-inf"))
    logits[0, [3, 999]] = 0.0
    logits[1, 10] = float("nan")
    logits[1, 500] = -200.0
    for u in (0.0, 0.25, 0.5, 0.999999):
        assert kernel.sample_rows(logits, [0], [5.0], [0], [1.0], [u])[0] == (3 if u < 0.5
                                                                               else 999)
        assert kernel.sample_rows(logits, [1], [0.5], [0], [1.0], [u])[0] == 500
    every = torch.full((1, 64), float("-inf"))  # nothing can be drawn: the greedy token
    assert kernel.sample_rows(every, [0], [1.0], [0], [1.0], [0.3]) == [0]
    with pytest.raises(RuntimeError, match="out of range"):
        kernel.sample_rows(logits, [2], [1.0], [0], [1.0], [0.3])
    with pytest.raises(RuntimeError, match="out of range"):
        kernel.sample_rows(logits, [0], [1.0], [0], [1.0], [1.0])


def test_sampled_rows_in_one_call_draw_each_from_its_own_generator() -> None:
    # Rows drawn together take the same tokens as rows drawn one at a time, each with the next
    # number of its own sequence's generator.
    logits = random_logits(11, rows=5)
    kinds = [{"temperature": 0.7}, {"temperature": 1.2, "top_p": 0.8},
             {"temperature": 0.9, "top_k": 5}, {"temperature": 2.0}, {"temperature": 0.5}]
    together = [make_seq(SamplingParams(seed=i, **k)) for i, k in enumerate(kinds)]
    alone = [make_seq(SamplingParams(seed=i, **k)) for i, k in enumerate(kinds)]
    for _ in range(5):
        joint = sample_rows(logits, list(range(5)), together)
        assert joint == [sample_rows(logits, [r], [alone[r]])[0] for r in range(5)]


def test_greedy_row_in_a_sampled_batch() -> None:
    sampler = Sampler()
    logits = random_logits(8, rows=3, scale=0.1)
    seqs = [make_seq(SamplingParams(temperature=2.0, seed=1)), make_seq(SamplingParams(
        temperature=0)), make_seq(SamplingParams(temperature=2.0, seed=2))]
    for _ in range(10):
        assert sampler(logits.clone(), seqs)[1] == int(logits[1].argmax())


# --------------------------------------------------------------------------- penalties


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0, -1.0, 3.0, 0.5] + [0.0] * (VOCAB - 6))
    original = logits.clone()
    seq = make_seq(SamplingParams(repetition_penalty=2.0), prompt=[0, 1, 1], output=[2, 3])
    apply_penalties(logits, seq)
    expected = original.clone()
    expected[:4] = torch.tensor([1.0, -4.0, 0.5, -2.0])  # prompt and output tokens, once each
    assert torch.equal(logits, expected)


def test_repetition_penalty_below_one_boosts() -> None:
    logits = torch.tensor([2.0, -2.0] + [0.0] * (VOCAB - 2))
    seq = make_seq(SamplingParams(repetition_penalty=0.5), prompt=[0, 1])
    apply_penalties(logits, seq)
    assert logits[:2].tolist() == [4.0, -1.0]


def test_frequency_and_presence_penalties_follow_openai() -> None:
    # logit[t] -= count[t] * frequency_penalty + (count[t] > 0) * presence_penalty, where the
    # counts are over generated tokens only.
    logits = random_logits(9)[0]
    original = logits.clone()
    output = [5, 5, 5, 7, 9, 9]
    seq = make_seq(SamplingParams(frequency_penalty=0.5, presence_penalty=0.25),
                   prompt=[1, 2, 3], output=output)
    apply_penalties(logits, seq)
    expected = original.clone()
    for token, count in {5: 3, 7: 1, 9: 2}.items():
        expected[token] -= 0.5 * count + 0.25
    assert torch.allclose(logits, expected, atol=1e-6)
    assert torch.equal(logits[[1, 2, 3]], original[[1, 2, 3]])  # prompt tokens untouched


def test_negative_frequency_presence_penalties_encourage() -> None:
    logits = torch.zeros(VOCAB)
    seq = make_seq(SamplingParams(frequency_penalty=-1.0, presence_penalty=-0.5), output=[4, 4])
    apply_penalties(logits, seq)
    assert logits[4].item() == pytest.approx(2.5)
    assert int((logits != 0).sum()) == 1


def test_penalties_without_output_change_nothing() -> None:
    logits = random_logits(10)[0]
    original = logits.clone()
    apply_penalties(logits, make_seq(SamplingParams(frequency_penalty=2.0,
                                                    presence_penalty=2.0)))
    assert torch.equal(logits, original)


def test_sampler_applies_penalties_before_greedy() -> None:
    sampler = Sampler()
    logits = torch.zeros(1, VOCAB)
    logits[0, 3], logits[0, 4] = 2.0, 1.5
    seq = make_seq(SamplingParams(temperature=0, presence_penalty=1.0), output=[3])
    assert sampler(logits, [seq]) == [4]
    seq = make_seq(SamplingParams(temperature=0, repetition_penalty=1.5), prompt=[3])
    logits[0, 3], logits[0, 4] = 2.0, 1.5
    assert sampler(logits, [seq]) == [4]


def _model_logits(seed: int, rows: int = 1) -> torch.Tensor:
    """Logits as the model hands them over: made under inference mode."""
    with torch.inference_mode():
        return random_logits(seed, rows)


def _reference_penalties(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """HF's RepetitionPenaltyLogitsProcessor (over prompt and output), then OpenAI's
    frequency/presence formula (over output only), on a copy."""
    transformers = pytest.importorskip("transformers")
    p = seq.params
    out = logits.clone().unsqueeze(0)
    if p.repetition_penalty != 1.0:
        processor = transformers.RepetitionPenaltyLogitsProcessor(float(p.repetition_penalty))
        out = processor(torch.tensor([seq.token_ids]), out)
    for token in set(seq.output_token_ids):
        count = seq.output_token_ids.count(token)
        out[0, token] -= count * p.frequency_penalty + p.presence_penalty
    return out[0]


_PENALTIES = [
    {"repetition_penalty": 1.3}, {"repetition_penalty": 0.7}, {"frequency_penalty": 0.8},
    {"presence_penalty": -1.2}, {"frequency_penalty": 1.5, "presence_penalty": 0.5},
    {"repetition_penalty": 1.8, "frequency_penalty": -0.4, "presence_penalty": 2.0},
]


@pytest.mark.parametrize("penalties", _PENALTIES)
@pytest.mark.parametrize("sampling", [{"temperature": 0},
                                      {"temperature": 0.8, "top_k": 20, "top_p": 0.9}])
def test_penalties_on_model_logits_match_the_reference(penalties: dict, sampling: dict) -> None:
    # Regression: penalties updated inference tensors in place outside inference mode, and
    # the step raised. Each row must sample what its reference-penalized logits sample.
    sampler = Sampler()
    prompt, output = [0, 4, 4, 9, 17], [9, 9, 23, 4, 31, 31, 31]
    for seed in range(5):
        params = SamplingParams(seed=seed, **sampling, **penalties)
        seqs = [make_seq(params, prompt, output), make_seq(SamplingParams(temperature=0))]
        logits = _model_logits(seed, rows=2)
        expected_logits = torch.stack([_reference_penalties(logits[0], seqs[0]), logits[1]])
        unpenalized = [make_seq(SamplingParams(seed=seed, **sampling), prompt, output),
                       seqs[1]]
        assert sampler(expected_logits, unpenalized) == sampler(logits, seqs)
    # The sampler penalized the model's logits in place (a clone would be a normal tensor).
    assert torch.allclose(logits[0], expected_logits[0], atol=1e-6)
    assert not torch.equal(logits[0], _model_logits(seed, rows=2)[0])


# --------------------------------------------------------------------------- validation


def test_defaults_validate() -> None:
    SamplingParams().validate(VOCAB)
    SamplingParams(max_tokens=1, temperature=0, top_p=1, top_k=VOCAB, seed=MAX_SEED,
                   repetition_penalty=2, frequency_penalty=-2, presence_penalty=2,
                   stop=["\n"], stop_token_ids=[VOCAB - 1]).validate(VOCAB)
    SamplingParams(stop=["x" * MAX_STOP_CHARS] * MAX_STOP_STRINGS).validate(VOCAB)
    assert SamplingParams(temperature=0).greedy and SamplingParams(top_k=1).greedy
    assert not SamplingParams().greedy and not SamplingParams().has_penalties


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"temperature": 5.5}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": "0.5"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"top_k": VOCAB + 1}, "top_k"),
    ({"top_k": 2.0}, "top_k"),
    ({"seed": -1}, "seed"),
    ({"seed": MAX_SEED + 1}, "seed"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 2.5}, "repetition_penalty"),
    ({"frequency_penalty": 2.1}, "frequency_penalty"),
    ({"presence_penalty": -2.1}, "presence_penalty"),
    ({"stop": [""]}, "stop"),
    ({"stop": "\n"}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),  # OpenAI's limit is 4
    ({"stop": ["x" * (MAX_STOP_CHARS + 1)]}, "stop"),
    ({"stop_token_ids": [VOCAB]}, "stop_token_ids"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
])
def test_validate_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        SamplingParams(**kwargs).validate(VOCAB)
    assert info.value.field == field
    assert field in str(info.value)
    assert info.value.status == 400 and info.value.code == 5006
