"""What the gateway's routes share: settings, the bus, the tokenizer, metrics."""

from __future__ import annotations

from dataclasses import dataclass

from dayzero.settings import Settings
from dayzero.tokenizer import IdsOnlyCodec, TextCodec

from .bus import Bus
from .metrics import GatewayMetrics


@dataclass
class Gateway:
    settings: Settings
    bus: Bus
    codec: TextCodec | IdsOnlyCodec
    metrics: GatewayMetrics
    max_positions: int
    vocab_size: int
    image_token: int | None  # None: the checkpoint has no vision tower
    eos_token: int
