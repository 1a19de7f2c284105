# syntax=docker/dockerfile:1
# The node agent image: gpuguard-agent is built with cgo (NVML through go-nvml,
# dlopened at start), so it runs on a glibc base. The driver's
# libnvidia-ml.so.1 is not in the image: the NVIDIA container runtime injects
# it (the chart sets runtimeClassName and NVIDIA_VISIBLE_DEVICES=all).
# Build from the repository root:
#   docker build -f build/gpuguard-agent.Dockerfile -t ghcr.io/gpuguard/gpuguard-agent:TAG .
ARG GO_VERSION=1.26

# Built on the target platform: cgo cross-compiling would need a cross toolchain.
FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=1 go build -trimpath -ldflags="-s -w" -o /out/gpuguard-agent ./cmd/gpuguard-agent

# glibc (Debian 12, the same as the build stage), no shell or package manager.
FROM gcr.io/distroless/base-debian12
COPY --from=build /out/gpuguard-agent /usr/local/bin/gpuguard-agent
# The agent runs as root in a privileged container (see docs/agent.md).
USER 0:0
ENTRYPOINT ["/usr/local/bin/gpuguard-agent"]
