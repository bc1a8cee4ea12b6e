# The operator's image: built with the official Rust image, run on Debian slim as a non-root user
# (uid 65532, as deploy/operator/deployment.yaml expects).
#
#   docker build -t tenantplane/tenantplane:0.1.0 .

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# Without the `dev` feature: the operator image does not link the local dev cluster.
RUN cargo build --release --locked -p tenantplane --no-default-features

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/tenantplane /usr/local/bin/tenantplane
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tenantplane"]
CMD ["controller"]
