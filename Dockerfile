# chatwoot-router: one image for the ingress, the workers, the sandbox and the demo.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY schemas ./schemas
COPY projections ./projections
COPY handlers ./handlers
COPY streams ./streams
COPY sandbox ./sandbox
RUN pip install --no-cache-dir .
RUN useradd --create-home router && mkdir -p /var/lib/chatwoot-router && chown router /var/lib/chatwoot-router
USER router
ENV ROUTER_DATA_DIR=/var/lib/chatwoot-router
ENTRYPOINT ["chatwoot-router"]
CMD ["--help"]
