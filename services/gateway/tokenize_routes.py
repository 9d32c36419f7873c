"""/tokenize and /detokenize: the exact prompt a request is given, as vLLM shows it."""

from __future__ import annotations

from fastapi import APIRouter

from .chat import check_tool_set, prompted
from .context import encoded, tokenizing
from .errors import APIError
from .json_body import ParsingRoute
from .routes import Authorized, GatewayDep, served, within_context
from .tokenize_schemas import DetokenizeRequest, Tokenized, TokenizeRequest

tokenize_router = APIRouter(route_class=ParsingRoute)


@tokenize_router.post("/tokenize", dependencies=[Authorized])
async def tokenize(body: TokenizeRequest, gw: GatewayDep) -> Tokenized:
    """A prompt's ids as the server would feed them (a chat: rendered, images expanded); one the
    routes would refuse for the context is refused here too (one far over it: untokenized)."""
    served(gw, body.model)
    if body.prompt is None:
        check_tool_set(gw, body)
        ids = (await prompted(gw, body))[0]
    else:
        with tokenizing("prompt"):
            special = body.add_special_tokens is not False  # (vLLM's default for a prompt: added)
            ids = await encoded(gw, body.prompt, gw.context_limit, special)
    within_context(gw, ids, "prompt" if body.messages is None else "messages")
    return Tokenized(tokens=ids, count=len(ids), max_model_len=gw.context_limit)


@tokenize_router.post("/detokenize", dependencies=[Authorized])
async def detokenize(body: DetokenizeRequest, gw: GatewayDep):
    """Ids -> text, special tokens kept; at most the context's (the tokenizer holds the loop: 1 M ids ~1 s)."""
    served(gw, body.model)
    if (n := len(body.tokens)) > gw.context_limit:
        limit = f"{n} token ids; the context limit is {gw.context_limit}"
        raise APIError(400, limit, param="tokens", code="context_length_exceeded")
    if body.tokens and not (min(body.tokens) >= 0 and max(body.tokens) < gw.vocab_size):  # (in C, not a generator)
        raise APIError(400, f"token ids must be in [0, {gw.vocab_size})", param="tokens", code="invalid_value")
    return {"prompt": gw.codec.decode_all(body.tokens)}
