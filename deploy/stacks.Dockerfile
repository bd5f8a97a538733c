# The stack dumper for any training image: py-spy, run by `trainjob stacks NAME --debug-image <this image>` as an
# ephemeral container beside a pod's training container (sharing its processes, with SYS_PTRACE), so the Python
# stacks of ranks whose image has no trainjob (or whose script does not use trainjob.torch) can be read too:
#   buildah bud -f deploy/stacks.Dockerfile -t <registry>/trainjob-stacks:0.1.0 .    (or docker build ...)
# BASE is any image with Python 3 and its venv module (python:3.11-slim by default).
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG PY_SPY=0.4.3
# Build-time only, never in a layer: a CA bundle for a TLS proxy between the build and PyPI, and a pip cache.
ARG PIP_CERT
ARG PIP_CACHE_DIR
RUN python3 -m venv /opt/py-spy \
 && /opt/py-spy/bin/pip install -q "py-spy==${PY_SPY}" \
 && ln -s /opt/py-spy/bin/py-spy /usr/local/bin/py-spy \
 && rm -rf /root/.cache/pip
