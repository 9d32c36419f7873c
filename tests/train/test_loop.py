import torch

from dayzero.train.loop import evaluate, train
from dayzero.train.model import build
from dayzero.train.options import TrainOptions


def test_a_few_steps_lower_the_loss(tiny_config):
    model = build(tiny_config, seed=0)
    stream = torch.arange(600) % 37 + 10  # a short repeating sequence: learnable in a few steps
    opts = TrainOptions(steps=12, batch=2, length=32, lr=3e-3, warmup=2, log_every=100)
    history = train(model, stream, opts, log=lambda line: None)
    assert len(history) == 12
    assert history[-1] < 0.8 * history[0]
    losses = evaluate(model, stream[:128], length=32, batch=2)
    assert 0 <= losses.mtp_top1 <= 1 and losses.after_next > 0


def test_training_is_reproducible(tiny_config):
    stream = torch.arange(400) % 29 + 10
    opts = TrainOptions(steps=3, batch=2, length=16, log_every=100)
    runs = []
    for _ in range(2):
        model = build(tiny_config, seed=0)
        train(model, stream, opts, log=lambda line: None)
        runs.append(model.state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
