"""Capacity without cliffs, measured: (1) how long ``/health`` waits while requests with eight
large PNGs each are checked (images off the event loop), (2) 256 concurrent streams: each one
completes or is refused with 429 + Retry-After, none cut off.

Starts its own stack (demo checkpoint with a vision tower; the image requests wait at the vision
queue, no worker is needed for part 1). Run: ``python bench/capacity.py [--streams 256]``.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import concurrent.futures
import io
import json
import threading
import time

import httpx
import numpy as np
from options import bench_parser
from PIL import Image

MODEL = "dayzero-demo"


def big_png(side: int, seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 255, (side, side, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def health_under_images(url: str, requests: int, side: int) -> list[float]:
    """``/health`` round trips (probed from a thread of its own) while the image requests are sent;
    the bodies are encoded beforehand so the client's own JSON work does not delay the probe."""
    parts = [{"type": "image_url", "image_url": {"url": big_png(side, i)}} for i in range(8)]
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": parts}], "max_tokens": 1}).encode()
    waits, done = [], threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=120) as client:
            while not done.is_set():
                start = time.perf_counter()
                client.get(f"{url}/health")
                waits.append(time.perf_counter() - start)
                time.sleep(0.05)

    def send() -> int:
        headers = {"content-type": "application/json"}
        return httpx.post(f"{url}/v1/chat/completions", content=body, headers=headers, timeout=300).status_code

    prober = threading.Thread(target=probe)
    prober.start()
    with concurrent.futures.ThreadPoolExecutor(requests) as pool:
        statuses = list(pool.map(lambda _: send(), range(requests)))
    done.set()
    prober.join()
    print(f"image requests ({len(body) >> 20} MiB each) answered {statuses}")
    return waits


async def streams(url: str, count: int) -> collections.Counter:
    async def one(client: httpx.AsyncClient, i: int) -> str:
        body = {"model": MODEL, "prompt": [0, 5, 6, 7 + i % 50], "max_tokens": 8, "ignore_eos": True, "stream": True}
        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
            lines = [line async for line in r.aiter_lines() if line.startswith("data:")]
        if r.status_code == 429:
            return "429" if r.headers.get("retry-after") else "429 without Retry-After"
        ended = lines[-1:] == ["data: [DONE]"] and '"error"' not in "".join(lines)
        return "completed" if r.status_code == 200 and ended else f"cut off ({r.status_code})"

    limits = httpx.Limits(max_connections=count + 8)
    async with httpx.AsyncClient(limits=limits, timeout=300) as client:
        return collections.Counter(await asyncio.gather(*(one(client, i) for i in range(count))))


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--image-requests", type=int, default=3)
    parser.add_argument("--side", type=int, default=1500, help="PNG side in pixels (8 per request, noise)")
    args = parser.parse_args()

    from demo_stack import demo_stack, scratch

    workers = {"vision": 1, "prefill": 1, "decode": 2}
    settings = {"DAYZERO_IMAGE_RESIZE_MAX_PIXELS": str(28 * 28 * 64), "DAYZERO_MAX_REQUEST_BYTES": str(128 << 20)}
    with scratch() as tmp, demo_stack(tmp, workers, settings, fp4=True, vision=True) as stack:
        waits = health_under_images(stack.url, args.image_requests, args.side)
        print(
            f"/health while {args.image_requests} requests x 8 PNGs of {args.side}^2 are checked: "
            f"{len(waits)} probes, median {np.median(waits) * 1000:.1f} ms, max {max(waits) * 1000:.1f} ms"
        )
        start = time.perf_counter()
        outcomes = asyncio.run(streams(stack.url, args.streams))
        print(f"{args.streams} concurrent streams in {time.perf_counter() - start:.1f} s: {dict(outcomes)}")


if __name__ == "__main__":
    main()
