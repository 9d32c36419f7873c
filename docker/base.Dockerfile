# Common base of every dayzero service image: Python 3.11, the CUDA 12.8 build of torch, the package.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 DAYZERO_CACHE_DIR=/cache
# torch's own log format imports torch._dynamo to print any traceback: 3.5-8 s before a host's
# torchrun exits once rank 0's host stopped (docs/parallel.md); a plain format imports nothing
ENV TORCH_LOGS_FORMAT="%(levelname).1s%(asctime)s %(process)d %(name)s] %(message)s"
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/*
# torch's CUDA 12.8 wheel (it brings the CUDA runtime libraries; the host needs the NVIDIA driver and
# the container toolkit), pinned to pyproject.toml's version, before the package so pip keeps it
RUN pip install --index-url https://download.pytorch.org/whl/cu128 torch==2.13.0
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
RUN pip install .
