# One image for every PVM process; the command picks the role:
#   docker run pvm dispatch            the dispatcher (pvm dispatch)
#   docker run pvm worker log          a log-pool worker (pvm worker log)
#   docker run pvm log tail --project P
#   docker run pvm serve --mcp         the reader API, with the MCP tools at /mcp
# The log pool writes the durable log under /data: give it a persistent volume.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what `pip install .` needs (see .dockerignore); the source tree is not kept.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY contracts ./contracts
COPY pvm ./pvm
COPY workers ./workers
RUN pip install '.[server,mcp]' && rm -rf /src

# A fixed uid so a host directory mounted at /data can be chowned to match.
RUN groupadd --system --gid 10001 pvm \
    && useradd --system --uid 10001 --gid pvm --home-dir /data --no-create-home --shell /usr/sbin/nologin pvm \
    && mkdir -p /data \
    && chown pvm:pvm /data

# The log lives in $PVM_HOME/var/log, the emitter spool in $PVM_HOME/var/spool.
ENV PVM_HOME=/data
VOLUME ["/data"]
WORKDIR /data
USER pvm

ENTRYPOINT ["pvm"]
CMD ["--help"]
