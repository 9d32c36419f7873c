"""Images in, before any tensor: safe decoding with Pillow under limits, Qwen2-VL's target size,
and the placeholder expansion of a prompt (no torch: the gateway uses these).

Accepts base64 ``data:`` URLs and raw bytes; PNG, JPEG (MPO too), WebP, GIF (first frame). Remote
``http(s)`` URLs are refused unless their host is allowed. Every limit violation and every
truncated, corrupt or unsupported input is an ``ImageError`` (the gateway's HTTP 400).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlparse

from PIL import Image, ImageOps, UnidentifiedImageError

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "MPO")  # MPO: a JPEG with more pictures (cameras); the first is served
JPEGS = ("JPEG", "MPO")


class ImageError(ValueError):
    """An image the server refuses; the message says why."""


class TooManyPixels(ImageError):
    """An image over the per-image pixel limit (``ImageLimits.max_pixels``), known from its header."""


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_bytes: int = 10 << 20
    max_pixels: int = 40_000_000  # decoded width x height, checked before decoding the data
    max_images: int = 8
    max_total_pixels: int = 80_000_000  # width x height summed over a request's images, from their headers
    allowed_hosts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PatchSpec:
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280

    @classmethod
    def of(cls, vision_config: Mapping, max_pixels: int) -> PatchSpec:
        """The geometry a checkpoint's ``vision_config`` names (these defaults where it names none), resized
        to at most ``max_pixels``."""
        named = {field: int(vision_config[key]) for field, key in _GEOMETRY.items() if key in vision_config}
        return cls(max_pixels=max_pixels, **named)


_GEOMETRY = {  # PatchSpec's field: the vision_config key naming it
    "patch_size": "patch_size",
    "merge_size": "spatial_merge_size",
    "temporal_patch_size": "temporal_patch_size",
}

DRAFT_MARGIN = 2  # a JPEG is decoded at no less than this many times its target size (see ``decode``)


def image_bytes(url: str, limits: ImageLimits) -> bytes:
    """The encoded bytes behind an ``image_url`` (a base64 data URL; remote hosts refused by default).
    A data URL is read as RFC 2397 and MIME encoders write it: its header in any case, its base64
    broken into lines or in the URL-safe alphabet."""
    if url[:5].lower() == "data:":
        header, _, payload = url.partition(",")
        if ";base64" not in header.lower() or not header.lower().startswith("data:image/"):
            raise ImageError("image data URLs must look like data:image/<type>;base64,<data>")
        payload = "".join(payload.split())  # (76-column lines: base64.encodebytes, the base64 command)
        data = payload.rstrip("=")
        if len(data) * 3 // 4 > limits.max_bytes:  # the decoded size exactly: padding decodes to nothing
            raise ImageError(f"image larger than {limits.max_bytes} bytes")
        urlsafe = "-" in payload or "_" in payload
        if len(data) % 4 != 1:  # padding left out (base64url's usual form; browsers read it): put back
            payload = data + "=" * (-len(data) % 4)
        try:
            return base64.b64decode(payload, altchars=b"-_" if urlsafe else None, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ImageError(f"image data URL is not valid base64: {exc}") from exc
    scheme = urlparse(url).scheme
    if scheme in ("http", "https"):
        host = urlparse(url).hostname or ""
        if host not in limits.allowed_hosts:
            raise ImageError(f"remote image URLs are not allowed (host {host!r}); send a base64 data URL")
        return _fetch(url, limits)
    raise ImageError(f"unsupported image URL scheme {scheme!r}")


def _fetch(url: str, limits: ImageLimits) -> bytes:
    """GET an image from an allowed host: bounded time and bytes, no redirects elsewhere."""
    import httpx

    try:
        with httpx.stream("GET", url, timeout=10, follow_redirects=False) as response:
            if response.status_code != 200:
                raise ImageError(f"fetching the image failed: HTTP {response.status_code}")
            data = bytearray()
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > limits.max_bytes:
                    raise ImageError(f"image larger than {limits.max_bytes} bytes")
            return bytes(data)
    except httpx.HTTPError as exc:
        raise ImageError(f"fetching the image failed: {exc}") from exc


def _open(data: bytes, limits: ImageLimits) -> Image.Image:
    """Pillow's lazy open: the format and size from the header; no pixel data decoded yet."""
    if len(data) > limits.max_bytes:
        raise ImageError(f"image larger than {limits.max_bytes} bytes")
    image = Image.open(io.BytesIO(data))
    if image.format not in FORMATS:
        raise ImageError(f"unsupported image format {image.format}; use PNG, JPEG, WebP or GIF")
    width, height = image.size
    if width * height > limits.max_pixels:
        raise TooManyPixels(f"image of {width}x{height} pixels exceeds the limit of {limits.max_pixels}")
    return image


def _guarded(read, limits: ImageLimits):
    """Run ``read`` with every Pillow failure (bombs, corrupt data) as an ImageError."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return read()
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise TooManyPixels(
            f"image exceeds the limit of {limits.max_pixels} decoded pixels (refused before "
            "decoding: a decompression bomb)"
        ) from exc
    except UnidentifiedImageError as exc:  # its message names Pillow's internal file object
        raise ImageError("not a readable image: the data is in no image format Pillow knows") from exc
    except (OSError, SyntaxError, ValueError) as exc:  # truncated or corrupt data
        raise ImageError(f"corrupt or truncated image: {exc}") from exc


def probe(data: bytes, limits: ImageLimits) -> tuple[int, int]:
    """(width, height) from the image's header alone, with the byte, format and pixel limits checked."""
    return _guarded(lambda: _open(data, limits).size, limits)


def decode(data: bytes, limits: ImageLimits, spec: PatchSpec | None = None) -> Image.Image:
    """Bytes -> RGB image: size checked before decoding, EXIF orientation applied, alpha on white.

    With ``spec``, a JPEG of at least 2 x DRAFT_MARGIN its target size comes back at its target size:
    libjpeg's DCT scaling decodes it at 1/2, 1/4 or 1/8 scale, then the bicubic resize ``patchify``
    would do. Mean absolute difference to a full-size decode + resize: under 2.5/255 (about what
    re-encoding at JPEG quality 75 costs), tests/vision/test_preprocess.py.
    """

    def load() -> tuple[Image.Image, tuple[int, int] | None]:
        image = _open(data, limits)
        size = _draft(image, spec) if spec is not None else None
        image.seek(0)  # GIF: the first frame
        image.load()
        return image, size

    image, size = _guarded(load, limits)
    if size is not None:
        image = image.resize(size, Image.BICUBIC)  # before the EXIF turn: size is in stored orientation
    image = _upright(image)
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def _upright(image: Image.Image) -> Image.Image:
    """The EXIF orientation applied; a damaged EXIF block (Pillow raises SyntaxError, struct.error,
    TypeError, ... parsing or re-writing it) is ignored, as browsers do: the pixels are fine."""
    try:
        return ImageOps.exif_transpose(image)
    except Exception:
        return image


def _draft(image: Image.Image, spec: PatchSpec) -> tuple[int, int] | None:
    """Set a JPEG well over its target size to decode scaled down; the (width, height) it must then
    be resized to, or None where it decodes at full size."""
    if image.format not in JPEGS:
        return None
    height, width = target_size(image.height, image.width, spec)
    if target_size(height, width, spec) != (height, width):  # patchify would resize the target again
        return None
    full = image.size
    image.draft(None, (width * DRAFT_MARGIN, height * DRAFT_MARGIN))
    return None if image.size == full else (width, height)


def target_size(height: int, width: int, spec: PatchSpec) -> tuple[int, int]:
    """Qwen2-VL's smart resize: sides multiples of patch x merge, pixels within [min, max]."""
    factor = spec.patch_size * spec.merge_size
    if max(height, width) / min(height, width) > 200:
        raise ImageError(f"image aspect ratio {max(height, width) / min(height, width):.0f}:1 exceeds 200:1")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > spec.max_pixels:
        beta = math.sqrt(height * width / spec.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < spec.min_pixels:
        beta = math.sqrt(spec.min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def expand(ids: list[int], image_token: int, counts: list[int]) -> list[int]:
    """Each placeholder -> ``counts[i]`` copies (the i-th image's merged patches)."""
    found = sum(1 for t in ids if t == image_token)
    if found != len(counts):
        raise ValueError(f"the prompt has {found} image placeholders for {len(counts)} images")
    out, images = [], iter(counts)
    for t in ids:
        out.extend([t] * next(images) if t == image_token else [t])
    return out
