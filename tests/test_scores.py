"""tasks/scores.py's QueryDistribution: the float64 log-normaliser it computes in row chunks,
and the argmax it reads off ``max``, against their plain forms (float64 log-softmax,
``torch.argmax``), on rows that span several chunks."""

from __future__ import annotations

import pytest
import torch

from mecheval.tasks import scores
from mecheval.tasks.scores import QueryDistribution, answer_scores, log_normaliser


def test_the_chunked_log_normaliser_is_float64_logsumexp() -> None:
    g = torch.Generator().manual_seed(0)
    rows = 2 * scores.NORMALISER_CHUNK + 13  # a last chunk that is not full
    logits = torch.randn(rows, 301, generator=g) * 20
    logits[5] += 500.0  # a row whose exp would overflow without the shift by its maximum
    expected = torch.logsumexp(logits.double(), -1)
    torch.testing.assert_close(log_normaliser(logits), expected, rtol=1e-14, atol=0.0)
    dist = QueryDistribution(logits)
    torch.testing.assert_close(
        dist.full, torch.log_softmax(logits.double(), -1), rtol=0.0, atol=1e-12
    )
    cols = torch.randint(0, 301, (rows,), generator=g)
    torch.testing.assert_close(
        dist.logp(torch.arange(rows), cols),
        torch.log_softmax(logits.double(), -1)[torch.arange(rows), cols],
        rtol=0.0,
        atol=1e-12,
    )


def test_the_argmax_is_torch_argmax_ties_included() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randint(0, 4, (200, 9), generator=g).float()  # many tied maxima per row
    dist = QueryDistribution(logits)
    assert torch.equal(dist.argmax, logits.argmax(-1))
    answer = torch.randint(0, 9, (200,), generator=g)
    got = answer_scores(logits, answer, ["accuracy"])["accuracy"]
    assert torch.equal(got, (logits.argmax(-1) == answer).double())
    assert 0 < got.sum() < len(got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_likelihood_and_loss_are_those_of_the_float64_log_softmax(dtype) -> None:
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(150, 8192, generator=g) * 4).to(dtype)
    answer = torch.randint(0, 8192, (150,), generator=g)
    got = answer_scores(logits, answer, ["likelihood", "loss"])
    reference = torch.log_softmax(logits.double(), -1).gather(1, answer[:, None])[:, 0]
    assert got["likelihood"].dtype == torch.float64
    torch.testing.assert_close(got["loss"], -reference, rtol=1e-13, atol=0.0)
    torch.testing.assert_close(got["likelihood"], reference.exp(), rtol=1e-12, atol=0.0)
