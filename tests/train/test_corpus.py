from dayzero.train.corpus import HELD_OUT_PERCENT, pieces, split, topics


def test_split_is_deterministic_disjoint_and_about_five_percent():
    first, again = split(0), split(0)
    assert first == again
    train = {(p.topic, p.index) for p in first.train}
    held = {(p.topic, p.index) for p in first.held_out}
    assert held and not train & held
    assert abs(len(held) / (len(train) + len(held)) * 100 - HELD_OUT_PERCENT) < 1
    assert {(p.topic, p.index) for p in split(1).held_out} != held


def test_pieces_cover_every_topic_exactly():
    corpus = split(0)
    every = sorted(corpus.train + corpus.held_out, key=lambda p: (p.topic, p.index))
    for topic, text in topics().items():
        parts = [p.text for p in every if p.topic == topic]
        assert "\n\n".join(parts).strip() == text.strip()


def test_pieces_break_at_paragraphs():
    text = "\n\n".join(["a" * 50] * 10)
    assert [len(p.text) for p in pieces("t", text, size=100)] == [102] * 5
