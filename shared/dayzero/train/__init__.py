"""The trained tiny DeepSeek-V4 the demo serves: corpus, tokenizer, model + MTP, training, export.

``dayzero train-demo OUT`` reproduces the committed checkpoint in ``demo_model/``.
"""
