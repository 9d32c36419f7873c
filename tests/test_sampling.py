from __future__ import annotations

import pytest
import torch

from dayzero.params import SamplingParams
from dayzero.sampling import sample


def _logits() -> torch.Tensor:
    return torch.tensor([0.1, 3.0, 2.9, -1.0, 0.5])


def test_greedy_takes_argmax():
    assert sample(_logits(), SamplingParams(), None) == 1


def test_seed_repeats_and_top_k_limits_support():
    params = SamplingParams(temperature=5.0, top_k=2, seed=3)
    first = [sample(_logits(), params, g) for g in [torch.Generator().manual_seed(params.seed)] for _ in range(50)]
    again = [sample(_logits(), params, g) for g in [torch.Generator().manual_seed(params.seed)] for _ in range(50)]
    assert first == again
    assert set(first) == {1, 2}  # only the two best tokens, both drawn at a high temperature


def test_top_p_keeps_the_smallest_nucleus():
    # softmax of these at T=1: token 1 and 2 hold ~0.45 each; top_p=0.5 keeps both (mass above 2 is 0.46 < 0.5)
    params = SamplingParams(temperature=1.0, top_p=0.5, seed=0)
    gen = torch.Generator().manual_seed(params.seed)
    assert {sample(_logits(), params, gen) for _ in range(200)} == {1, 2}
    narrow = SamplingParams(temperature=1.0, top_p=0.1, seed=0)
    gen = torch.Generator().manual_seed(0)
    assert {sample(_logits(), narrow, gen) for _ in range(50)} == {1}


def test_sampling_frequencies_follow_softmax():
    logits = torch.tensor([0.0, 1.0])
    params = SamplingParams(temperature=1.0, seed=1)
    gen = torch.Generator().manual_seed(params.seed)
    ones = sum(sample(logits, params, gen) for _ in range(4000)) / 4000
    assert abs(ones - torch.sigmoid(torch.tensor(1.0)).item()) < 0.03  # 0.731, ~4 sigma band


@pytest.mark.parametrize(
    ("counts", "presence", "frequency", "expected"),
    [
        ({1: 1}, 0.2, 0.0, 2),  # 3.0 - 0.2 = 2.8 < 2.9
        ({1: 3, 2: 1}, 0.0, 0.1, 2),  # 3.0 - 0.3 = 2.7 < 2.9 - 0.1 = 2.8
        ({1: 3, 2: 1}, 0.0, 0.04, 1),  # 3.0 - 0.12 = 2.88 > 2.9 - 0.04 = 2.86
        ({2: 1}, -0.2, 0.0, 2),  # a negative penalty encourages: 2.9 + 0.2 = 3.1 > 3.0
        ({}, 2.0, 2.0, 1),  # nothing generated yet: nothing to penalise
    ],
)
def test_penalties_subtract_presence_once_and_frequency_per_occurrence(counts, presence, frequency, expected):
    params = SamplingParams(presence_penalty=presence, frequency_penalty=frequency)
    assert sample(_logits(), params, None, counts) == expected


@pytest.mark.parametrize("top_p", [0.0, 1e-3, 1e-310])  # (1e-310: 0 in float32)
def test_a_top_p_of_0_keeps_only_the_most_likely_token(top_p):
    """OpenAI takes top_p in [0, 1] (it was refused below 1e-3, as vLLM does): 0 keeps the best token
    alone, whatever the temperature and the draw; of tokens equally likely, the first, as greedy's."""
    from dayzero.sampling import distribution

    for logits, best in ((torch.tensor([0.0, 3.0, 1.0, 2.9]), 1), (torch.tensor([1.0, 2.0, 2.0, 0.0]), 1)):
        params = SamplingParams(max_tokens=1, temperature=2.0, top_p=top_p)
        assert (distribution(logits, params) > 0).tolist() == [i == best for i in range(4)]  # (unnormalised)
        assert {sample(logits, params, torch.Generator().manual_seed(seed)) for seed in range(20)} == {best}


def _one_row(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """A row's distribution written out: temperature, the top-k's k-th value, softmax, the top-p
    nucleus (tokens whose strictly-higher mass is below top_p, the best always); greedy (temperature 0,
    or top_p 0: the best alone): one-hot."""
    if p.temperature == 0.0 or p.top_p == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[0]).double()
    x = logits.double() / p.temperature
    if p.top_k:
        x = x.masked_fill(x < x.topk(p.top_k).values[-1], float("-inf"))
    probs = x.softmax(0)
    if p.top_p < 1.0:
        above = torch.stack([probs[probs > q].sum() for q in probs])
        probs = torch.where((above < p.top_p) | (above == 0), probs, 0.0)
    return probs


def test_a_batch_of_rows_samples_each_under_its_own_parameters():
    """Rows of one batch with different temperatures, top-k, top-p, greedy or seeded: each row's
    distribution equals its own written out; greedy rows take their argmax; a seeded row draws what
    the same seed draws alone; unseeded rows draw only tokens their distributions allow."""
    from dayzero.sampling import distributions, sample_rows

    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(7, 40, generator=gen) * 3
    params = [
        SamplingParams(),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=5),
        SamplingParams(temperature=0.9, top_p=0.6),
        SamplingParams(temperature=1.1, top_k=12, top_p=0.8, seed=4),
        SamplingParams(temperature=2.0, top_k=3, top_p=0.5),
        SamplingParams(temperature=1.5, top_p=0.0),  # (the best token alone, beside nuclei of 0.6 and 0.5)
    ]
    got = distributions(logits, params)
    for row, p in enumerate(params):
        assert torch.allclose(got[row].double(), _one_row(logits[row], p), atol=1e-6), row
    for _ in range(20):
        generators = [None, None, None, None, torch.Generator().manual_seed(7), None, None]
        tokens = sample_rows(logits, params, generators, [None] * 7)
        assert tokens[0] == int(logits[0].argmax()) and tokens[6] == int(logits[6].argmax())
        assert all(got[row, token] > 0 for row, token in enumerate(tokens))
        assert tokens[4] == sample(logits[4], params[4], torch.Generator().manual_seed(7))


def test_categorical_draws_follow_each_rows_masses():
    """Inverse transform sampling against the masses written out: frequencies within ~4 sigma, a
    zero mass never drawn (also at either end), rows unnormalised, a seed repeating its draws."""
    from dayzero.sampling import categorical

    masses = torch.tensor(
        [[0.0, 0.1, 0.0, 0.6, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 5.0], [2.0, 0.0, 0.0, 0.0, 0.0, 2.0]]
    )
    n = 20000
    drawn = categorical(masses.repeat(n, 1), torch.Generator().manual_seed(0)).view(n, 3)
    for row in range(3):
        freq = torch.bincount(drawn[:, row], minlength=6).double() / n
        want = masses[row].double() / masses[row].sum()
        assert torch.all(freq[want == 0] == 0), row
        assert torch.all((freq - want).abs() <= 4 * (want * (1 - want) / n).sqrt() + 1e-12), (row, freq)
    again = categorical(masses.repeat(n, 1), torch.Generator().manual_seed(0)).view(n, 3)
    assert torch.equal(drawn, again)


def test_the_cpu_sort_equals_torchs_stable_descending_sort():
    """Ties (many), both zeros, infinities, negatives and subnormals: the same values and order."""
    from dayzero.sampling import sort_descending

    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-6, 6, (8, 300), generator=gen).float() / 4  # (2400 values: the numpy path)
    x[0, :5] = torch.tensor([float("-inf"), float("inf"), -0.0, 0.0, 1e-42])
    x[1] = torch.randn(300, generator=gen) * 1e30
    x[2] = torch.softmax(torch.randn(300, generator=gen) * 30, dim=-1)  # probabilities, most underflowing
    values, order = sort_descending(x)
    want = x.sort(dim=-1, descending=True, stable=True)
    assert torch.equal(order, want.indices) and torch.equal(values, want.values)


def test_a_row_without_mass_fails_instead_of_drawing_a_token():
    """NaN logits (a diverged model) or no mass left: an error its request fails with, never a token."""
    from dayzero.sampling import categorical, sample_rows

    with pytest.raises(ValueError, match="no finite positive mass"):
        categorical(torch.tensor([[0.2, float("nan"), 0.3]]))
    with pytest.raises(ValueError, match="no finite positive mass"):
        categorical(torch.tensor([[0.5, 0.5], [0.0, 0.0]]))
    logits = torch.tensor([[0.0, 1.0, 2.0], [float("nan")] * 3])
    with pytest.raises(ValueError):
        sample_rows(logits, [SamplingParams(temperature=1.0)] * 2, [None, None], [None, None])
    with pytest.raises(ValueError):  # greedy too: argmax would pick a NaN's position
        sample_rows(logits, [SamplingParams()] * 2, [None, None], [None, None])


def test_a_row_without_mass_fails_alone_in_its_batch():
    """The batch falls back to row by row: the others draw exactly what they draw alone (seeded)."""
    from dayzero.completion import Completion, next_steps
    from dayzero.ids_only_codec import IdsOnlyCodec

    def rows(n: int) -> list[Completion]:
        params = SamplingParams(temperature=1.0, seed=3, max_tokens=8)
        return [Completion(IdsOnlyCodec(), params, (), 4, 1 << 20) for _ in range(n)]

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    logits[1] = float("nan")
    steps = next_steps(rows(3), logits)
    assert isinstance(steps[1], ValueError)
    assert [steps[0].token, steps[2].token] == [next_steps(rows(1), logits[i : i + 1])[0].token for i in (0, 2)]


@pytest.mark.parametrize(("best", "temperature"), [(2.9506571292877197, 0.7), (3.567232847213745, 1.3)])
def test_a_top_p_of_0_takes_greedys_token_where_two_logits_are_an_ulp_apart(best, temperature):
    """The greedy answer is the argmax of the logits; their softmax at a temperature rounds two logits
    an ulp apart to one probability, of which the nucleus kept the first: the lower one."""
    logits = torch.tensor([0.0, best, 0.5, 0.0])
    logits[3] = torch.nextafter(logits[1], torch.tensor(float("inf")))  # the best, by a hair
    params = SamplingParams(max_tokens=1, temperature=temperature, top_p=0.0, seed=1)
    assert sample(logits, params, torch.Generator().manual_seed(1)) == 3
    assert sample(logits, params, None) == 3  # (unseeded: the batch's draw)
