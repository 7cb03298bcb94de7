# A small image of the `rein` binary (docs/install.md):
#
#   docker build -t rein .
#   docker run --rm -p 8080:8080 -v "$PWD/rein.yaml:/etc/rein/rein.yaml:ro" \
#       -e REIN_API_TOKENS=... rein
#
# It binds 0.0.0.0 inside the container, so the deployment file must set
# `server.auth` (or the command must add --insecure-public).

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p rein-server --bin rein \
    && strip target/release/rein

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home rein
COPY --from=build /src/target/release/rein /usr/local/bin/rein
USER rein
EXPOSE 8080
ENTRYPOINT ["rein"]
CMD ["serve", "--config", "/etc/rein/rein.yaml", "--bind", "0.0.0.0:8080"]
