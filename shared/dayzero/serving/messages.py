"""Messages between the stages: small pydantic models, JSON on the broker."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler, field_validator

from ..chat.grammar import holds_calls_only
from ..params import MAX_LOGPROBS, SamplingParams

SAME_LAYOUT = (  # what a handoff's layout hash covers, as settings
    "prefill and decode workers need the same checkpoint, DAYZERO_BLOCK_SIZE, DAYZERO_DTYPE and "
    "DAYZERO_SPECULATIVE_TOKENS"
)


class Frozen(BaseModel):
    # a field it does not know is ignored, in the sampling parameters too: a message or a record of a
    # later version (a rolling upgrade) is read as it was before the field came
    model_config = ConfigDict(frozen=True, extra="ignore")


class GenerationRequest(Frozen):
    request_id: str
    kind: Literal["chat", "completion"] = "completion"  # the API shape its stream is served in
    prompt_ids: tuple[int, ...]  # image placeholders already expanded to one position per merged patch
    sampling: SamplingParams  # by field name on the wire; checked again when a stage rebuilds it
    created: float  # unix time the gateway accepted it
    images: int = 0  # images whose embeddings fill the placeholder positions (their bytes wait in Redis)
    echo: bool = False  # a completion that starts with its prompt
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)  # with echo: the prompt's too
    thinking: bool = False  # a chat in thinking mode: its text opens with the reasoning
    tool_calls: bool = False  # a chat offered tools: DSML calls in its text are reported as tool_calls
    usage_in_stream: bool = False  # a streamed answer ends with a usage chunk (stream_options.include_usage)
    response_id: str = ""  # the response it is one choice of (several prompts, or n > 1); "": its own
    choice: int = Field(default=0, ge=0)  # its index among that response's choices
    prompt_index: int = Field(default=0, ge=0)  # its prompt's index in that response (a completions list)
    trace: dict[str, str] = {}  # W3C trace context of its gateway.request span (kept with it: a re-run stays in it)

    @property
    def calls_only(self) -> bool:
        """Its answer is held to calls (tool_choice required / named): a cut text is no content. Read
        from its grammar, which its record carries: a field of its own stayed on the admitting gateway
        (the previous version refuses one it does not know), and a stream resumed from the record
        showed a cut block's opening ("\\n\\n<") as content, as an "auto" answer does."""
        grammar = self.sampling.grammar
        return self.tool_calls and grammar is not None and holds_calls_only(grammar.lark)


def _empty(value: object) -> bool:
    return not value


class StateRef(Frozen):
    """Where a prefilled sequence's attention state waits for decode (a lease on prefill's blocks).

    Its block ids travel as ``block_ids`` (int64 bytes, kind after kind, base64 in JSON:
    ``kv.handoff.ids_bytes``; faster to parse, and copied as they are: DAYZERO_HANDOFF_IDS=bytes, the
    default) or ``blocks`` (lists: what every version reads, ``lists``), never both. Decode reads
    either; a decode of a version before ``block_ids`` (two releases back) refuses a message with them
    (an unknown field, or no ``blocks``): ``lists`` is for a fleet that still runs one."""

    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    transport: Literal["shm", "cuda_ipc", "redis"]
    location: str  # shared-memory segment name, CUDA IPC handle of the pools, or Redis key
    host: str
    layout_hash: str
    dtype: str
    pool_blocks: dict[str, int]  # block counts of the source pools (to attach to the segment)
    length: int = Field(ge=0)  # (below 0: blocks_of counts -1 compressed blocks, alloc refuses those unclearly)
    blocks: dict[str, tuple[int, ...]] = Field(default={}, exclude_if=_empty)
    block_ids: bytes = Field(default=b"", exclude_if=_empty)
    holder: str = ""  # the prefill worker keeping the blocks, told when decode has taken them

    @field_validator("block_ids", mode="wrap")
    @classmethod
    def _kept_for_refusal(cls, value: object, handler: ValidatorFunctionWrapHandler) -> bytes:
        """Ids that are no base64 are read as one byte, which no state's ids fit: the import refuses
        them as it does ids that do not fit (decode gives the request back), not the whole message."""
        try:
            return handler(value)
        except ValidationError:
            return b"?"


class TensorRef(Frozen):
    """A tensor parked outside the broker: a shared-memory segment (same host) or a Redis key."""

    transport: Literal["shm", "redis"]
    location: str
    host: str
    shape: tuple[int, ...]


class PrefillJob(Frozen):
    request: GenerationRequest
    generated: tuple[int, ...] = ()  # tokens already streamed (a re-prefill after a failure)
    attempt: int = 0
    embeddings: TensorRef | None = None  # the images' merged-patch embeddings, set by the vision stage


def prefill_job_json(request_json: str) -> str:
    """A new request's ``PrefillJob`` as JSON, from the request's own JSON (its other fields left to
    their defaults): the gateway serializes a request once, for its record and its message."""
    return f'{{"request":{request_json}}}'


class DecodeJob(Frozen):
    request: GenerationRequest
    generated: tuple[int, ...]  # streamed so far; the last one is not yet in the state
    state: StateRef
    attempt: int = 0
