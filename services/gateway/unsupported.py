"""The parameters this server does not implement, accepted at the value that asks for nothing it
lacks and refused otherwise: OpenAI's, and vLLM's and SGLang's extensions (schemas declares them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# name: (whether a value asks for nothing this server lacks, why the others are refused): OpenAI's
# parameters, declared with their types in Sampling (a value of another type is told so)
UNIMPLEMENTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "functions": (lambda v: not v, "is not supported by this server; use tools"),
    "function_call": (lambda v: v == "none", 'is not supported by this server (only "none"); use tool_choice'),
    "modalities": (lambda v: set(v) <= {"text"}, 'other than ["text"] are not supported by this server'),
    "audio": (lambda _: False, "output is not supported by this server"),
    "prediction": (lambda _: False, "(predicted outputs) is not supported by this server"),
    "web_search_options": (lambda _: False, "is not supported by this server: it does not search the web"),
    "verbosity": (lambda v: v == "medium", 'other than "medium" is not supported by this server'),
    "best_of": (lambda v: v == 1, "must be 1 on this server"),
    "suffix": (lambda v: not v, "is not supported by this server"),
}

# vLLM's and SGLang's extensions, which change the reply (ignored, a vLLM client got another reply than
# it asked for: guided_json unconstrained text): the same, declared as any value (no type to tell)
VLLM_ONLY = "(vLLM's) is not supported by this server"
SGLANG_ONLY = "(SGLang's) is not supported by this server"
ENGINE_EXTENSIONS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **dict.fromkeys(
        ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"),
        (lambda _: False, f"{VLLM_ONLY}; use response_format"),
    ),
    "min_tokens": (lambda v: v == 0, f"other than 0 {VLLM_ONLY}"),
    "min_p": (lambda v: v == 0, f"other than 0 {VLLM_ONLY}"),
    "repetition_penalty": (lambda v: v == 1, f"other than 1 {VLLM_ONLY}; use presence_penalty or frequency_penalty"),
    "stop_token_ids": (lambda v: v == [], f"{VLLM_ONLY}; use stop"),
    "bad_words": (lambda v: v == [], f"{VLLM_ONLY}; use logit_bias"),
    "allowed_token_ids": (lambda _: False, f"{VLLM_ONLY}; use logit_bias"),  # a token list (vLLM: null only)
    "use_beam_search": (lambda v: v is False, VLLM_ONLY),
    "include_stop_str_in_output": (lambda v: v is False, VLLM_ONLY),
    "skip_special_tokens": (lambda v: v is True, f"false {VLLM_ONLY}"),
    "spaces_between_special_tokens": (lambda v: v is True, f"false {VLLM_ONLY}"),
    "prompt_logprobs": (lambda _: False, VLLM_ONLY),
    **dict.fromkeys(("regex", "ebnf", "json_schema"), (lambda _: False, f"{SGLANG_ONLY}; use response_format")),
}
UNSUPPORTED = UNIMPLEMENTED | ENGINE_EXTENSIONS  # each accepted at its default (null is), refused otherwise
