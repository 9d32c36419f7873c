import torch

from dayzero.checkpoint import load_model
from dayzero.demo import build_tokenizer
from dayzero.settings import BUILT_IN_MODEL
from dayzero.tokenizer import load_codec
from dayzero.train.export import load_reference, write_float
from dayzero.train.model import build


def test_export_round_trips_main_and_mtp_logits(tiny_config, tmp_path):
    model = build(tiny_config, seed=0).eval()
    with torch.no_grad():  # give the zero-initialised sinks and biases values, so that they count
        for name, p in model.named_parameters():
            if name.endswith(("sinks", "position_bias", ".base", "hc_base")):
                p.normal_(0, 0.5)
    path = write_float(model, build_tokenizer(tiny_config["vocab_size"]), tmp_path / "float")
    reloaded = load_reference(path)
    ids = torch.randint(10, tiny_config["vocab_size"], (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(ids), reloaded(ids)
    assert torch.equal(ours.next, theirs.next)
    assert torch.equal(ours.after_next, theirs.after_next)  # MTP's t+2 logits


def test_the_committed_checkpoint_loads_and_passes_the_weight_check():
    model = load_model(BUILT_IN_MODEL, progress=False)
    assert model.weight_check.fp8_tensors > 0 and model.weight_check.experts_decoded > 0  # FP8 dense, FP4 experts
    assert len(model.mtp) == 1
    codec = load_codec(BUILT_IN_MODEL)
    text = 'The "if" statement is used for conditional execution.'
    assert codec.decode(codec.encode(text)) == text
