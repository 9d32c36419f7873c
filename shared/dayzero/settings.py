"""Process settings (environment variables ``DAYZERO_*``), read once at the entry point."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .model.plan import AttentionOptions


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DAYZERO_", frozen=True)

    cache_dir: Path = Field(default=Path.home() / ".cache" / "dayzero", description="where the demo checkpoint lives")
    dtype: str = Field(default="float32", pattern="^(float32|bfloat16)$", description="serving dtype of dense weights")
    prefill_chunk_size: int = Field(default=2048, ge=1, description="prompt tokens per prefill step")
    max_context: int = Field(default=65536, ge=2, description="prompt + completion tokens per request")
    attention_backend: Literal["torch", "triton"] = Field(default="torch", description="kernel backend")
    sparse_attention: bool = Field(default=True, description="CSA layers read only the indexer's top-k entries")

    def attention(self) -> AttentionOptions:
        return AttentionOptions(self.attention_backend, self.sparse_attention)

    @property
    def demo_checkpoint(self) -> Path:
        return self.cache_dir / "demo-checkpoint"
