"""DeepSeek-V4's chat protocol: its special tokens, prompt encoding and output markup."""
