# Common base of every dayzero service image: Python 3.11, the package and its dependencies.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 DAYZERO_CACHE_DIR=/cache
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY shared ./shared
COPY services ./services
RUN pip install .
