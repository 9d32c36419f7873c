"""Preprocessing against transformers' Qwen2-VL image processor, and one test per refusal."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageOps

from dayzero.vision.images import ImageError, ImageLimits, PatchSpec, decode, image_bytes, target_size
from dayzero.vision.preprocess import process

from .conftest import encoded

ODD = [
    (37, 91, "PNG", "RGB"),
    (200, 113, "JPEG", "RGB"),
    (61, 29, "WEBP", "RGB"),
    (90, 44, "GIF", "L"),
    (123, 77, "PNG", "RGBA"),
    (15, 15, "PNG", "L"),
]


def test_pixel_values_match_transformers_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    datas = [encoded(w, h, fmt, mode, seed=i) for i, (w, h, fmt, mode) in enumerate(ODD)]
    reference = Qwen2VLImageProcessorPil()(images=[Image.open(io.BytesIO(d)) for d in datas], return_tensors="pt")
    pixels, grid = process([decode(d, ImageLimits()) for d in datas], PatchSpec())
    assert torch.equal(grid, reference["image_grid_thw"])
    assert (pixels - reference["pixel_values"]).abs().max().item() < 1e-5


def test_alpha_is_composited_on_white_and_exif_orientation_applied():
    transparent = encoded(30, 20, "PNG", "RGBA")
    image = Image.open(io.BytesIO(transparent)).convert("RGBA")
    image.putalpha(0)
    buf = io.BytesIO()
    image.save(buf, "PNG")
    assert decode(buf.getvalue(), ImageLimits()).getpixel((3, 4)) == (255, 255, 255)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    buf = io.BytesIO()
    Image.new("RGB", (40, 10), (200, 10, 10)).save(buf, "JPEG", exif=exif)
    assert decode(buf.getvalue(), ImageLimits()).size == (10, 40)


def _bomb() -> bytes:
    buf = io.BytesIO()
    Image.new("1", (20000, 20000)).save(buf, "PNG")  # 400 M pixels in a few KB
    return buf.getvalue()


@pytest.mark.parametrize(
    ("make", "limits", "message"),
    [
        (lambda: encoded(64, 64), ImageLimits(max_bytes=100), "larger than 100 bytes"),
        (_bomb, ImageLimits(), "exceeds the limit"),
        (lambda: encoded(64, 64)[:200], ImageLimits(), "corrupt or truncated|not a readable"),
        (lambda: b"definitely not an image", ImageLimits(), "not a readable image"),
        (lambda: encoded(16, 16, "BMP"), ImageLimits(), "unsupported image format BMP"),
    ],
)
def test_each_refusal_is_a_clear_error(make, limits, message):
    with pytest.raises(ImageError, match=message):
        decode(make(), limits)


def test_urls_remote_refused_and_data_urls_checked():
    data = encoded(8, 8)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    assert image_bytes(url, ImageLimits()) == data
    wrapped = base64.encodebytes(data).decode()  # 76-column lines, as MIME encoders write
    urlsafe = base64.urlsafe_b64encode(data).decode()
    assert "\n" in wrapped and ("-" in urlsafe or "_" in urlsafe)
    for variant in ("DATA:IMAGE/PNG;BASE64," + wrapped, "data:image/png;base64," + urlsafe):  # (both 400s)
        assert image_bytes(variant, ImageLimits()) == data
    with pytest.raises(ImageError, match="remote image URLs are not allowed"):
        image_bytes("https://example.com/cat.png", ImageLimits())
    with pytest.raises(ImageError, match="not valid base64"):
        image_bytes("data:image/png;base64,@@@", ImageLimits())
    with pytest.raises(ImageError, match="data:image"):
        image_bytes("data:text/plain;base64,aGk=", ImageLimits())
    with pytest.raises(ImageError, match="larger than"):
        image_bytes(url, ImageLimits(max_bytes=10))


def test_extreme_aspect_ratio_refused():
    with pytest.raises(ImageError, match="aspect ratio"):
        process([Image.new("RGB", (3000, 10))], PatchSpec())


def test_allowed_hosts_are_fetched_with_limits(tmp_path):
    import functools
    import http.server
    import threading

    (tmp_path / "cat.png").write_bytes(encoded(20, 20))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        allowed = ImageLimits(allowed_hosts=("127.0.0.1",))
        assert image_bytes(f"{base}/cat.png", allowed) == (tmp_path / "cat.png").read_bytes()
        with pytest.raises(ImageError, match="HTTP 404"):
            image_bytes(f"{base}/missing.png", allowed)
        with pytest.raises(ImageError, match="larger than"):
            image_bytes(f"{base}/cat.png", ImageLimits(max_bytes=50, allowed_hosts=("127.0.0.1",)))
        with pytest.raises(ImageError, match="not allowed"):
            image_bytes(f"{base}/cat.png", ImageLimits())
    finally:
        server.shutdown()


def _photo_jpeg(width: int, height: int, orientation: int) -> bytes:
    """Smooth colour areas crossed by thin lines and text (what scaled JPEG decoding blurs most)."""
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 255, (9, 12, 3), dtype=np.uint8)).resize((width, height), Image.BICUBIC)
    draw = ImageDraw.Draw(image)
    for x in range(0, width, 37):
        draw.line([(x, 0), (width - x, height)], fill=(x % 255, 0, 120), width=3)
    for y in range(0, height, 23):
        draw.text((y % width, y), "dayzero", fill="black")
    exif = Image.Exif()
    exif[0x0112] = orientation  # 6: shown turned 90 degrees
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90, exif=exif)
    return buf.getvalue()


@pytest.mark.parametrize(("width", "height", "orientation"), [(4032, 3024, 1), (4032, 3024, 6), (1700, 5000, 1)])
def test_large_jpeg_is_decoded_scaled_down_close_to_a_full_size_resize(width, height, orientation):
    spec = PatchSpec(max_pixels=28 * 28 * 256)
    data = _photo_jpeg(width, height, orientation)
    full = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")  # reference: full-size decode
    h, w = target_size(full.height, full.width, spec)
    reference = np.asarray(full.resize((w, h), Image.BICUBIC), dtype=np.int16)
    drafted = decode(data, ImageLimits(), spec)
    assert drafted.size == (w, h)  # at its target size: patchify keeps it, patches as the gateway counted
    difference = np.abs(np.asarray(drafted, dtype=np.int16) - reference)
    assert difference.mean() < 2.5 and np.percentile(difference, 99) <= 16  # of 255
    assert torch.equal(process([drafted], spec)[1], process([full], spec)[1])


def test_jpeg_under_four_times_its_target_size_decodes_at_full_size():
    data = encoded(1000, 900, "JPEG")
    assert decode(data, ImageLimits(), PatchSpec(max_pixels=28 * 28 * 256)).size == (1000, 900)


@pytest.mark.parametrize("exif", [b"hello exif world", b"II*\x01\x08\x00\x00\x00\x00\x00\x00\x00"])
def test_a_damaged_exif_block_leaves_the_pixels_served(exif):
    """Pillow raises reading a damaged EXIF block (a 500 for 7% of mutated ones): the image is served
    as stored, as browsers do."""
    out = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(out, "PNG", exif=exif)
    image = decode(out.getvalue(), ImageLimits())
    assert image.size == (40, 30) and image.getpixel((0, 0)) == (10, 200, 30)


def test_a_multi_picture_jpeg_is_served_as_its_first_picture():
    """Cameras write JPEGs with an MPF segment and a second picture; Pillow calls them MPO, and
    transformers' processor (and browsers) take the first picture."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    first = Image.open(io.BytesIO(encoded(300, 200, "JPEG", seed=4)))
    buf = io.BytesIO()
    first.save(buf, "MPO", save_all=True, append_images=[Image.new("RGB", (300, 200))], quality=95)
    assert Image.open(io.BytesIO(buf.getvalue())).format == "MPO"
    spec = PatchSpec(max_pixels=28 * 28 * 16)
    pixels, grid = process([decode(buf.getvalue(), ImageLimits(), spec)], spec)
    reference = Qwen2VLImageProcessorPil(max_pixels=spec.max_pixels)(images=[Image.open(buf)], return_tensors="pt")
    assert torch.equal(grid, reference["image_grid_thw"])
    assert (pixels - reference["pixel_values"]).abs().max().item() < 1e-5


@pytest.mark.parametrize(("size", "accepted"), [(99, True), (100, True), (101, False), (102, False)])
def test_a_data_url_of_exactly_the_byte_limit_is_accepted(size, accepted):
    """The limit is on the decoded bytes: 100 bytes base64 to 136 characters with 2 of padding
    (136 x 3 / 4 = 102 was held against a limit of 100)."""
    data = bytes(range(size))
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    if accepted:
        assert image_bytes(url, ImageLimits(max_bytes=100)) == data
    else:
        with pytest.raises(ImageError, match="larger than 100 bytes"):
            image_bytes(url, ImageLimits(max_bytes=100))


def test_base64_without_its_padding_is_read_as_browsers_read_it():
    data = bytes(range(100))  # 100 = 33 x 3 + 1: two padding characters left out
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        assert image_bytes("data:image/png;base64," + encode(data).decode().rstrip("="), ImageLimits()) == data
    with pytest.raises(ImageError, match="not valid base64"):
        image_bytes("data:image/png;base64,QUJDR", ImageLimits())  # 5 characters: no padding makes that whole
