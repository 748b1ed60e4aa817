# memsvc container: bge-small-zh-v1.5 baked in at build time, so the container starts offline.
# --build-arg EMBEDDER=openai builds the slim image instead: no torch, no model; it embeds
# through an OpenAI-compatible server (set MEMSVC_EMBED_URL and MEMSVC_EMBED_MODEL).
FROM python:3.11-slim
ARG EMBEDDER=local

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/opt/hf \
    MEMSVC_LISTEN=0.0.0.0:50051 \
    MEMSVC_DATA_DIR=/data \
    MEMSVC_EMBED_PROVIDER=${EMBEDDER} \
    MEMSVC_EMBED_MODEL=BAAI/bge-small-zh-v1.5 \
    MEMSVC_EMBED_FALLBACK=false \
    MEMSVC_MODEL_CACHE_DIR=/opt/memsvc-model-cache \
    MEMSVC_METRICS_LISTEN=0.0.0.0:9464 \
    MEMSVC_LOG_FORMAT=json

RUN useradd --create-home --uid 10001 memsvc

WORKDIR /app
# CPU build of torch first: a loose torch requirement would pull the CUDA wheels.
RUN if [ "$EMBEDDER" = local ]; then \
      pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu; fi
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY memsvc ./memsvc
# [otel]: traces when the OTEL_* variables ask for them (off otherwise)
RUN if [ "$EMBEDDER" = local ]; then pip install ".[local,otel]"; else pip install ".[otel]"; fi \
    && mkdir -p /data /opt/memsvc-model-cache && chown memsvc:memsvc /data

# Download the model into the image; at run time it is read from HF_HOME with no network.
RUN if [ "$EMBEDDER" = local ]; then \
      python -c "from huggingface_hub import snapshot_download; snapshot_download('BAAI/bge-small-zh-v1.5')" \
      && chmod -R a+rX /opt/hf; fi

ENV HF_HUB_OFFLINE=1
# Export the ONNX graph now, not at the first start (it is most of a cold start's time).
RUN if [ "$EMBEDDER" = local ]; then \
      python -c "from memsvc.config import Settings; from memsvc.embedding.providers import load_embedder; load_embedder(Settings(data_dir='/tmp/build'))" \
      && rm -rf /tmp/build; fi \
    && chown -R memsvc:memsvc /opt/memsvc-model-cache
USER memsvc
VOLUME ["/data"]
# gRPC; Prometheus /metrics, /healthz, /readyz. Add MEMSVC_HTTP_LISTEN=0.0.0.0:8080 and
# publish 8080 for HTTP/JSON.
EXPOSE 50051 9464

# grpc.health.v1 Check against the server itself (no token needed; TLS followed if on).
HEALTHCHECK --interval=15s --timeout=5s --start-period=90s --retries=3 CMD ["memsvc", "health"]

# Listening on 0.0.0.0 needs authentication (memsvc refuses to start otherwise). Mount the
# tokens file, and TLS files if the port leaves the pod, as secrets, e.g.:
#   docker run -v ./tokens:/run/secrets/memsvc_tokens:ro \
#     -e MEMSVC_AUTH_TOKENS_FILE=/run/secrets/memsvc_tokens \
#     -v ./tls:/run/secrets/tls:ro -e MEMSVC_TLS_CERT_FILE=/run/secrets/tls/server.crt \
#     -e MEMSVC_TLS_KEY_FILE=/run/secrets/tls/server.key memsvc
# A tokens file holds one "ROLE TOKEN" line per token (reader, writer, admin); `kill -HUP`
# the server to rotate them.
CMD ["memsvc", "serve"]
