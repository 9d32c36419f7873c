"""Process settings (environment variables ``DAYZERO_*``), read once at the entry point."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from . import settings_checks as checks
from .chat.schema_size import MOST_TOOLS, SchemaLimits
from .redis_urls import sentinel_address

if TYPE_CHECKING:  # (Pillow: imported where the image limits are built, the gateway and vision, not by every command)
    from .vision.images import ImageLimits, PatchSpec

BUILT_IN_MODEL = Path(__file__).parent / "train" / "demo_model"  # written by ``dayzero train-demo``, shipped
# the most of a GPU its workers' weights and attention state may take together: the fraction counts what torch's
# allocator reserves, and each process's CUDA context (~0.5 GiB), cuBLAS and NCCL workspaces and the activations
# lie outside it (vLLM takes up to 1.0 of what it measures, those included): 4 GiB of an 80 GiB H100 left for them
MOST_KV_MEMORY_FRACTION = 0.95
REDIS_ANSWER_WITHIN_S = 10.0  # an external Redis that has not answered a ping by then is a failed start


def _served_redis_url(url: str) -> str:
    sentinel_address(url)  # (its ValueError for any other URL: kombu reads no unix://)
    return url


class Settings(BaseSettings):
    # (no float setting is infinite or NaN: DAYZERO_REDIS_ANSWER_WITHIN_S=inf waited for ever, =nan was refused
    # as not "greater than 0")
    model_config = SettingsConfigDict(env_prefix="DAYZERO_", frozen=True, allow_inf_nan=False)

    cache_dir: Path = Field(default=Path.home() / ".cache" / "dayzero", description="where the demo checkpoint lives")
    dtype: str = Field(
        default="float32", pattern="^(float32|bfloat16)$", description="dense weights: float32 or bfloat16"
    )
    prefill_chunk_size: int = Field(
        default=2048,
        ge=1,
        description="most tokens of one prompt per prefill step (at most DAYZERO_MAX_PREFILL_TOKENS); a longer "
        "prompt runs over several steps, its chunks shrunk to leave newly arrived prompts room",
    )
    prefill_pass_s: float = Field(
        default=2.0,
        ge=0,
        description="a prompt longer than a chunk waits at most this long after its admission while shorter prompts "
        "under way fill the prefill step; then it starts beside them and has its share of every step",
    )
    max_context: int = Field(default=65536, ge=2, description="prompt + completion tokens per request")
    image_max_bytes: int = Field(default=10 << 20, ge=1, description="encoded bytes per image")
    image_max_pixels: int = Field(
        default=40_000_000,
        ge=1,
        le=89_478_485,  # Pillow's own decompression-bomb bound (Image.MAX_IMAGE_PIXELS) refuses past it anyway
        description="decoded pixels per image (bomb guard; the most is Pillow's own bound)",
    )
    image_max_count: int = Field(default=8, ge=0, description="images per request")
    image_max_total_pixels: int = Field(
        default=80_000_000, ge=1, description="decoded pixels of all images of a request, summed (cost guard)"
    )
    image_allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default=[], description="hosts remote image URLs may come from, comma-separated (or a JSON list)"
    )
    image_resize_max_pixels: int = Field(default=28 * 28 * 256, ge=28 * 28, description="pixels after resize")
    encoder_cache_mb: int = Field(default=64, ge=0, description="image embeddings kept for repeated images")
    expert_cache_mb: int = Field(default=256, ge=0, description="dequantized FP4 experts kept hot (0: off)")
    device: str = Field(
        default="cpu", pattern=r"^(cpu|cuda(:\d+)?)$", description="where weights and pools live: cpu, cuda or cuda:N"
    )
    attention_backend: Literal["torch", "triton"] = Field(
        default="torch", description="kernels: torch, or triton (a GPU)"
    )
    sparse_attention: bool = Field(default=True, description="CSA layers read only the indexer's top-k entries")
    decode_graphs: bool = Field(
        default=False,
        description="replay decode steps from CUDA graphs, one per batch and length bucket (triton backend, one rank)",
    )
    speculative_tokens: int = Field(
        default=0, ge=0, le=2, description="tokens the MTP layer drafts per decode step (0: no speculation)"
    )

    # serving
    checkpoint: Path | None = Field(default=None, description="checkpoint served (default: the built-in trained model)")
    redis_url: Annotated[str, AfterValidator(_served_redis_url)] = Field(
        default="redis://127.0.0.1:6379/0",
        description="broker, token streams, leases: redis://, rediss:// (TLS), or redis+sentinel://",
    )
    model_name: str = Field(default="dayzero-demo", description="the model id the API serves")
    api_keys: Annotated[list[str], NoDecode] = Field(
        default=[], description="accepted Bearer keys, comma-separated (or a JSON list); empty: no authentication"
    )
    metrics_auth: bool = Field(default=False, description="the gateway's /metrics asks for an API key too")
    host: str = Field(default="127.0.0.1", description="gateway bind address")
    port: int = Field(default=8000, ge=1, le=65535, description="gateway port")
    max_queued: int = Field(default=64, ge=1, description="queued requests per stage before 429")
    max_streams: int = Field(default=1024, ge=1, description="open streams (and waiting bodies) before 429")
    max_request_bytes: int = Field(default=8 << 20, ge=1024, description="largest request body")
    max_tokens_limit: int = Field(default=4096, ge=1, description="most completion tokens a request may ask for")
    max_tools: int = Field(default=128, ge=0, le=MOST_TOOLS, description="tools a chat may offer")
    # llguidance's compile grows about quadratically in a schema's properties (8,000: up to 26 s of CPU, then refused)
    guided_max_schema_nodes: int = Field(
        default=3000,
        ge=1,
        description="subschemas (properties, items, branches, definitions) of a request's enforced schemas "
        "(response_format, or the forced tools' parameters), together: 400 beyond, before any compile",
    )
    guided_max_literal_chars: int = Field(
        default=120_000, ge=1, description="characters of the enum and const values of those schemas: 400 beyond"
    )
    guided_max_pattern_chars: int = Field(
        default=10_000, ge=1, description="characters of the regular expressions of those schemas: 400 beyond"
    )
    max_batch: int = Field(
        default=16, ge=1, le=4096, description="sequences per decode step; concurrent decode tasks (tested to 3000)"
    )
    max_prefill_tokens: int = Field(
        default=8192, ge=1, description="prompt tokens per packed prefill step, every prompt's chunk together"
    )
    kv_budget_mb: int | None = (
        Field(  # (at most 1 TiB: the pools' block lists are built from it, 8 bytes a block, ~1 s a TiB)
            default=None, ge=1, le=1 << 20, description="attention-state memory per worker"
        )
    )
    kv_memory_fraction: float = Field(
        default=0.8,
        gt=0,
        le=MOST_KV_MEMORY_FRACTION,
        description="unset DAYZERO_KV_BUDGET_MB on CUDA: the share of the device's whole memory a worker's weights "
        "and attention state take together (the rest: activations, the expert cache); unset, up splits it between "
        "the prefill and decode workers it places on one GPU, set, it is each worker's own; the workers on one GPU "
        "together take at most the bound (CUDA contexts and workspaces lie outside it)",
    )
    block_size: int = Field(default=16, ge=1, description="rows per pool block")
    lease_s: float = Field(  # (at most 600: workers beat every quarter lease, and a registry forgets one silent 600 s)
        default=3.0, gt=0, le=600, description="a worker that stops heartbeating loses its requests after this"
    )
    handoff_timeout_s: float = Field(default=60.0, gt=0, description="a handoff decode has not taken after this lapses")
    handoff: Literal["shm", "cuda_ipc", "redis"] = Field(
        default="shm",
        description="KV handoff transport: shm (CPU, same host), cuda_ipc (same GPU), redis (any)",
    )
    handoff_ids: Literal["lists", "bytes"] = Field(
        default="bytes",
        description="how prefill's handoff message names the state's blocks: bytes (int64, a longer message: "
        "quicker to parse past a few hundred tokens, and to copy; decode workers read them since the release "
        "before this one) or lists (what every version reads: set it while an older decode worker runs)",
    )
    disconnect_grace_s: float = Field(
        default=5.0, ge=0, description="a disconnected stream is cancelled after (above EventSource's ~3 s retry)"
    )
    refused_cancel_after_s: float = Field(
        default=7.0,
        ge=0,
        description="a stream cancel Redis refused goes this long after while another gateway runs on the Redis "
        "(a resume there may take the stream back); alone: at once; 0: at once always",
    )
    gateway_redis_timeout_s: float = Field(
        default=10.0, gt=0, description="the gateway's Redis commands (its streams' reads: past their block) fail after"
    )
    sse_retry_ms: int = Field(default=1000, ge=0, description="reconnect delay sent to SSE clients (retry:)")
    shutdown_grace_s: float = Field(default=5.0, gt=0, description="SIGTERM: a process ends within this")
    keepalive_s: float = Field(default=10.0, gt=0, description="SSE comment interval while waiting")
    stream_ttl_s: int = Field(default=600, ge=1, description="finished token streams stay resumable this long")
    task_time_limit_s: int = Field(
        default=3600,
        ge=1,
        description="a request still generating (or waiting: for room, in a queue) this long after admission ends "
        "(finish_reason length; one that streamed nothing: 503 overloaded); a prefill forward running this "
        "long is hung: its leases lapse",
    )
    frozen_worker_s: float = Field(
        default=30.0,
        ge=0,
        description="dayzero up restarts a worker process that stamped no liveness for this long: SIGSTOPped, or "
        "hung in a step past its bound (a loading worker stamps; a long forward does not stop it; 0: never)",
    )
    start_exits: int = Field(default=3, ge=1, description="dayzero up gives up on a child exiting this often unready")
    redis_answer_within_s: float = Field(
        default=REDIS_ANSWER_WITHIN_S,
        gt=0,
        description="dayzero up gives up on an external Redis (DAYZERO_REDIS_URL) that has not answered a ping by then",
    )
    credentials_refused_s: float = Field(
        default=30.0,
        gt=0,
        description="a worker whose broker connection (a gateway whose reaper) Redis refuses its credentials (a "
        "password changed; a worker's user refused a command: NOPERM) this long exits 3, for its supervisor (dayzero "
        "up, compose) to start it again with its current settings (a gateway refused a command serves on: /ready says "
        "which)",
    )
    no_worker_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="a request waiting this long at a stage with no ready live worker (a loading or crash-looping "
        "one does not count) ends: 503 no_worker (a stream: an error event); one behind others on a live one waits on",
    )
    tensor_parallel: int = Field(
        default=1, ge=1, description="ranks per prefill / decode worker, the model split over them (one GPU each)"
    )
    group_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="ranks that do not all meet, or a rank gone silent, fail the group after; a vision encode "
        "or decode step running this long is hung: its leases lapse; so is a prefill or decode loop blocked "
        "this long between steps (its worker stamps no liveness)",
    )

    # observability
    trace_exporter: Literal["none", "console", "otlp-http", "otlp-grpc"] = Field(
        default="none", description="where spans go: none, console, otlp-http or otlp-grpc"
    )
    trace_endpoint: str | None = Field(
        default=None,
        description="OTLP collector: a host alone (its port follows the exporter: otlp-grpc 4317, otlp-http 4318), "
        "host:port (otlp-http: http://host:port; otlp-grpc: TLS unless OTEL_EXPORTER_OTLP_INSECURE=true), or a "
        "URL, otlp-grpc http://host:4317, otlp-http http://host:4318 (/v1/traces added to a URL without a path) "
        "(default: the exporter's, on localhost)",
    )
    trace_file: Path | None = Field(
        default=None, description="console exporter: append JSON spans to this file (a directory: one per process)"
    )
    metrics_port: int | None = Field(default=None, ge=1, le=65535, description="workers' /metrics (up: P, P + 1, ...)")

    @field_validator("api_keys", "image_allowed_hosts", mode="before")
    @classmethod
    def _comma_list(cls, value: object, info: ValidationInfo) -> object:
        return checks.comma_list(value, keep_empty=info.field_name == "api_keys")

    @field_validator("api_keys")
    @classmethod
    def _keys_a_client_can_send(cls, keys: list[str]) -> list[str]:
        return checks.keys_a_client_can_send(keys)

    @model_validator(mode="before")
    @classmethod
    def _handoff_follows_the_device(cls, data: object) -> object:
        return checks.handoff_follows_the_device(data)

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        checks.fits_device(self)
        checks.a_chunk_fits_a_step(self)
        return self

    def require_device(self) -> None:
        """Refuse a CUDA device this host does not have, for the commands that compute (imports torch)."""
        checks.device_on_this_host(self.device)

    def image_limits(self) -> ImageLimits:
        from .vision.images import ImageLimits

        return ImageLimits(
            max_bytes=self.image_max_bytes,
            max_pixels=self.image_max_pixels,
            max_images=self.image_max_count,
            max_total_pixels=self.image_max_total_pixels,
            allowed_hosts=tuple(self.image_allowed_hosts),
        )

    def schema_limits(self) -> SchemaLimits:
        return SchemaLimits(
            nodes=self.guided_max_schema_nodes,
            literal_chars=self.guided_max_literal_chars,
            pattern_chars=self.guided_max_pattern_chars,
        )

    def patch_spec(self, vision_config: Mapping | None = None) -> PatchSpec:
        """The resize budget of these settings on the patch geometry of the checkpoint's
        ``vision_config`` (PatchSpec's, Qwen2.5-VL's 14 / 2x2 / 2, where it names none)."""
        from .vision.images import PatchSpec

        return PatchSpec.of(vision_config or {}, self.image_resize_max_pixels)

    def checkpoint_dir(self) -> Path:
        """The configured checkpoint, else the trained demo model the package ships, else a random
        demo checkpoint in ``cache_dir`` (written by the first process that needs it; only that one
        imports torch)."""
        if self.checkpoint is not None:
            return self.checkpoint
        if (BUILT_IN_MODEL / "model.safetensors").exists():
            return BUILT_IN_MODEL
        demo = self.cache_dir / "demo-checkpoint-v4-release"
        if not (demo / "model.safetensors").exists():
            from .demo import ensure_demo_checkpoint

            ensure_demo_checkpoint(demo)
        return demo

    @property
    def visibility_timeout_s(self) -> int:
        """Above the longest allowed generation, so a running task is never redelivered."""
        return self.task_time_limit_s + 600
