# syntax=docker/dockerfile:1
# The gpuguard image: the static admission binary (gpuguard webhook, gpuguard
# check) on distroless, non-root. Build from the repository root:
#   docker build -f build/gpuguard.Dockerfile -t ghcr.io/gpuguard/gpuguard:TAG .
ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/gpuguard .

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/gpuguard /usr/local/bin/gpuguard
# 65532:65532, the distroless nonroot user; the chart runs it read-only.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpuguard"]
