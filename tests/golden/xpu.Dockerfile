# Rendered by `builder render` from templates/: do not edit; change matrix.yaml or templates/.
# Target xpu: backend xpu, torch 2.8.0+xpu
#
# Stages, in cache order: common (byte-identical in every target) -> torch (this backend's
# wheels) -> runtime (the in-image runtime, the layer that changes most). Wheels come from the
# builder's wheel server on loopback (the build runs with --network host), are checked against
# the hash locks and never stay in a layer; no cache, CA bundle or credential does either.

# The shared base, pinned by digest per platform in base.lock.json. `builder build` passes the
# platform's pin as BASE and its architecture as TARGETARCH (BuildKit sets TARGETARCH itself):
#   linux/amd64  registry.example:5000/debian@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
ARG BASE
FROM ${BASE} AS common
ARG TARGETARCH
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN groupadd --gid 1001 app \
 && useradd --uid 1001 --gid 1001 --create-home --shell /bin/bash app \
 && python3 -m venv --without-pip /opt/venv \
 && install -d -o 1001 -g 1001 /workspace
WORKDIR /workspace
COPY images/tools.${TARGETARCH}.lock images/common.${TARGETARCH}.lock /opt/locks/
# uv (tools.lock) runs from /tmp/uv for this step only, bootstrapped by Debian's pip wheel; the
# venv's own pip comes from common.lock, hash-checked like everything else.
RUN set -- /usr/share/python-wheels/pip-*.whl \
 && python3 "$1/pip" install --no-index --no-deps --require-hashes \
      --find-links http://builder-wheelhouse:38611/ --trusted-host builder-wheelhouse --target /tmp/uv -r "/opt/locks/tools.$TARGETARCH.lock" \
 && /tmp/uv/bin/uv pip install --python /opt/venv/bin/python --no-cache --no-index --no-deps --require-hashes \
      --find-links http://builder-wheelhouse:38611/ -r "/opt/locks/common.$TARGETARCH.lock" \
 && rm -rf /tmp/uv

FROM common AS torch
ARG TARGETARCH
COPY images/xpu/requirements.${TARGETARCH}.lock /opt/locks/
# Bytecode only for what start-up imports (the user cannot write it at run time): fast starts
# without compiling every module of every package into the image. EMULATED is set when this
# platform is built under qemu on another architecture: there importing torch crashes (its
# aarch64 oneDNN reads the host's x86 CPU topology from /sys), so those packages are compiled
# whole instead, without importing them: a larger image, the same fast start. Like pip, that
# skips the files not meant for this Python (torch ships a few for 3.12).
ARG EMULATED
RUN pip install --no-index --no-deps --require-hashes --find-links http://builder-wheelhouse:38611/ --trusted-host builder-wheelhouse \
      --target /tmp/uv -r "/opt/locks/tools.$TARGETARCH.lock" \
 && /tmp/uv/bin/uv pip install --python /opt/venv/bin/python --no-cache --no-index --no-deps --require-hashes \
      --find-links http://builder-wheelhouse:38611/ -r "/opt/locks/requirements.$TARGETARCH.lock" \
 && rm -rf /tmp/uv \
 && if [ -z "$EMULATED" ]; then env -u PYTHONDONTWRITEBYTECODE python -c "import torch"; \
    else python -c "import compileall, importlib.util as u, sys; \
[compileall.compile_dir(p, quiet=2, workers=0) for m in sys.argv[1:] \
for p in u.find_spec(m).submodule_search_locations]" torch; fi

FROM torch AS runtime
COPY runtime /tmp/runtime
# pip byte-compiles what it installs: the runtime starts without compiling.
RUN pip install --no-index --no-deps --no-build-isolation /tmp/runtime \
 && rm -rf /tmp/runtime
COPY examples /opt/examples
LABEL \
      org.opencontainers.image.title="ml-runtime xpu" \
      org.opencontainers.image.version="xpu-torch2.8.0" \
      io.ml-image-builder.target="xpu" \
      io.ml-image-builder.backend="xpu" \
      io.ml-image-builder.vendor="intel" \
      io.ml-image-builder.accelerator-version="none" \
      io.ml-image-builder.torch="2.8.0+xpu" \
      io.ml-image-builder.distributed="xccl"
USER 1001:1001
# tini is PID 1: it forwards SIGTERM (docker stop, Slurm, Kubernetes) to the command and reaps
# orphans such as DataLoader workers; as a subreaper it also works under `docker run --init`.
# The runtime's vendor_agnostic_wheel check compares torch with what the wheel mapping names.
ENV TINI_SUBREAPER=1 \
    ML_RUNTIME_TORCH="2.8.0+xpu" \
    ML_RUNTIME_FLAVOUR="xpu"
ENTRYPOINT ["/usr/bin/tini", "--", "runtime-check", "exec", "--"]
CMD ["runtime-check", "probe"]
