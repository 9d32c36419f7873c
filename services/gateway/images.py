"""Image parts of chat messages: validated and measured in the gateway, encoded by the vision stage.

Each image becomes one ``<｜deepseek_image｜>`` placeholder in the rendered prompt; after tokenizing,
the gateway expands it to one position per merged patch (the count follows from the image
size alone), so limits on the prompt length hold before any tower runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from dayzero.chat.tokens import IMAGE
from dayzero.vision.images import ImageError, ImageLimits, PatchSpec, decode, expand, image_bytes, probe, target_size

from .chat_schemas import Message
from .errors import APIError

IMAGE_TAG = IMAGE


@dataclass(frozen=True, slots=True)
class Prompt:
    messages: list[dict]  # OpenAI-shaped, each image as one placeholder tag
    images: list[bytes]
    patches: list[int]  # merged patches (= prompt positions) of each image


def render_chat(messages: list[Message], limits: ImageLimits, spec: PatchSpec, vision: bool) -> Prompt:
    """Messages as plain dicts for the chat encoding (a list content as its part strings, each
    image one placeholder tag), with their images checked: the count first, then each image's
    size from its header, and only then the pixels (call it in a worker thread: decoding is slow)."""
    turns, images, patches = [], [], []
    for i, m in enumerate(messages):
        parts = m.content if isinstance(m.content, list) else [m.content or ""]
        text = []
        for part in parts:
            if isinstance(part, str) or part.type == "text":
                value = part if isinstance(part, str) else part.text
                if IMAGE_TAG in value:
                    raise APIError(400, f"message text must not contain {IMAGE_TAG}", param=f"messages.{i}.content")
                text.append(value)
                continue
            if not vision:
                raise APIError(
                    400,
                    "this checkpoint has no vision tower: image_url parts are not supported",
                    param=f"messages.{i}.content",
                    code="images_unsupported",
                )
            images.append((part.image_url.url, f"messages.{i}.content"))
            text.append(IMAGE_TAG)
        extra = m.model_dump(include={"reasoning_content", "tool_calls", "tool_call_id", "prefix"}, exclude_none=True)
        turns.append({"role": m.role, "content": text if isinstance(m.content, list) else text[0], **extra})
    if len(images) > limits.max_images:
        raise APIError(
            400,
            f"{len(images)} images in one request; the limit is {limits.max_images}",
            param="messages",
            code="too_many_images",
        )
    data = [_checked(url, limits, spec, param, patches) for url, param in images]
    for blob, (_, param) in zip(data, images, strict=True):
        _image_error(lambda blob=blob: decode(blob, limits), param)  # corrupt pixel data: 400 here
    return Prompt(turns, data, patches)


def _checked(url: str, limits: ImageLimits, spec: PatchSpec, param: str, patches: list[int]) -> bytes:
    """The image's bytes, its limits checked from its header; appends its merged-patch count."""

    def measure() -> bytes:
        data = image_bytes(url, limits)
        width, height = probe(data, limits)
        h, w = target_size(height, width, spec)
        patches.append(h * w // (spec.patch_size * spec.merge_size) ** 2)
        return data

    return _image_error(measure, param)


def _image_error(check, param: str):
    try:
        return check()
    except ImageError as exc:
        raise APIError(400, str(exc), param=param, code="invalid_image") from exc


def expand_placeholders(ids: list[int], image_token: int, patches: list[int]) -> list[int]:
    try:
        return expand(ids, image_token, patches)
    except ValueError as exc:
        raise APIError(400, str(exc), param="messages") from exc
