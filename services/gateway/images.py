"""Image parts of chat messages: validated and measured in the gateway, encoded by the vision stage.

Each image becomes one ``<｜deepseek_image｜>`` placeholder in the rendered prompt; after tokenizing,
the gateway expands it to one position per merged patch (the count follows from the image
size alone), so limits on the prompt length hold before any tower runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from dayzero.chat.tokens import IMAGE
from dayzero.vision.images import (
    ImageError,
    ImageLimits,
    PatchSpec,
    TooManyPixels,
    decode,
    expand,
    image_bytes,
    probe,
    target_size,
)

from .error_fields import param_path
from .errors import APIError
from .message_schemas import Message, part_text

IMAGE_TAG = IMAGE


@dataclass(frozen=True, slots=True)
class Prompt:
    messages: list[dict]  # OpenAI-shaped, each image as one placeholder tag
    images: list[bytes]
    patches: list[int]  # merged patches (= prompt positions) of each image


def render_chat(messages: list[Message], limits: ImageLimits, spec: PatchSpec, vision: bool) -> Prompt:
    """Messages as plain dicts for the chat encoding (a list content as its part strings, each
    image one placeholder tag; a refusal as a part: Message.rendered_parts), with their images
    checked: the count first, then each image's size from its header and the request's summed
    pixels, and only then the pixels (call it in a worker thread: decoding is slow)."""
    turns, images = [], []
    for i, m in enumerate(messages):
        text = []
        for place, part in m.rendered_parts():
            where = ("messages", i, *place)  # the part's
            if (value := part_text(part)) is not None:
                if IMAGE_TAG in value:  # (a part's text is in the field its type names: text, refusal)
                    param = param_path(where if isinstance(part, str) else (*where, part.type))
                    raise APIError(400, f"message text must not contain {IMAGE_TAG}", param=param, code="invalid_value")
                text.append(value)
                continue
            if not vision:
                raise APIError(
                    400,
                    "this checkpoint has no vision tower: image_url parts are not supported",
                    param=param_path((*where, "type")),
                    code="images_unsupported",
                )
            images.append((part.image_url.url, param_path((*where, "image_url", "url"))))
            text.append(IMAGE_TAG)
        listed = isinstance(m.content, list) or len(text) > 1  # (a content and a refusal: two parts)
        turns.append({**m.rendered_fields(), "content": text if listed else text[0]})
    data, patches = _checked_images(images, limits, spec)
    return Prompt(turns, data, patches)


def _checked_images(
    images: list[tuple[str, str]], limits: ImageLimits, spec: PatchSpec
) -> tuple[list[bytes], list[int]]:
    """(bytes, merged patches) of each (url, param): the count, then each header (its size and the
    request's pixel budget), and only then the pixels, drafted at their target size where cheaper."""
    _within(len(images), limits.max_images, "images", "too_many_images")
    checked = [_checked(url, limits, spec, param) for url, param in images]
    summed = sum(pixels for _, pixels, _ in checked)
    _within(summed, limits.max_total_pixels, "image pixels (width x height, summed)", "too_many_image_pixels")
    for (blob, _, _), (_, param) in zip(checked, images, strict=True):
        _image_error(lambda blob=blob: decode(blob, limits, spec), param)  # corrupt pixel data: 400 here
    return [blob for blob, _, _ in checked], [patches for _, _, patches in checked]


def _within(found: int, limit: int, what: str, code: str) -> None:
    """A per-request image limit: over it, a 400 naming ``messages``."""
    if found > limit:
        raise APIError(400, f"{found} {what} in one request; the limit is {limit}", param="messages", code=code)


def _checked(url: str, limits: ImageLimits, spec: PatchSpec, param: str) -> tuple[bytes, int, int]:
    """(bytes, decoded pixels, merged patches) of one image, its limits checked from its header."""

    def measure() -> tuple[bytes, int, int]:
        data = image_bytes(url, limits)
        width, height = probe(data, limits)
        h, w = target_size(height, width, spec)
        return data, width * height, h * w // (spec.patch_size * spec.merge_size) ** 2

    return _image_error(measure, param)


def _image_error(check, param: str):
    try:
        return check()
    except ImageError as exc:  # one image over the pixel limit: the code of a request's images over theirs
        code = "too_many_image_pixels" if isinstance(exc, TooManyPixels) else "invalid_image"
        raise APIError(400, str(exc), param=param, code=code) from exc


def expand_placeholders(ids: list[int], image_token: int, patches: list[int], param: str) -> list[int]:
    """Each image's placeholder -> its patch positions; a placeholder beyond the images' (the tag
    typed into text that enters the prompt) is a 400 naming ``param``."""
    try:
        return expand(ids, image_token, patches)
    except ValueError as exc:
        why = f"{IMAGE_TAG} stands for an attached image and must not appear in text"
        raise APIError(400, f"{exc}: {why}", param=param, code="invalid_value") from exc
